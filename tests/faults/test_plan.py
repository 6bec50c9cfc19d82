"""The fault injector's pure logic (`harness.faults.plan`) and chunked copy plans."""

from __future__ import annotations

import pytest

from harness.devices.sim import SimDevice
from harness.faults.plan import (
    GATE_FALLBACK_US,
    FaultPlan,
    gate_fallback,
    jitter_us,
    sweep_points,
)
from harness.protocol.loadback import plan_copies
from harness.records.scenario import (
    Backend,
    DelayWhere,
    DType,
    Expect,
    Fault,
    FaultKind,
    ModelShape,
    Request,
    Scenario,
)
from harness.run.testbed import Testbed

SHAPE = ModelShape(layers="AMAM", hidden=16, heads=2, kv_heads=1, head_dim=8, state=4, conv=3,
                   page_size=4, dtype=DType.FP32)


def test_delay_each_and_first():
    each = FaultPlan(Fault(FaultKind.DELAY, 30.0, DelayWhere.EACH))
    first = FaultPlan(Fault(FaultKind.DELAY, 30.0, DelayWhere.FIRST))
    assert [each.pause_us(layer) for layer in range(3)] == [30.0] * 3
    assert [first.pause_us(layer) for layer in range(3)] == [30.0, 0.0, 0.0]
    assert each.pause_us(1, chunk=1) == 0.0  # only before a layer's first chunk


def test_jitter_is_reproducible_in_range_and_new_every_replay():
    f = Fault(FaultKind.JITTER, 400.0, seed=3)
    a = [FaultPlan(f, replay=5).pause_us(layer) for layer in range(8)]
    assert a == [FaultPlan(f, replay=5).pause_us(layer) for layer in range(8)]
    assert all(0.0 <= us <= 400.0 for us in a) and len(set(a)) == 8
    assert a != [FaultPlan(f, replay=6).pause_us(layer) for layer in range(8)]
    assert jitter_us(3, 5, 0, 400.0) == a[0]
    other_seed = Fault(FaultKind.JITTER, 400.0, seed=4)
    assert a != [FaultPlan(other_seed, replay=5).pause_us(layer) for layer in range(8)]


def test_chunked_pauses_between_chunks_only():
    plan = FaultPlan(Fault(FaultKind.CHUNKED, 50.0, chunks=4))
    assert [plan.pause_us(2, c) for c in range(4)] == [0.0, 50.0, 50.0, 50.0]


def test_gate_and_none_pause_nothing():
    for f in (Fault(), Fault(FaultKind.GATE)):
        assert FaultPlan(f).pause_us(0) == 0.0


def test_sweep_points_expand_to_plain_delays():
    f = Fault(FaultKind.SWEEP, points=(0.0, 20.0, 200.0), where=DelayWhere.FIRST)
    assert sweep_points(f) == [
        (0.0, Fault()),
        (20.0, Fault(FaultKind.DELAY, 20.0, DelayWhere.FIRST)),
        (200.0, Fault(FaultKind.DELAY, 200.0, DelayWhere.FIRST)),
    ]
    plain = Fault(FaultKind.DELAY, 7.0)
    assert sweep_points(plain) == [(7.0, plain)]


def test_gate_fallback_is_a_long_delay_before_layer_zero():
    f = gate_fallback()
    assert (f.kind, f.us, f.where) == (FaultKind.DELAY, GATE_FALLBACK_US, DelayWhere.FIRST)


@pytest.mark.parametrize("chunks", [1, 2, 3, 64])
def test_chunked_plan_splits_every_copy_into_contiguous_parts(chunks):
    sc = Scenario("c", SHAPE, (Request(7, 2), Request(3, 1)), Backend.FULL, Expect.CLEAN)
    b = Testbed(sc, SimDevice())
    whole = plan_copies(b.layout, b.host, b.pool)
    split = plan_copies(b.layout, b.host, b.pool, chunks)
    for layer, parts in enumerate(split):
        assert 1 <= len(parts) <= chunks
        for original in whole[layer][0]:
            pieces = [c for part in parts for c in part
                      if c.region.pool == original.region.pool and original.region.overlaps(c.region)]
            # The pieces tile the original region in order, as views of the same memory.
            assert pieces[0].region.start == original.region.start
            assert pieces[-1].region.stop == original.region.stop
            assert all(a.region.stop == b_.region.start for a, b_ in zip(pieces, pieces[1:], strict=False))
            assert sum(p.dst.shape[0] for p in pieces) == original.dst.shape[0]
            assert pieces[0].dst.data_ptr() == original.dst.data_ptr()
