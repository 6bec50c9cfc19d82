"""A plain reference implementation of the model's math, for tests.

Written for clarity, not speed: float64 on the CPU, explicit loops over query
tokens and heads for attention, and an explicit token-by-token recurrence for
the Mamba-style layer. It deliberately shares no math with `harness.model.stack`
(no `attention`, `mamba_mix` or `rms_norm` from there), so that a test comparing
the two checks the model rather than the model against itself.

Inputs are the same things the model uses: the seeded weights of
`harness.model.stack.init_weights` (any dtype; upcast here) and the cached prefix
K/V and Mamba state as the host pool holds them (`harness.protocol.pools.HostPool`):

    prefix_kv    = (k, v), each [attention layers, total prefix rows, kv_heads, head_dim],
                   request r's rows at r.host_offset .. r.host_offset + len(r.prefix)
    mamba_states = (conv, ssm), [mamba layers, requests, d_inner, W-1] and
                   [mamba layers, requests, d_inner, state]

`reference_forward` returns a dict whose stacked entries have the shapes of the
model's probe views (`ProbeSet.k`, `.v`, `.conv`, `.ssm`, `.final_conv`,
`.final_ssm`, `.out`), so a test compares them directly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from harness.protocol.layout import Layout

EPS = 1e-6  # RMSNorm epsilon, the same constant the model uses
F64 = torch.float64


def _d(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", F64)


def silu(x: torch.Tensor) -> torch.Tensor:
    return x / (1.0 + torch.exp(-x))


def rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """RMSNorm over the last dimension: x / sqrt(mean(x^2) + eps) * weight."""
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + EPS) * weight


def softmax(scores: torch.Tensor) -> torch.Tensor:
    m = scores.max()
    e = torch.exp(scores - m)
    return e / e.sum()


# ---------------------------------------------------------------- attention
def attention_one_request(
    q: torch.Tensor, k_all: torch.Tensor, v_all: torch.Tensor, prefix: int
) -> torch.Tensor:
    """Causal GQA for one request, one query token and one head at a time.

    q [T, H, D]; k_all / v_all [P+T, KVH, D] (prefix rows then new rows).
    Query token t (absolute position prefix + t) sees key rows 0..prefix + t.
    Query head h uses kv head h // (H // KVH). Returns [T, H*D].
    """
    t_new, heads, dim = q.shape
    group = heads // k_all.shape[1]
    out = torch.zeros(t_new, heads, dim, dtype=F64)
    for t in range(t_new):
        last = prefix + t  # inclusive
        for h in range(heads):
            kvh = h // group
            keys = k_all[: last + 1, kvh]  # [last+1, D]
            vals = v_all[: last + 1, kvh]
            scores = torch.stack([(q[t, h] * keys[s]).sum() for s in range(last + 1)]) / math.sqrt(dim)
            p = softmax(scores)
            acc = torch.zeros(dim, dtype=F64)
            for s in range(last + 1):
                acc = acc + p[s] * vals[s]
            out[t, h] = acc
    return out.reshape(t_new, heads * dim)


# ---------------------------------------------------------------- mamba
def mamba_one_request(
    u: torch.Tensor,
    conv_state: torch.Tensor,
    ssm_state: torch.Tensor,
    conv_w: torch.Tensor,
    conv_b: torch.Tensor,
    log_a: torch.Tensor,
    w_b: torch.Tensor,
    w_c: torch.Tensor,
    d_skip: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The Mamba-style mix for one request as an explicit recurrence over tokens.

    u [T, d]; conv_state [d, W-1] (the last W-1 inputs, oldest first);
    ssm_state [d, N]. For each token t:
        c_t = silu(sum_j conv_w[:, j] * window_t[:, j] + conv_b)   (causal depthwise conv)
        B_t = W_B c_t,  C_t = W_C c_t
        h_t = a * h_{t-1} + c_t[:, None] * B_t[None, :],   a = exp(log_a)
        y_t = h_t @ C_t + d_skip * c_t
    Returns y [T, d], the new conv state (last W-1 inputs) and h_T.
    """
    t_new, d = u.shape
    width = conv_w.shape[1]
    padded = torch.cat([conv_state.t(), u], 0)  # [W-1+T, d]: past inputs, then new ones
    a = torch.exp(log_a)
    h = ssm_state.clone()
    ys = []
    for t in range(t_new):
        window = padded[t : t + width]  # [W, d]: inputs t-W+1 .. t (in padded indexing)
        pre = conv_b.clone()
        for j in range(width):
            pre = pre + conv_w[:, j] * window[j]
        c = silu(pre)  # [d]
        b_t = w_b @ c  # [N]
        c_out = w_c @ c  # [N]
        h = a * h + c[:, None] * b_t[None, :]
        ys.append(h @ c_out + d_skip * c)
    new_conv = padded[padded.shape[0] - (width - 1) :].t().clone()  # [d, W-1]
    return torch.stack(ys), new_conv, h


