"""SGLang HiCache bug classes since 0.5.23, each a kill-matrix mutant with its correct twin: the
strategy behind each, and each pair on the simulator, the mutant killed by the data and the analysis
(and the graph check where the defect is before a graph launch), its twin clean, and the mutant with
its one defect removed clean too (so every test has teeth)."""

from __future__ import annotations

from harness.devices.sim import SimDevice
from harness.faults.plan import FaultPlan
from harness.input.scenario_file import SCENARIO_DIR, load_files
from harness.protocol.schedules import AsyncEnqueue
from harness.records.scenario import Expect, Fault
from harness.records.trace import Copy, HostWait, Record, Trace, Wait
from harness.run.mutants import Outcome, classify
from harness.run.pipeline import run_scenario
from harness.run.testbed import Testbed
from tests.support.builders import shrink, small_scenario

MATRIX = {s.name: shrink(s) for s in load_files([SCENARIO_DIR / "mutants" / "kill_matrix.toml"])}


def _killed(name: str, *evidence: str, replays: int = 3):
    r = run_scenario(MATRIX[name], SimDevice(), replays=replays)
    row = classify(r)
    assert r.error is None, r.error
    assert row.outcome is Outcome.KILLED, row
    assert r.tally.stale_replays == r.tally.replays  # every replay, not a fluke
    assert set(evidence) <= set(row.evidence), row.evidence
    return r, row


def _clean(scenario, replays: int = 3):
    r = run_scenario(scenario, SimDevice(), replays=replays)
    assert r.error is None, r.error
    assert r.tally.stale_replays == 0 and not r.findings, (r.tally, [f.describe() for f in r.findings])
    assert r.graph is None or not r.graph.findings
    return r


# ---------------------------------------------------------------- sglang#38472: a wait before the record


def test_an_async_enqueue_leaves_the_load_to_its_thread_until_the_recorded_flag_is_checked():
    tb = Testbed(small_scenario(schedule="async_enqueue"), SimDevice())
    assert isinstance(tb.schedule, AsyncEnqueue)
    with tb.dev.tracing() as t, tb.dev.stream(tb.forward):
        op = tb.start_load(FaultPlan(Fault()))
    # The scheduler thread's part only: the start event, on the scheduling stream.
    stream_ops = [o for o in t.ops if not isinstance(o, HostWait)]  # the host's look at the ring slot
    assert [type(o) for o in stream_ops] == [Record] and stream_ops[0].stream == tb.forward.id
    assert op.thread is not None
    with tb.dev.tracing() as t:
        op.wait_recorded()  # the host blocks until the thread has enqueued the records
    assert op.thread is None and not tb.schedule.queue
    records = [o for o in t.ops if isinstance(o, Record)]
    assert [o.event for o in records[-len(op.load_events):]] == [e.id for e in op.load_events]
    assert any(isinstance(o, Copy) for o in t.ops)
    with tb.dev.tracing() as t:
        op.wait_recorded()  # recorded already: nothing more
        tb.drain_load()
    assert t.ops == []


def test_the_engines_fence_on_an_async_enqueue_waits_before_the_record_and_orders_nothing():
    r, row = _killed("mutant.wait_before_async_record", "data", "analysis", "graph")
    assert "reads" in row.data_in and "read-after-write" in row.finding_kinds
    # In the op list the forward's wait on the final event comes before that event's record.
    assert r.trace is not None and _waits_before_their_record(r.trace)


def _waits_before_their_record(trace: Trace) -> list[Wait]:
    """The forward stream's waits on an event recorded later, on another stream."""
    (forward,) = [sid for sid, name in trace.stream_names.items() if name == "forward"]
    ops = trace.ops
    return [o for i, o in enumerate(ops) if isinstance(o, Wait) and o.stream == forward
            and any(isinstance(x, Record) and x.event == o.event and x.stream != forward for x in ops[i + 1:])]


def test_the_recorded_flag_turns_it_clean_and_so_does_a_synchronous_enqueue():
    mutant = MATRIX["mutant.wait_before_async_record"]
    twin = _clean(MATRIX["correct.async_enqueue.recorded_flag"])
    assert twin.trace is not None and not _waits_before_their_record(twin.trace)
    # Teeth: the mutant with the flag checked, or with the load enqueued by the scheduler thread.
    _clean(mutant.with_overrides(fence="recorded_final_event", expect=Expect.CLEAN, evidence=None))
    _clean(mutant.with_overrides(schedule="layerwise", expect=Expect.CLEAN, evidence=None))


