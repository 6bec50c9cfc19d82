"""One rank's share of the stack under tensor parallelism, split as a serving engine splits it.

Megatron's split, as SGLang and vLLM run it: each attention layer's query and KV heads are split
across the ranks (a rank holds `heads / tp` query heads, `kv_heads / tp` KV heads and only those
heads' KV pool), its output projection by the same columns; the MLP's up projection by rows and its
down projection by columns. Each block's output is then a partial sum on every rank, and an
all-reduce (`Device.all_reduce`) after the attention block and after the MLP block makes it
whole on every rank. The all-reduce is an op of the forward stream like a kernel: a full graph
captures it, and each replay runs it.

Every rank draws the full model's weights from the scenario's seed and keeps its share, so the
ranks together are the model a single rank would run (bar the order of the sums), with the same
input on every rank.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import torch
import torch.nn.functional as F  # noqa: N812 - torch's own idiom

from harness.devices.base import Device, dtype_of
from harness.devices.collective import RankGroup
from harness.model.stack import AttentionWeights, HybridModel, Step, init_weights, rms_norm
from harness.protocol.layout import Layout
from harness.protocol.pools import HybridPool
from harness.protocol.writeback import HostBackup
from harness.records.errors import HarnessError
from harness.records.ranks import split_problem
from harness.records.scenario import ModelShape

ALL_REDUCE = "all-reduce"  # what a collective's op and graph node are named after


def rank_shape(shape: ModelShape, tp: int) -> ModelShape:
    """The shape one rank's pools and buffers have: its query and KV heads."""
    return replace(shape, heads=shape.heads // tp, kv_heads=shape.kv_heads // tp)


class TensorParallelModel(HybridModel):
    """Rank `group.rank`'s share of the model of shape `full`; `layout` is the rank's own (its
    heads' KV pool, `rank_shape`)."""

    def __init__(self, dev: Device, layout: Layout, pool: HybridPool, seed: int, full: ModelShape,
                 group: RankGroup, backup: HostBackup | None = None):
        problem = split_problem(full, group.world)
        if problem is not None:
            raise HarnessError(problem)
        self.full, self.group = full, group
        super().__init__(dev, layout, pool, seed, backup)
        # The partial sum of a block on this rank, all-reduced in place.
        self.part = torch.empty(layout.total_new, full.hidden, dtype=dtype_of(full.dtype), device=dev.torch_device)

    def _weights(self, layout: Layout, seed: int, device: torch.device):
        layers, final_norm, x = init_weights(replace(layout, shape=self.full), seed, device)
        s, r, tp = self.full, self.group.rank, self.group.world
        hd, qh, kh = s.head_dim, s.heads // tp, s.kv_heads // tp
        q = slice(r * qh * hd, (r + 1) * qh * hd)
        k = slice(s.heads * hd + r * kh * hd, s.heads * hd + (r + 1) * kh * hd)
        v = slice((s.heads + s.kv_heads) * hd + r * kh * hd, (s.heads + s.kv_heads) * hd + (r + 1) * kh * hd)
        width = 2 * s.hidden // tp
        cols = slice(r * width, (r + 1) * width)
        mine = []
        for w in layers:
            assert isinstance(w, AttentionWeights)  # split_problem refuses Mamba layers
            mine.append(AttentionWeights(
                w.norm, torch.cat([w.w_qkv[q], w.w_qkv[k], w.w_qkv[v]]).contiguous(), w.w_o[:, q].contiguous(),
                w.mlp_norm, w.w_up[cols].contiguous(), w.w_down[:, cols].contiguous(),
            ))
        return mine, final_norm, x

    def _build_steps(self) -> list[Step]:
        def compute(name: str, kernel) -> Step:
            return Step(name, lambda: self.dev.launch(kernel, what=name), False)

        def all_reduce(name: str) -> Step:
            return Step(name, lambda: self.dev.all_reduce(self.part, self.group, what=name), False)

        steps = [compute("embed", lambda: self.h.copy_(self.x))]
        for lid, w in enumerate(self.layers):
            assert isinstance(w, AttentionWeights)
            steps += [
                compute(f"L{lid}.qkv", partial(self._qkv, w)),
                Step(f"L{lid}.attention", partial(self._attention_step, lid), True),
                compute(f"L{lid}.o_proj", partial(self._o_proj, w)),
                all_reduce(f"L{lid}.attention {ALL_REDUCE}"),
                compute(f"L{lid}.mlp", partial(self._mlp, w)),
                all_reduce(f"L{lid}.mlp {ALL_REDUCE}"),
                compute(f"L{lid}.residual", self._residual),
            ]
        steps.append(compute("final_norm", self._final))
        return steps

    def _residual(self) -> None:
        self.h.add_(self.part)  # the MLP block's output, whole on every rank

    def _o_proj(self, w: AttentionWeights) -> None:
        width = w.w_o.shape[1]
        self.part.copy_(self.mix[:, :width] @ w.w_o.t())

    def _mlp(self, w: AttentionWeights) -> None:
        self.h.add_(self.part)  # the attention block's output, whole on every rank
        up = rms_norm(self.h, w.mlp_norm).to(self.h.dtype) @ w.w_up.t()
        self.part.copy_(F.silu(up) @ w.w_down.t())
