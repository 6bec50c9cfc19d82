"""Faults, hazards and the kill matrix end to end on the CPU simulator."""

from __future__ import annotations

import json

from harness.devices.sim import SimDevice
from harness.frontends.cli import main
from harness.input.scenario_file import SCENARIO_DIR, load_file
from harness.protocol.loadback import plan_copies, stale_by_chunk
from harness.records.device_settings import SimCosts
from harness.records.races import RaceKind
from harness.records.scenario import (
    Expect,
    Fault,
    FaultKind,
    Hazard,
    ModelShape,
    Request,
)
from harness.run.mutants import Outcome, Role, classify, matrix_ok
from harness.run.pipeline import ScenarioResult, run_scenario
from harness.run.testbed import Testbed
from tests.support.builders import shrink, small_scenario

MATRIX = [shrink(s) for s in load_file(SCENARIO_DIR / "mutants" / "kill_matrix.toml")]


scenario = small_scenario


# ---------------------------------------------------------------- the kill matrix
def test_every_mutant_is_killed_and_every_correct_variant_is_clean_on_the_simulator():
    rows = [classify(run_scenario(s, SimDevice(), replays=3)) for s in MATRIX]
    assert matrix_ok(rows), [(r.name, r.outcome.value) for r in rows if not r.ok]
    mutants = [r for r in rows if r.role is Role.MUTANT]
    assert len(mutants) == 19 and len(rows) - len(mutants) == 19
    # Every mutant shows in the data and in the analysis, write-after-read too: a replay
    # is an op list run in virtual time, so a copy enqueued after it can land before it reads.
    for r in mutants:
        assert r.evidence[:2] == ("data", "analysis"), r
    # The graph check sees every full graph that reads or writes a load before it lands.
    graph = {r.name for r in mutants if "graph" in r.evidence}
    assert graph == {"mutant.no_fence", "mutant.fence_on_layer0_event", "mutant.final_event_before_last_copy",
                     "mutant.fence_on_wrong_stream", "mutant.fence_on_previous_load_op",
                     "mutant.layerwise_events_never_recorded", "mutant.write_after_write",
                     "mutant.value_flag_before_copies", "mutant.value_flag_not_rearmed",
                     "mutant.counter_registered_after_capture", "mutant.wait_before_async_record"}, graph


def test_the_matrix_has_teeth_a_mutant_run_as_correct_is_flagged_and_vice_versa():
    no_fence = next(s for s in MATRIX if s.name == "mutant.no_fence")
    flagged = classify(run_scenario(no_fence.with_overrides(expect=Expect.CLEAN), SimDevice(), replays=2))
    assert flagged.role is Role.CORRECT and flagged.outcome is Outcome.FLAGGED and not flagged.ok
    fenced = next(s for s in MATRIX if s.name == "correct.final_event.gate")
    survived = classify(run_scenario(fenced.with_overrides(expect=Expect.RACE), SimDevice(), replays=2))
    assert survived.outcome is Outcome.SURVIVED and not matrix_ok([survived])


def test_an_errored_scenario_is_neither_killed_nor_clean():
    r = ScenarioResult(scenario(), error="boom")
    assert classify(r).outcome is Outcome.ERROR and not classify(r).ok


def test_mutants_command_exit_codes_and_matrix_in_results(tmp_path, capsys):
    # The shipped matrix, on a smaller model so that the CPU computes it quickly.
    text = (SCENARIO_DIR / "mutants" / "kill_matrix.toml").read_text()
    text = text.replace("hidden = 256", "hidden = 64").replace("head_dim = 64", "head_dim = 32")
    text = text.replace("prefix = 256", "prefix = 48").replace("prefix = 128", "prefix = 16")
    good, bad, out = tmp_path / "matrix.toml", tmp_path / "bad.toml", tmp_path / "out"
    good.write_text(text)
    assert main(["mutants", str(good), "--device", "sim", "--replays", "2", "--out", str(out)]) == 0
    doc = json.loads((out / "results.json").read_text())
    matrix = doc["mutants"]["matrix"]
    assert len(matrix) == len(MATRIX)
    assert {row["outcome"] for row in matrix} == {"killed", "clean"}
    # A correct variant declared a mutant survives: exit 1.
    bad.write_text(text.replace('fault = { kind = "gate" }\nexpect = "clean"',
                                'fault = { kind = "gate" }\nexpect = "race"', 1))
    assert main(["mutants", str(bad), "--device", "sim", "--replays", "2", "--out", str(out)]) == 1
    assert "SURVIVED" in capsys.readouterr().out


# ---------------------------------------------------------------- gate
def test_gate_makes_every_unfenced_replay_stale_in_every_layer():
    r = run_scenario(scenario(fault=Fault(FaultKind.GATE)), SimDevice(), replays=5)
    assert r.fault_mode == "gate (simulated)"
    assert r.tally.stale_replays == 5 and set(r.tally.layer_counts) == {0, 1, 2, 3}
    fenced = run_scenario(scenario(fence="final_event", fault=Fault(FaultKind.GATE), expect=Expect.CLEAN),
                          SimDevice(), replays=5)
    assert fenced.error is None and fenced.tally.stale_replays == 0


