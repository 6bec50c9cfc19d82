"""Value waits (flags streams write and wait on), the `layerwise_value` and `piecewise` fences, the
`captured_load` schedule and their mutants: the flag logic, the simulator, the analyser, and whole
scenarios on the simulator (each correct one clean where no fence races, each mutant stale)."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from harness.checkers.happens_before import find_races
from harness.devices.sim import SimDevice
from harness.frontends.fence_commands import cmd_bench, cmd_fences
from harness.input.scenario_file import SCENARIO_DIR, load_files
from harness.protocol.fences import ARMED, LOADED
from harness.records.errors import InputError
from harness.records.races import RaceKind
from harness.records.scenario import Backend, Fault, FaultKind, Scenario
from harness.records.trace import (
    Copy,
    FlagWait,
    FlagWrite,
    HostSync,
    Kernel,
    Record,
    Region,
    Replay,
    Trace,
    Wait,
    flag_reached,
)
from harness.run.mutants import Outcome, classify
from harness.run.pipeline import run_scenario
from harness.studies.fence_cost import POINT_SETS, Point, Spread, arm_parts, bench_point, points_named
from tests.support.builders import SMALL_HYBRID, small_scenario

SMALL = SMALL_HYBRID
LOAD, FWD = 1, 2
F0, F1 = 50, 51
K0 = Region("k", 0, 0, 64)


def race(fault: Fault = Fault(FaultKind.GATE), **kw) -> Scenario:
    return small_scenario(fault=fault, **kw)


# ---- the flag test --------------------------------------------------------------------------


def test_a_flag_reaches_its_target_as_cuStreamWaitValue32_GEQ_compares():
    assert flag_reached(LOADED, LOADED) and flag_reached(5, 3)
    assert not flag_reached(ARMED, LOADED) and not flag_reached(2, 3)
    # Cyclic: a counter that wrapped past 2**32 is still ahead of a target just before the wrap.
    assert flag_reached(1, 0xFFFFFFFF) and not flag_reached(0xFFFFFFFF, 1)
    assert flag_reached(0x7FFFFFFF, 0) and not flag_reached(0x80000000, 0)


# ---- the simulator ----------------------------------------------------------------------------


def test_a_value_wait_holds_its_stream_until_another_writes_the_flag():
    dev = SimDevice()
    load, fwd = dev.Stream("load"), dev.Stream("forward")
    flags = dev.Flags(2, ARMED)
    dst, src = torch.zeros(4), torch.ones(4)
    seen = []
    with dev.stream(load):
        dev.delay(500.0)
        dev.copy_async(dst, src, K0)
        flags.write(0, LOADED)
    with dev.stream(fwd):
        flags.wait(0, LOADED)
        dev.launch(lambda: seen.append(dst.clone()), reads=[K0])
        flags.wait(1, LOADED)  # never written: holds only what comes after it
    ran = dev.Event()
    with dev.stream(fwd):
        ran.record()
    assert not ran.query()  # flag 1 is still armed
    with dev.stream(load):
        flags.write(1, LOADED)
    dev.synchronize()
    assert torch.equal(seen[0], src)  # the read waited for the copy behind the flag


def test_a_captured_value_wait_waits_on_what_the_flag_holds_at_each_replay():
    dev = SimDevice()
    load, fwd = dev.Stream("load"), dev.Stream("forward")
    flags = dev.Flags(1, LOADED)  # made loaded: capture's warm-up passes
    dst, src, out = torch.zeros(4), torch.ones(4), []

    def body() -> None:
        flags.wait(0, LOADED)
        dev.launch(lambda: out.append(dst.clone()), reads=[K0])

    with dev.stream(fwd):
        graph = dev.capture(body)
    assert any(isinstance(op, FlagWait) and op.in_graph for op in graph.body)
    dev.synchronize()  # the capture's warm-up runs
    out.clear()
    for value in (1.0, 2.0):
        with dev.stream(fwd):
            flags.write_all(ARMED)  # re-arm before the load starts
            start = dev.Event()
            start.record()
        with dev.stream(load):
            start.wait()
            dev.delay(300.0)
            dev.copy_async(dst, src * value, K0)
            flags.write(0, LOADED)
        with dev.stream(fwd):
            graph.replay()
        dev.synchronize()
    assert [t[0].item() for t in out] == [1.0, 2.0]


# ---- the analyser -----------------------------------------------------------------------------


def trace(*ops) -> Trace:
    return Trace(ops=list(ops), stream_names={LOAD: "load", FWD: "forward"})


def read(stream=FWD):
    return Kernel(stream, (K0,), (), "L0 attention")


ARM = FlagWrite(FWD, (F0,), ARMED)  # the forward stream re-arms the flag before the load op


def test_a_flag_written_after_the_copy_orders_the_waiting_read():
    assert find_races(trace(ARM, Copy(LOAD, K0), FlagWrite(LOAD, (F0,), LOADED), FlagWait(FWD, F0, LOADED),
                            read())) == []


def test_what_a_flag_held_before_the_op_list_may_release_a_wait_nothing_re_armed():
    # The op list does not say what the flag held before it (a previous load op's LOADED, say):
    # with no write ordered before the waiter, that value may be the one it saw.
    (f,) = find_races(trace(Copy(LOAD, K0), FlagWrite(LOAD, (F0,), LOADED), FlagWait(FWD, F0, LOADED), read()))
    assert f.kind is RaceKind.READ_AFTER_WRITE


def test_a_flag_written_before_the_copy_orders_nothing_of_it():
    (f,) = find_races(trace(ARM, FlagWrite(LOAD, (F0,), LOADED), Copy(LOAD, K0), FlagWait(FWD, F0, LOADED), read()))
    assert f.kind is RaceKind.READ_AFTER_WRITE


def test_a_wait_on_another_flag_or_value_orders_nothing():
    assert find_races(trace(ARM, Copy(LOAD, K0), FlagWrite(LOAD, (F1,), LOADED), FlagWait(FWD, F0, LOADED), read()))
    # The write leaves the flag armed: it is not what releases a wait for LOADED.
    assert find_races(trace(ARM, Copy(LOAD, K0), FlagWrite(LOAD, (F0,), ARMED), FlagWait(FWD, F0, LOADED), read()))


def load_op(rearm: bool) -> list:
    """One batch: the scheduling stream re-arms (or not), the load copies then writes the flag, the
    forward waits on it and reads."""
    arm = [FlagWrite(FWD, (F0,), ARMED)] if rearm else []
    return [*arm, Record(FWD, 7), Wait(LOAD, 7), Copy(LOAD, K0), FlagWrite(LOAD, (F0,), LOADED),
            FlagWait(FWD, F0, LOADED), read()]


def test_a_flag_not_rearmed_may_release_the_next_batch_on_the_previous_load_ops_value():
    assert find_races(trace(*load_op(True), *load_op(True))) == []
    found = find_races(trace(*load_op(True), *load_op(False)))
    assert [f.kind for f in found] == [RaceKind.READ_AFTER_WRITE]


def test_a_host_sync_hides_the_writes_before_it():
    # After a synchronize the old LOADED is seen, and the re-arm after it hides it.
    ops = [Copy(LOAD, K0), FlagWrite(LOAD, (F0,), LOADED), HostSync(), *load_op(True)]
    assert find_races(trace(*ops)) == []


def test_captured_value_waits_are_honoured_in_a_replay_and_python_ones_are_not():
    body_graph = (FlagWait(9, F0, LOADED, in_graph=True), read(9))
    body_python = (FlagWait(9, F0, LOADED, in_graph=False), read(9))
    before = [ARM, Copy(LOAD, K0), FlagWrite(LOAD, (F0,), LOADED)]
    assert find_races(trace(*before, Replay(FWD, 1, body_graph))) == []
    assert find_races(trace(*before, Replay(FWD, 1, body_python)))


# ---- whole scenarios on the simulator -------------------------------------------------------


@pytest.mark.parametrize("fault", [Fault(FaultKind.GATE), Fault(FaultKind.DELAY, 300.0)], ids=["gate", "delay"])
@pytest.mark.parametrize("fence, schedule", [("layerwise_value", "layerwise"), ("layerwise_value", "captured_load"),
                                             ("piecewise", "layerwise"), ("final_event", "captured_load"),
                                             ("layerwise_graph", "captured_load")])
def test_the_new_strategies_are_clean_where_the_unfenced_graph_races(fence, schedule, fault):
    bad = run_scenario(race(fault, schedule=schedule), SimDevice(), replays=3)
    assert bad.tally.stale_replays == 3 and bad.findings  # the teeth: unfenced, it races
    r = run_scenario(race(fault, fence=fence, schedule=schedule), SimDevice(), replays=3)
    assert r.error is None, r.error
    assert r.tally.stale_replays == 0 and not r.findings, (fence, schedule, r.findings[:1])


@pytest.mark.parametrize("kw", [{"fence": "value_not_rearmed"},
                                {"fence": "layerwise_value", "schedule": "signal_before_copy"},
                                {"fence": "value_not_rearmed", "schedule": "captured_load"}],
                         ids=["not-rearmed", "flag-before-copy", "not-rearmed-captured"])
def test_the_value_wait_mutants_read_stale_data_in_every_gated_replay(kw):
    r = run_scenario(race(**kw), SimDevice(), replays=4)
    assert r.error is None and r.tally.stale_replays == 4
    assert RaceKind.READ_AFTER_WRITE in {f.kind for f in r.findings}


def test_layerwise_value_waits_are_nodes_of_the_graph_and_each_load_op_rearms_first():
    r = run_scenario(race(Fault(FaultKind.DELAY, 300.0), fence="layerwise_value"), SimDevice(), replays=1)
    ops = r.trace.ops
    replay = next(op for op in ops if isinstance(op, Replay) and any(isinstance(o, FlagWait) for o in op.body))
    waits = [op for op in replay.body if isinstance(op, FlagWait)]
    assert len(waits) == 2 * 2 + 2 and all(w.in_graph and w.value == LOADED for w in waits)
    writes = [op for op in ops[:ops.index(replay)] if isinstance(op, FlagWrite)]
    arm, loaded = writes[0], writes[1:]
    assert arm.value == ARMED and len(arm.flags) == 4 and arm.stream == replay.stream  # on the scheduling stream
    assert [w.value for w in loaded] == [LOADED] * 4 and len({w.stream for w in loaded}) == 1
    start = next(i for i, op in enumerate(ops) if isinstance(op, Record) and op.stream == arm.stream
                 and i > ops.index(arm))
    assert ops.index(arm) < start < ops.index(loaded[0])  # re-armed before the start event


def test_piecewise_runs_the_pieces_on_every_batch_even_with_no_load_pending():
    from harness.run.replay import Replayer
    from harness.run.testbed import Testbed

    dev = SimDevice()
    tb = Testbed(race(fence="piecewise"), dev)
    tb.set_waits(tb.accessor)
    tb.setup_fence()
    full = tb.runner(Backend.FULL)
    rep = Replayer(tb, full, 30.0)
    assert rep._fenced(0, None) is not full and rep._fenced(0, None).backend is Backend.BREAKABLE
    from harness.protocol.fences import EagerFallbackFence

    assert not isinstance(tb.fence, EagerFallbackFence)


def test_a_captured_load_op_is_one_graph_replay_on_the_load_stream():
    r = run_scenario(race(Fault(FaultKind.DELAY, 300.0), fence="final_event", schedule="captured_load"),
                     SimDevice(), replays=1)
    load = [op for op in r.trace.ops if isinstance(op, Replay) and any(isinstance(o, Copy) for o in op.body)]
    assert len(load) == 1 and not [op for op in r.trace.ops if isinstance(op, Copy)]  # no copy outside it
    assert sum(isinstance(o, Record) for o in load[0].body) == 4  # each layer's event, inside the graph


def test_the_kill_matrix_holds_the_value_wait_mutants_and_the_new_correct_variants():
    matrix = {s.name: s for s in load_files([SCENARIO_DIR / "mutants" / "kill_matrix.toml"])}
    names = ["mutant.value_flag_before_copies", "mutant.value_flag_not_rearmed", "correct.layerwise_value.gate",
             "correct.layerwise_value.captured_load.gate", "correct.piecewise.gate"]
    rows = {n: classify(run_scenario(matrix[n], SimDevice(), replays=3)) for n in names}
    for n in names[:2]:
        assert rows[n].outcome is Outcome.KILLED and "data" in rows[n].evidence and "reads" in rows[n].data_in
        assert matrix[n].evidence is not None  # it demands data evidence
    for n in names[2:]:
        assert rows[n].outcome is Outcome.CLEAN, rows[n]


def test_fences_checks_only_the_strategies_asked_for(tmp_path, monkeypatch):
    small = [race(Fault(FaultKind.GATE)).with_overrides(name="a"),
             race(Fault(FaultKind.DELAY, 300.0)).with_overrides(name="b")]
    monkeypatch.setattr("harness.frontends.fence_commands.race_scenarios", lambda: small)
    args = argparse.Namespace(device="sim", sim_costs=[], replays=2, timeout=30.0, out=tmp_path,
                              strategies=["layerwise_value", "piecewise"], fault="gate")
    assert cmd_fences(args) == 0
    cells = json.loads((tmp_path / "results.json").read_text())["strategies"]["cells"]
    assert [(c["scenario"], c["strategy"]) for c in cells] == [("a", "none"), ("a", "layerwise_value"),
                                                               ("a", "piecewise")]
    assert all(c["ok"] for c in cells)


# ---- the benchmark ----------------------------------------------------------------------------


def test_arms_name_a_fence_and_optionally_a_schedule():
    assert arm_parts("layerwise_value") == ("layerwise_value", None)
    assert arm_parts("layerwise_value+captured_load") == ("layerwise_value", "captured_load")


def test_the_named_point_sets_reach_serving_depth_and_the_default_stays_cheap():
    serving = points_named(["serving"])
    assert {p.layers for p in serving} >= {8, 80} and {p.prefix for p in serving} >= {2048, 32768}
    assert {p.kind for p in serving} == {"attention", "hybrid"} and {p.hidden for p in serving} == {1024, 4096}
    assert points_named(["default"]) == [Point("attention", 8, 2048)]
    both = points_named(["layers", "prefix"])
    assert len(both) == len(set(both)) == 5  # the shared point once
    assert set(POINT_SETS) >= {"default", "sweep", "layers", "prefix", "hidden", "serving"}
    assert Point("attention", 8, 2048, hidden=4096).scenario().model.heads == 32


def test_spread_is_median_and_quartiles():
    s = Spread.of([float(x) for x in range(1, 102)])
    assert (s.median, s.n) == (51.0, 101) and s.p25 < s.median < s.p75 and s.p10 < s.p25


def test_bench_rows_carry_iqr_the_unfenced_ratio_and_forward_start_for_every_arm():
    arms = ("none", "layerwise_value", "layerwise_value+captured_load", "piecewise")
    res = bench_point(SimDevice(), Point("hybrid", 4, 64, new=8), repeats=3, warmup=1, arms=arms)
    rows = {r["strategy"]: r for r in res.rows()}
    assert list(rows) == list(arms)
    for r in rows.values():
        assert r["p25_ms"] <= r["median_ms"] <= r["p75_ms"] and r["hidden"] == 1024
        assert r["forward_start_ms"] > 0 and "ratio_to_unfenced_p75" in r
    assert rows["none"]["ratio_to_unfenced"] == 1.0
    # The correct strategies cost at least the bound; the load op as one graph lets the forward start sooner.
    assert rows["layerwise_value"]["ratio_to_bound"] >= 0.99 and rows["piecewise"]["ratio_to_bound"] >= 0.99
    assert rows["layerwise_value+captured_load"]["forward_start_ms"] < rows["layerwise_value"]["forward_start_ms"]


def test_bench_refuses_an_unknown_point_set_in_one_line(tmp_path):
    args = argparse.Namespace(device="sim", sim_costs=[], repeats=1, warmup=1, timeout=30.0, out=tmp_path,
                              arms=["none"], points="default,everything")
    with pytest.raises(InputError, match="unknown point set everything"):
        cmd_bench(args)
    args.arms = ["none+nowhere"]
    with pytest.raises(InputError, match="unknown schedule"):
        cmd_bench(args)


def test_the_report_has_a_panel_per_sweep_axis_of_each_model_and_hidden_size():
    from harness.report.plots import fence_cost_figure, sweep_panels

    rows = []
    for point in points_named(["layers", "prefix", "hidden"]):
        for arm, ms in (("none", 1.0), ("layerwise_value", 1.2)):
            rows.append({"model": point.kind, "layers": point.layers, "prefix": point.prefix, "hidden": point.hidden,
                         "strategy": arm, "median_ms": ms, "p25_ms": ms * 0.9, "p75_ms": ms * 1.1, "p10_ms": ms * 0.8,
                         "p90_ms": ms * 1.2, "ratio_to_bound": ms / 0.9, "load_ms": 0.9, "compute_ms": 0.5})
    panels = sweep_panels(rows)
    titles = [(p.kind, p.key) for p in panels]
    assert ("attention, hidden 1024", "prefix") in titles and ("attention, hidden 1024", "layers") in titles
    assert ("attention, hidden 4096", "prefix") in titles and ("hybrid, hidden 4096", "prefix") in titles
    for p in panels:  # a panel holds one sweep: everything but its axis is the same
        other = "layers" if p.key == "prefix" else "prefix"
        assert len({(r[other], r["hidden"], r["model"]) for r in p.points}) == 1
    assert fence_cost_figure({"points": rows}) is not None