# ---------------------------------------------------------------- the stack
def reference_forward(
    weights: Sequence[Any],
    final_norm: torch.Tensor,
    x: torch.Tensor,
    layout: Layout,
    prefix_kv: tuple[torch.Tensor, torch.Tensor],
    mamba_states: tuple[torch.Tensor, torch.Tensor],
) -> dict:
    """Run the whole stack in float64; see the module docstring for the inputs.

    Returns a dict with:
      out         [total_new, hidden]                    rms(h) * final_norm
      k, v        [attention layers, total_prefix, KVH, D]  the prefix K/V each layer read
      conv, ssm   [mamba layers, requests, d, .]         the state each Mamba layer read
      final_conv, final_ssm                               the state each Mamba layer left
      layers      a list, one dict per layer, with the same per-layer pieces
    """
    s = layout.shape
    heads, kv_heads, hd, d_inner = s.heads, s.kv_heads, s.head_dim, s.d_inner
    host_k, host_v = (_d(t) for t in prefix_kv)
    host_conv, host_ssm = (_d(t) for t in mamba_states)
    h = _d(x).clone()
    a_index = {lid: i for i, lid in enumerate(s.attention_layers)}
    m_index = {lid: i for i, lid in enumerate(s.mamba_layers)}
    n_a, n_m, n_req = len(s.attention_layers), len(s.mamba_layers), len(layout.requests)
    res: dict[str, Any] = {  # tensors, and "layers": a list of per-layer dicts
        "k": torch.zeros(n_a, layout.total_prefix, kv_heads, hd, dtype=F64),
        "v": torch.zeros(n_a, layout.total_prefix, kv_heads, hd, dtype=F64),
        "conv": torch.zeros(n_m, n_req, d_inner, s.conv - 1, dtype=F64),
        "ssm": torch.zeros(n_m, n_req, d_inner, s.state, dtype=F64),
        "final_conv": torch.zeros(n_m, n_req, d_inner, s.conv - 1, dtype=F64),
        "final_ssm": torch.zeros(n_m, n_req, d_inner, s.state, dtype=F64),
        "layers": [],
    }

    for lid, kind in enumerate(s.layers):
        w = {name: _d(t) for name, t in vars(weights[lid]).items()}
        if kind == "A":
            a = a_index[lid]
            xn = rms(h, w["norm"])
            qkv = (xn @ w["w_qkv"].t()).reshape(h.shape[0], heads + 2 * kv_heads, hd)
            q = qkv[:, :heads]
            k_new = qkv[:, heads : heads + kv_heads]
            v_new = qkv[:, heads + kv_heads :]
            attn = torch.zeros(h.shape[0], heads * hd, dtype=F64)
            for r in layout.requests:
                rows = slice(r.host_offset, r.host_offset + len(r.prefix))
                tok = slice(r.tokens.start, r.tokens.stop)
                k_pre, v_pre = host_k[a, rows], host_v[a, rows]  # what this layer reads back
                res["k"][a, rows] = k_pre
                res["v"][a, rows] = v_pre
                k_all = torch.cat([k_pre, k_new[tok]], 0)
                v_all = torch.cat([v_pre, v_new[tok]], 0)
                attn[tok] = attention_one_request(q[tok], k_all, v_all, len(r.prefix))
            h = h + attn @ w["w_o"].t()
            up = rms(h, w["mlp_norm"]) @ w["w_up"].t()
            h = h + silu(up) @ w["w_down"].t()
            res["layers"].append({"kind": "A", "k": res["k"][a], "v": res["v"][a]})
        else:
            m = m_index[lid]
            uz = rms(h, w["norm"]) @ w["w_in"].t()
            u, z = uz[:, :d_inner], uz[:, d_inner:]
            y = torch.zeros(h.shape[0], d_inner, dtype=F64)
            for i, r in enumerate(layout.requests):
                tok = slice(r.tokens.start, r.tokens.stop)
                conv0, ssm0 = host_conv[m, i], host_ssm[m, i]  # the state this layer reads back
                res["conv"][m, i] = conv0
                res["ssm"][m, i] = ssm0
                y[tok], new_conv, new_ssm = mamba_one_request(
                    u[tok], conv0, ssm0, w["conv_w"], w["conv_b"], w["log_a"],
                    w["w_b"], w["w_c"], w["d_skip"],
                )
                res["final_conv"][m, i] = new_conv
                res["final_ssm"][m, i] = new_ssm
            h = h + (y * silu(z)) @ w["w_out"].t()
            res["layers"].append(
                {
                    "kind": "M",
                    "conv": res["conv"][m],
                    "ssm": res["ssm"][m],
                    "final_conv": res["final_conv"][m],
                    "final_ssm": res["final_ssm"][m],
                }
            )
    res["out"] = rms(h, _d(final_norm))
    return res


def reference_for(layout: Layout, seed: int, host) -> dict:
    """The reference for a bench's inputs: init_weights(layout, seed) and a HostPool."""
    from harness.model.stack import (
        init_weights,  # the seeded weights only; none of the model's math
    )

    layers, final_norm, x = init_weights(layout, seed, torch.device("cpu"))
    return reference_forward(layers, final_norm, x, layout, (host.k, host.v), (host.conv, host.ssm))