def test_a_gate_never_opened_ends_as_a_gate_timeout_error_not_a_hang(stuck_gate):
    s = scenario(fault=Fault(FaultKind.GATE), schedule=stuck_gate)
    r = run_scenario(s, SimDevice(), replays=3, timeout_s=2.0)
    assert r.error is not None and r.error.startswith("gate-timeout in replay")
    assert "watchdog opened it after 1s" in r.error
    assert not r.met


def test_gate_timeline_shows_the_hold_and_the_replay_before_the_copies():
    r = run_scenario(scenario(fault=Fault(FaultKind.GATE)), SimDevice(), replays=1)
    spans = {sp.kind: sp for sp in r.timeline}
    assert {"gate", "copy", "replay", "wait", "record", "harness"} <= set(spans)
    replay = next(sp for sp in r.timeline if sp.kind == "replay")
    copies = [sp for sp in r.timeline if sp.kind == "copy" and sp.stream == "load"]
    assert all(c.start_us >= replay.end_us for c in copies)
    # The harness's own look comes after everything has landed, and says it is the harness's.
    looks = [sp for sp in r.timeline if sp.kind == "harness" and "final state" in sp.name]
    assert looks and all(sp.start_us >= max(c.end_us for c in copies) for sp in looks)
    assert r.timeline_stale_layers == (0, 1, 2, 3)


# ---------------------------------------------------------------- chunked: localisation
def test_chunked_staleness_is_exactly_the_late_chunks():
    s = scenario(fault=Fault(FaultKind.CHUNKED, us=60.0, chunks=4),
                 batch=(Request(64, 4), Request(32, 2), Request(16, 2)))
    b = Testbed(s, SimDevice())
    chunks = plan_copies(b.layout, b.host, b.pool, 4)
    verdicts = []
    # 60 us between chunks against a layer's core of 20 us: some layer is read partly loaded.
    costs = SimCosts(access_us=20.0, kernel_us=2.0, launch_us=5.0)
    r = run_scenario(s, SimDevice(costs), replays=3, on_replay=lambda i, v: verdicts.append(v))
    assert r.tally.stale_replays == 3
    partly = 0
    for v in verdicts:
        for layer, pieces, stale in stale_by_chunk(v.slots, chunks):
            # Each piece is wholly stale or wholly fresh ...
            assert all(not st or st == set(range(reg.start, reg.stop)) for st, reg in zip(stale, pieces, strict=False))
            # ... and once a piece is late, every later piece of that copy is late too.
            flags = [bool(st) for st in stale]
            assert flags == sorted(flags), (layer, flags)
            partly += any(flags) and not all(flags)
    assert partly > 0  # some layer was read partly loaded: localisation below a layer


# ---------------------------------------------------------------- hazards
def test_write_after_write_shows_only_in_the_post_prefill_state():
    mamba = ModelShape(layers="MMMM", hidden=64, heads=2, kv_heads=1, head_dim=32, state=4)
    r = run_scenario(scenario(model=mamba, hazard=Hazard.WAW, fault=Fault(FaultKind.GATE)),
                     SimDevice(), replays=4)
    assert r.tally.stale_replays == 4
    assert r.tally.final_state_replays == 4
    assert not r.tally.layer_counts  # every read was right: the copy re-wrote resident data
    assert any(f.kind is RaceKind.WRITE_AFTER_WRITE for f in r.findings)
    fenced = run_scenario(
        scenario(model=mamba, hazard=Hazard.WAW, fence="final_event", fault=Fault(FaultKind.GATE),
                 expect=Expect.CLEAN), SimDevice(), replays=4)
    assert fenced.tally.stale_replays == 0 and not fenced.findings


def test_write_after_read_is_found_when_the_next_load_is_not_ordered_after_the_replay():
    war = dict(hazard=Hazard.WAR, fence="final_event", fault=Fault(FaultKind.GATE))
    bad = run_scenario(scenario(schedule="no_start_wait", **war), SimDevice(), replays=2)
    assert any(f.kind is RaceKind.WRITE_AFTER_READ for f in bad.findings)
    good = run_scenario(scenario(expect=Expect.CLEAN, **war), SimDevice(), replays=2)
    assert good.error is None and good.tally.stale_replays == 0 and not good.findings


def test_sweep_reports_one_point_per_delay_and_detection_grows_with_delay():
    f = Fault(FaultKind.SWEEP, points=(0.0, 50.0, 1000.0))
    r = run_scenario(scenario(fault=f), SimDevice(), replays=3)
    assert [p.us for p in r.sweep] == [0.0, 50.0, 1000.0]
    assert all(p.tally.replays == 3 for p in r.sweep) and r.tally.replays == 9
    rates = [p.tally.stale_rate for p in r.sweep]
    assert rates[-1] == 1.0 and rates == sorted(rates)
