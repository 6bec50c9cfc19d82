"""Oracle localisation and tallying on planted data (CPU only).

Data is planted through `ProbeSet`'s named views over a copy of the truth arena,
so these tests also check that the oracle's unit map and the probe arena agree.
"""

from __future__ import annotations

import math

import pytest
import torch

from harness.model.arena import arena_layout
from harness.model.stack import ProbeSet
from harness.protocol.layout import plan_layout
from harness.records.scenario import DType, ModelShape, Request, Tolerance
from harness.run.oracle import Oracle, ReplayVerdict, Tally

SHAPE = ModelShape(
    layers="AMAM", hidden=16, heads=2, kv_heads=1, head_dim=8, state=4, conv=3, expand=2,
    page_size=4, dtype=DType.FP32,
)
LAYOUT = plan_layout(SHAPE, (Request(prefix=5, new=3), Request(prefix=2, new=6)))
ARENA = arena_layout(LAYOUT)
A0, A1 = SHAPE.attention_layers  # global ids 0, 2
M0, M1 = SHAPE.mamba_layers  # global ids 1, 3


def truth() -> torch.Tensor:
    n = ARENA.size
    return torch.randn(n, generator=torch.Generator().manual_seed(0))


def planted(t: torch.Tensor) -> ProbeSet:
    """A probe set whose arena starts as a copy of `t`."""
    p = ProbeSet(LAYOUT, torch.device("cpu"))
    assert p.arena.numel() == t.numel()
    p.arena.copy_(t)
    return p


def judge(oracle: Oracle, p: ProbeSet) -> ReplayVerdict:
    return oracle.judge(p.arena)


@pytest.fixture
def setup():
    t = truth()
    return Oracle(ARENA, t), planted(t)


def test_read_units_count():
    n_read = 2 * len(SHAPE.attention_layers) * LAYOUT.total_prefix + 2 * len(SHAPE.mamba_layers) * 2
    assert Oracle(ARENA, truth()).read_units == n_read


def test_copy_of_truth_is_clean(setup):
    oracle, p = setup
    v = judge(oracle, p)
    assert not v.stale
    assert v.stale_units == 0 and v.read_fraction == 0.0
    assert not v.output_differs and not v.final_state_layers


def test_nan_in_one_k_slot_names_that_layer_pool_and_slot(setup):
    oracle, p = setup
    r = LAYOUT.requests[1]
    p.k[1, r.host_offset + 1, 0, 3] = float("nan")  # second attention layer, request 1, its 2nd prefix token
    v = judge(oracle, p)
    assert v.stale and v.stale_units == 1
    assert v.layers == {A1}
    assert v.pools == {"k"}
    assert v.slots == {(A1, "k", r.prefix.start + 1)}
    assert math.isclose(v.read_fraction, 1 / oracle.read_units)
    assert not v.output_differs and not v.final_state_layers


def test_stale_ssm_read_of_one_request_names_its_mamba_slot(setup):
    oracle, p = setup
    p.ssm[1, 1] += 1.0  # second Mamba layer, request 1 only
    v = judge(oracle, p)
    assert v.layers == {M1}
    assert v.pools == {"ssm"}
    assert v.slots == {(M1, "ssm", LAYOUT.requests[1].mamba_slot)}


def test_changed_final_conv_is_final_state_not_a_read(setup):
    oracle, p = setup
    p.final_conv[0, 0, 2, 1] += 0.5
    v = judge(oracle, p)
    assert v.stale
    assert v.final_state_layers == {M0}
    assert not v.layers and not v.slots and not v.pools
    assert v.read_fraction == 0.0
    assert not v.output_differs


def test_output_only_change_counts_as_output_only_replay(setup):
    oracle, p = setup
    p.out[4, 7] += 1.0
    v = judge(oracle, p)
    assert v.stale and v.output_differs
    assert not v.slots and not v.final_state_layers
    tally = Tally()
    tally.add(v)
    assert tally.output_only_replays == 1 and tally.stale_replays == 1


def test_tolerance_lets_a_tiny_output_change_pass():
    t = truth()
    p = planted(t)
    p.out.mul_(1 + 1e-5)
    p.final_ssm.mul_(1 + 1e-5)
    assert not judge(Oracle(ARENA, t, Tolerance(rtol=1e-2)), p).stale
    assert judge(Oracle(ARENA, t), p).output_differs  # exact by default


def test_tolerance_never_applies_to_read_probes():
    t = truth()
    p = planted(t)
    p.v[0, 0, 0, 0] *= 1 + 1e-5
    v = judge(Oracle(ARENA, t, Tolerance(rtol=1e-2, atol=1e-2)), p)
    assert v.slots == {(A0, "v", LAYOUT.requests[0].prefix.start)}


def test_nan_in_truth_raises():
    t = truth()
    t[5] = float("nan")
    with pytest.raises(ValueError):
        Oracle(ARENA, t)


def test_truth_of_wrong_size_raises():
    with pytest.raises(ValueError):
        Oracle(ARENA, truth()[:-1])


def verdict(*layers: int, fraction_units: int = 1) -> ReplayVerdict:
    n = len(layers) * fraction_units
    return ReplayVerdict(n, 10, stale_reads=n, layers=frozenset(layers), pools=frozenset({"k"}))


def test_tally_aggregates_rates_and_layer_counts():
    tally = Tally()
    for v in (ReplayVerdict(0, 10), verdict(0), ReplayVerdict(0, 10), verdict(0, 2, fraction_units=2)):
        tally.add(v)
    assert tally.replays == 4 and tally.stale_replays == 2
    assert tally.stale_rate == 0.5
    assert tally.layer_counts == {0: 2, 2: 1}
    assert tally.pool_counts == {"k": 2}
    assert math.isclose(tally.mean_read_fraction, (0.1 + 0.4) / 2)
    assert tally.output_only_replays == 0 and tally.final_state_replays == 0


def test_empty_tally_rates_are_zero():
    assert Tally().stale_rate == 0.0 and Tally().mean_read_fraction == 0.0
