"""Fence strategies (`harness.protocol.fences`), the strategy check and the benchmark, on the simulator."""

from __future__ import annotations

import argparse
import json

import pytest

from harness.checkers.clocks import StreamClocks
from harness.checkers.happens_before import find_races
from harness.devices.base import Memory
from harness.devices.sim import SimDevice
from harness.frontends.fence_commands import FENCE_MUTANTS, cell, cmd_fences, race_scenarios
from harness.protocol.fences import STRATEGIES
from harness.records.errors import TooLarge
from harness.records.scenario import (
    Expect,
    Fault,
    FaultKind,
    Scenario,
)
from harness.records.trace import HostWait, Replay, Wait
from harness.run.pipeline import run_scenario
from harness.studies.fence_cost import ARMS, BASELINES, Point, Stats, bench_point, check_room, sweep
from tests.support.builders import SMALL_HYBRID, small_scenario

SMALL = SMALL_HYBRID


def race(fault: Fault, **kw) -> Scenario:
    return small_scenario(fault=fault, **kw)


@pytest.mark.parametrize("fault", [Fault(FaultKind.GATE), Fault(FaultKind.DELAY, 300.0)], ids=["gate", "delay"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_correct_strategy_is_clean_where_no_fence_races(strategy, fault):
    bad = run_scenario(race(fault), SimDevice(), replays=3)
    assert bad.tally.stale_replays == 3 and bad.findings  # the teeth: unfenced, it races
    r = run_scenario(race(fault, fence=strategy), SimDevice(), replays=3)
    assert r.error is None, r.error
    assert r.tally.stale_replays == 0 and not r.findings, (strategy, r.tally, r.findings[:1])


def test_layerwise_graph_waits_are_nodes_of_the_captured_graph():
    r = run_scenario(race(Fault(FaultKind.DELAY, 300.0), fence="layerwise_graph"), SimDevice(), replays=1)
    replay = next(op for op in r.trace.ops if isinstance(op, Replay))
    in_graph = [op for op in replay.body if isinstance(op, Wait) and op.in_graph]
    # one wait per accessor call: K and V for each attention layer, one per Mamba layer
    assert len(in_graph) == 2 * 2 + 2
    # ... and nothing waits on the load op before the replay: the overlap is kept.
    before = r.trace.ops[: r.trace.ops.index(replay)]
    assert not [op for op in before if isinstance(op, Wait) and op.stream != r.trace.ops[1].stream
                and op.in_graph]


def test_host_sync_is_a_host_wait_and_the_analyser_sees_the_order():
    r = run_scenario(race(Fault(FaultKind.DELAY, 300.0), fence="host_sync"), SimDevice(), replays=1)
    assert any(isinstance(op, HostWait) for op in r.trace.ops)
    assert not find_races(r.trace)


def test_host_wait_orders_every_stream_after_the_event():
    c = StreamClocks()
    c.stamp(1)
    ev = c.record(1)
    stamp = c.stamp(1)  # work after the record: not covered by it
    c.stamp(2)
    c.host_wait(ev)
    assert c.ordered(2, type(stamp)(1, ev[1])) and not c.ordered(2, stamp)
    assert c.ordered(3, type(stamp)(1, ev[1]))  # a stream first seen later starts after it too
    c.host_wait(None)  # a never-recorded event orders nothing


def test_eager_fallback_runs_the_breakable_path_only_with_a_load_pending():
    r = run_scenario(race(Fault(FaultKind.GATE), fence="eager_fallback"), SimDevice(), replays=1)
    assert not [op for op in r.trace.ops if isinstance(op, Replay) and len(op.body) > 40]
    assert r.tally.stale_replays == 0


def test_the_strategy_check_covers_races_and_fence_mutants(tmp_path, monkeypatch):
    scenarios = race_scenarios()
    names = {s.name for s in scenarios}
    assert {"hybrid-full-none", "gate-full-none", "mutant.no_fence", "mutant.write_after_write"} <= names
    assert all(s.fence in FENCE_MUTANTS for s in scenarios)
    # Run it on two small scenarios only (the whole set runs on the GPU and in `make bench`).
    small = [race(Fault(FaultKind.GATE)).with_overrides(name="a"),
             race(Fault(FaultKind.DELAY, 300.0)).with_overrides(name="b")]
    monkeypatch.setattr("harness.frontends.fence_commands.race_scenarios", lambda: small)
    args = argparse.Namespace(device="sim", sim_costs=[], replays=2, timeout=30.0, out=tmp_path)
    assert cmd_fences(args) == 0
    cells = json.loads((tmp_path / "results.json").read_text())["strategies"]["cells"]
    assert len(cells) == 2 * (1 + len(STRATEGIES)) and all(c["ok"] for c in cells)


def test_a_cell_is_its_variants_verdict():
    s = race(Fault(FaultKind.DELAY, 300.0))
    none = run_scenario(s.with_overrides(fence="none"), SimDevice(), replays=1)
    fixed = run_scenario(s.with_overrides(fence="final_event", expect=Expect.CLEAN), SimDevice(), replays=1)
    flagged = run_scenario(s.with_overrides(expect=Expect.CLEAN), SimDevice(), replays=1)
    assert cell(none, "s").ok and cell(fixed, "s").ok
    assert not cell(flagged, "s").ok  # an unfenced variant expected clean: the verdict flags it


def test_stats_median_and_spread():
    st = Stats.of([float(x) for x in range(1, 101)])  # microseconds
    assert st.median_ms == pytest.approx(0.0505) and st.n == 100
    assert st.p10_ms < st.median_ms < st.p90_ms


def test_sweep_spans_the_required_ranges():
    points = sweep()
    for kind in ("attention", "hybrid"):
        mine = [p for p in points if p.kind == kind]
        assert {p.prefix for p in mine} >= {512, 16384} and {p.layers for p in mine} >= {4, 32}


def test_bench_point_times_every_arm_against_the_bound():
    res = bench_point(SimDevice(), Point("hybrid", 4, 64, new=8), repeats=3, warmup=1)
    assert set(res.stats) == set(BASELINES) | set(ARMS)
    rows = res.rows()
    assert [r["strategy"] for r in rows] == list(ARMS)
    by = {r["strategy"]: r for r in rows}
    # On the simulator no correct strategy beats the bound; the unfenced one does (it is wrong).
    for s in STRATEGIES:
        assert by[s]["ratio_to_bound"] >= 0.99, by[s]
    assert by["none"]["ratio_to_bound"] < by["final_event"]["ratio_to_bound"]
    assert all(r["load_ms"] > 0 and r["compute_ms"] > 0 and r["repeats"] == 3 for r in rows)


def test_a_point_whose_testbeds_would_not_fit_is_refused_before_they_are_built():
    gib = 2**30
    point = Point("attention", 80, 2048)
    before, after = Memory("host memory", 4 * gib, 30 * gib), Memory("host memory", 6 * gib, 17 * gib)
    with pytest.raises(TooLarge, match=r"attention 80 layers, prefix 2048, hidden 1024: the 9 testbeds left to "
                                       r"build need about 18.0 GiB more host memory \(2.00 GiB a testbed, "
                                       r"measured\), and 17.0 GiB is available"):
        check_room(point, 9, before, after)
    check_room(point, 7, before, after)  # 14 GiB: within the share of 17 it may take
    check_room(point, 9, None, after)  # a platform with no reading: built, and seen


def test_a_plugin_fence_is_benched_by_name_like_any_arm(wayward):
    polling = f"{wayward}:poll_until_loaded"
    res = bench_point(SimDevice(), Point("hybrid", 4, 64, new=8), repeats=2, warmup=1, arms=("none", polling))
    assert [r["strategy"] for r in res.rows()] == ["none", polling]
    assert res.ratio(polling) >= 0.99  # it waits for the whole load: no faster than the bound
