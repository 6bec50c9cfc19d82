"""Tensor-parallel scenarios on the simulator: one process per rank, gloo between them.

Small on purpose (2 ranks, 2 layers, a few replays): each starts two processes.
"""

import time

import pytest

from harness.devices.sim import SimDevice
from harness.records.scenario import Backend, DType, Expect, Fault, FaultKind, ModelShape, Request, Scenario
from harness.run.pipeline import run_scenario
from tests.support.paths import PLUGINS

SHAPE = ModelShape(layers="AA", hidden=64, heads=4, kv_heads=2, head_dim=16, dtype=DType.BF16)
BATCH = (Request(64, 8), Request(32, 4))
REPLAYS = 4


def tp_scenario(**changes) -> Scenario:
    base = Scenario("tp", SHAPE, BATCH, Backend.FULL, Expect.RACE, fence="none", fault=Fault(FaultKind.GATE),
                    replays=REPLAYS, tp=2, fault_ranks=(1,))
    return base.with_overrides(**changes)


def run(s: Scenario, **kw):
    return run_scenario(s, SimDevice(), timeout_s=kw.pop("timeout_s", 20.0), **kw)


def test_a_gate_on_one_rank_races_there_and_the_all_reduce_carries_it():
    r = run(tp_scenario())
    assert r.error is None and r.met
    assert r.tally.stale_replays == REPLAYS
    tp = r.tp
    assert tp.describe() == "stale reads on rank 1; carried to ranks 0,1 through the all-reduce"
    rank0, rank1 = tp.ranks
    assert (rank0.stale_read_replays, rank0.output_replays, rank0.carried_replays) == (0, REPLAYS, REPLAYS)
    assert (rank1.stale_read_replays, rank1.output_replays) == (REPLAYS, REPLAYS)
    assert rank1.fault.startswith("gate") and rank0.fault == "none"
    # Each rank's graph holds its all-reduces: two a layer, captured as nodes of the graph.
    assert rank0.collective_nodes == rank1.collective_nodes == 4
    assert all(g.nodes == 16 for g in r.graph.graphs) and len(r.graph.graphs) == 2
    assert r.graph.findings and rank1.graph_findings


def test_the_fence_on_every_rank_is_clean_and_without_it_the_same_scenario_races():
    clean = run(tp_scenario(fence="final_event", expect=Expect.CLEAN))
    assert clean.error is None and clean.met, clean.verdict.describe()
    assert clean.tp.describe() == "no stale reads on any rank"
    assert not clean.findings and not clean.graph.findings
    teeth = run(tp_scenario(fence="none", expect=Expect.CLEAN))  # the fence removed
    assert not teeth.met and teeth.tally.stale_replays == REPLAYS


def test_a_fence_on_the_rank_without_the_fault_only_is_a_race():
    r = run(tp_scenario(fence="final_event", fence_ranks=(0,)))
    assert r.error is None and r.met and r.tally.stale_replays == REPLAYS
    assert [t.fence for t in r.tp.ranks] == ["final_event", "none"]
    assert r.tp.stale_on == (1,) and r.tp.carried
    assert r.tp.ranks[0].findings == 0 and r.tp.ranks[1].findings > 0  # each rank's own analysis


def test_one_ranks_late_load_delays_every_rank():
    def rank0_forward_end(us: float) -> float:
        fault = Fault(FaultKind.DELAY, us) if us else Fault()
        r = run(tp_scenario(fence="final_event", expect=Expect.CLEAN, fault=fault, replays=1))
        assert r.error is None and r.met
        return max(s.end_us for s in r.timeline if s.stream.startswith("rank0 ") and s.kind == "replay")

    # Rank 0 has no fault at all; it waits in its all-reduces for rank 1, whose forward waits for its load.
    assert rank0_forward_end(3000) - rank0_forward_end(0) >= 2 * 3000 * 0.9  # 3 ms before each of 2 layers


def test_a_gate_nobody_opens_on_one_rank_ends_the_scenario_with_every_ranks_end(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))
    t0 = time.monotonic()
    r = run(tp_scenario(schedule="stuck_gate_one_rank:schedule"), timeout_s=4.0)
    assert time.monotonic() - t0 < 30
    assert r.error is not None and not r.met
    assert r.error.startswith("rank 1 failed: gate-timeout in replay -1")  # the cause first
    assert "rank 0 failed: its all-reduce failed" in r.error  # its peer gone, it does not wait
    rank0, rank1 = r.tp.ranks
    assert rank1.state == "failed" and rank0.state in ("failed", "stopped")
    assert rank0.stack and "exchange" in rank0.stack  # where it was: in the collective


def test_a_rank_that_dies_ends_the_scenario_as_an_error(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))
    t0 = time.monotonic()
    r = run(tp_scenario(fence="rank_dies:fence", fence_ranks=(1,)), timeout_s=10.0)
    assert time.monotonic() - t0 < 30
    assert r.error is not None and not r.met
    assert r.error.startswith("rank 1 died (exit code 3) at replay 0")
    rank0, _ = r.tp.ranks
    assert rank0.state in ("failed", "stopped") and rank0.stack


@pytest.mark.parametrize("backend", [Backend.EAGER, Backend.BREAKABLE])
def test_the_waits_of_every_rank_keep_eager_and_breakable_clean(backend):
    r = run(tp_scenario(backend=backend, expect=Expect.CLEAN, replays=2))
    assert r.error is None and r.met, r.verdict.describe()


def test_a_rank_that_hangs_is_stopped_with_its_stack(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))
    t0 = time.monotonic()
    r = run(tp_scenario(fence="rank_hangs:fence", fence_ranks=(1,)), timeout_s=2.0)
    assert time.monotonic() - t0 < 20  # the group's timeout, the grace, the stack
    assert r.error is not None and "rank 1 stopped at replay 0" in r.error
    assert "rank 0 failed: its all-reduce failed" in r.error  # the group's timeout
    rank0, rank1 = r.tp.ranks
    assert rank1.state == "stopped" and "rank_hangs.py" in rank1.stack
