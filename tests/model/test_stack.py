"""The model's math against the float64 reference (`tests.support.reference`), on the sim."""

from __future__ import annotations

import pytest
import torch

import harness.model.stack
from harness.devices.sim import SimDevice
from harness.records.scenario import Backend, DType, Expect, ModelShape, Request, Scenario
from harness.run.replay import ground_truth
from harness.run.testbed import Testbed
from tests.support.reference import reference_for

BATCH = (Request(prefix=5, new=3), Request(prefix=2, new=6))
FP32 = dict(rtol=1e-4, atol=1e-4)
# bf16 rounds h, q/k/v, the mix and every projection to 8 bits of mantissa, layer after
# layer; values are O(1..10), and near-zero elements carry absolute errors up to ~0.03
# over 4 layers (measured over 30 seeds), hence an atol of a few bf16 ulps at unit scale.
BF16 = dict(rtol=2e-2, atol=5e-2)
EXACT = dict(rtol=0.0, atol=0.0)


def scenario(layers: str, dtype: DType = DType.FP32, seed: int = 3, batch=BATCH) -> Scenario:
    shape = ModelShape(
        layers=layers, hidden=32, heads=4, kv_heads=2, head_dim=8, state=4, conv=4, expand=2,
        page_size=4, dtype=dtype,
    )
    return Scenario(f"model-{layers}", shape, batch, Backend.EAGER, Expect.CLEAN, seed=seed)


def run_model(sc: Scenario):
    """Eager ground truth on the sim; returns (probes, reference dict)."""
    b = Testbed(sc, SimDevice())
    ground_truth(b, timeout_s=5.0)
    return b.model.probes, reference_for(b.layout, sc.seed, b.host)


def compare(probes, ref, tol: dict) -> None:
    """Computed values within `tol`; probes of what was read are copies: exact."""
    for name in ("k", "v", "conv", "ssm"):
        torch.testing.assert_close(getattr(probes, name).double(), ref[name], **EXACT, msg=name)
    for name in ("final_conv", "final_ssm", "out"):
        got = getattr(probes, name).double()
        torch.testing.assert_close(got, ref[name], **tol, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("layers", ["A", "M", "AMAM", "MAAM"])
def test_fp32_matches_reference(layers):
    probes, ref = run_model(scenario(layers))
    compare(probes, ref, FP32)


def test_fewer_new_tokens_than_conv_width_keeps_old_conv_inputs():
    # new < W-1: the new conv state mixes loaded state with new inputs; new = 1: one step.
    probes, ref = run_model(scenario("MA", batch=(Request(prefix=3, new=1), Request(prefix=1, new=2))))
    compare(probes, ref, FP32)


def test_reference_reads_every_layer():
    probes, ref = run_model(scenario("MAAM"))
    assert [layer["kind"] for layer in ref["layers"]] == list("MAAM")
    assert not torch.isnan(probes.arena).any()


def test_bf16_matches_reference():
    probes, ref = run_model(scenario("AMAM", DType.BF16))
    compare(probes, ref, BF16)


def test_attention_without_causal_mask_fails(monkeypatch):
    def no_mask(q, k, v, _visible):  # attends to every key, future new tokens included
        rep = q.shape[1] // k.shape[1]
        kf, vf = (t.float().repeat_interleave(rep, dim=1) for t in (k, v))
        scores = torch.einsum("thd,shd->hts", q.float(), kf) / q.shape[2] ** 0.5
        return torch.einsum("hts,shd->thd", scores.softmax(-1), vf).reshape(q.shape[0], -1)

    monkeypatch.setattr(harness.model.stack, "attention", no_mask)
    probes, ref = run_model(scenario("AMAM"))
    with pytest.raises(AssertionError):
        torch.testing.assert_close(probes.out.double(), ref["out"], **FP32)


def test_mamba_ignoring_incoming_state_fails(monkeypatch):
    real = harness.model.stack.mamba_mix
    monkeypatch.setattr(
        harness.model.stack, "mamba_mix", lambda u, conv, ssm, w: real(u, conv, torch.zeros_like(ssm), w)
    )
    probes, ref = run_model(scenario("M"))
    with pytest.raises(AssertionError):
        torch.testing.assert_close(probes.final_ssm.double(), ref["final_ssm"], **FP32)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(probes.out.double(), ref["out"], **FP32)


def test_reference_is_not_the_model(monkeypatch):
    """Breaking the model's math leaves the reference unchanged (no shared code)."""
    sc = scenario("AMAM")
    _, before = run_model(sc)
    monkeypatch.setattr(harness.model.stack, "attention", lambda *a: (_ for _ in ()).throw(RuntimeError))
    monkeypatch.setattr(harness.model.stack, "mamba_mix", lambda *a: (_ for _ in ()).throw(RuntimeError))
    monkeypatch.setattr(harness.model.stack, "rms_norm", lambda *a: (_ for _ in ()).throw(RuntimeError))
    b = Testbed(sc, SimDevice())
    after = reference_for(b.layout, sc.seed, b.host)
    torch.testing.assert_close(after["out"], before["out"], **EXACT)