# ---------------------------------------------------------------- sglang#36738: a restore into pages the forward writes


def test_a_restore_into_reallocated_pages_before_the_forward_wrote_them_is_caught():
    r, row = _killed("mutant.reload_before_forward_writes", "data", "analysis")
    assert "final state" in row.data_in  # the forward's late writes clobbered the restored state
    assert "write-after-write" in row.finding_kinds
    waw = [f for f in r.findings if f.kind.value == "write-after-write"]
    assert {f.copy_stream for f in waw} == {"load"} and {f.access_stream for f in waw} == {"forward"}


def test_the_load_fence_turns_it_clean_and_the_start_event_alone_does_not():
    mutant = MATRIX["mutant.reload_before_forward_writes"]
    _clean(MATRIX["correct.reload_before_forward_writes.load_fence"])
    # Teeth: the mutant with its one defect removed is clean.
    _clean(mutant.with_overrides(transfer="engine", expect=Expect.CLEAN, evidence=None))
    # The restore's start event is on the scheduling stream: that it is waited on orders nothing
    # after the forward (the load stream does wait on it in both).
    tb = Testbed(mutant, SimDevice())
    assert tb.hazard.schedule is not tb.forward and tb.hazard.schedule.name == "schedule"


# ---------------------------------------------------------------- sglang#36743: a whole-slot copy under per-layer waits


def test_a_whole_slot_copy_under_a_per_layer_wait_reads_the_later_layers_half_loaded():
    r, row = _killed("mutant.mamba_cow_before_load_complete", "data", "analysis")
    scenario = MATRIX["mutant.mamba_cow_before_load_complete"]
    first, *later = scenario.model.mamba_layers
    # Only the copy is wrong: its later Mamba layers, not the first (its wait covers it), and no
    # forward read (the forward's own fence orders it).
    assert set(r.tally.layer_counts) == set(later)
    assert row.finding_kinds == ("read-after-write",)
    assert {f.what for f in r.findings} == {"deferred Mamba copy-on-write"}
    assert {f.copy_region.layer for f in r.findings} == set(later)


def test_the_wait_on_the_load_ops_final_event_turns_it_clean():
    mutant = MATRIX["mutant.mamba_cow_before_load_complete"]
    _clean(MATRIX["correct.mamba_cow.after_load_complete"])
    _clean(mutant.with_overrides(transfer="engine", expect=Expect.CLEAN, evidence=None))
    # The copy's destination is observed: the arena holds a read unit per Mamba layer and request.
    tb = Testbed(mutant, SimDevice())
    units = [u for u in tb.model.probes.layout.units if u.segment.startswith("cow_")]
    assert len(units) == 2 * len(mutant.model.mamba_layers) * len(mutant.batch)
    assert not [u for u in Testbed(small_scenario(), SimDevice()).model.probes.layout.units
                if u.segment.startswith("cow_")]


# ---------------------------------------------------------------- sglang#38300 / #38463: the forward overtakes a backup


def test_the_next_forward_over_a_pending_backup_is_caught_in_the_host_copy():
    r, row = _killed("mutant.forward_overtakes_backup", "data", "analysis")
    assert row.data_in == ("host copy",) and row.finding_kinds == ("reuse-before-backup",)
    assert {f.what for f in r.findings} == {"next forward's writes"}


def test_joining_the_writes_finish_event_turns_it_clean():
    mutant = MATRIX["mutant.forward_overtakes_backup"]
    _clean(MATRIX["correct.forward_overtakes_backup.joined"])
    _clean(mutant.with_overrides(transfer="engine", expect=Expect.CLEAN, evidence=None))


def test_each_class_is_a_mutant_and_a_twin_one_defect_apart():
    pairs = {
        "mutant.wait_before_async_record": "correct.async_enqueue.recorded_flag",
        "mutant.reload_before_forward_writes": "correct.reload_before_forward_writes.load_fence",
        "mutant.mamba_cow_before_load_complete": "correct.mamba_cow.after_load_complete",
        "mutant.forward_overtakes_backup": "correct.forward_overtakes_backup.joined",
    }
    for bad_name, good_name in pairs.items():
        bad, good = MATRIX[bad_name], MATRIX[good_name]
        assert bad.expect is Expect.RACE and bad.evidence is not None and good.expect is Expect.CLEAN
        differ = {k for k in ("fence", "schedule", "transfer", "hazard", "fault", "backend", "accessor")
                  if getattr(bad, k) != getattr(good, k)}
        assert len(differ) == 1, (bad_name, differ)
