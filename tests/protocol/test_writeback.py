"""The other direction: the write-back (device to host) and the host buffers loads copy from.

Hand-built op lists for the analyser's three new race kinds; the simulator's device-to-host
copies and host writes; the write-back's op list against the engine's `start_writing`; and
every write-back row of the kill matrix on the simulator, each mutant killed with data
evidence and the analyser's finding of its own kind, each correct variant clean.
"""

from __future__ import annotations

import pytest
import torch

from harness.checkers.happens_before import find_races
from harness.devices.sim import SimDevice
from harness.faults.plan import FaultPlan
from harness.input.scenario_file import SCENARIO_DIR, load_files
from harness.model.arena import BACKUP, arena_layout
from harness.protocol.hazards import HAZARDS
from harness.protocol.writeback import ENGINE, TRANSFERS, backup_regions
from harness.records.races import RaceKind
from harness.records.scenario import Backend, Expect, Fault, FaultKind, Hazard, ModelShape, Request, Scenario
from harness.records.trace import (
    Copy,
    CopyToHost,
    HostSync,
    HostWait,
    HostWrite,
    Kernel,
    Pool,
    Record,
    Region,
    Trace,
    Wait,
)
from harness.report.plots import timeline_figure
from harness.report.timeline import chrome_trace, stale_marks, stream_order
from harness.run.mutants import Outcome, Role, classify
from harness.run.pipeline import run_scenario
from harness.run.testbed import Testbed

LOAD, FWD, D2H, SCHED = 1, 2, 3, 4
EV, EV2 = 100, 101
NEW = Region("k", 0, 272, 304)
HOST_K = Region("backup_k", 0, 0, 32)
STAGE = Region("host_k", 0, 0, 256)
PREFIX = Region("k", 0, 16, 272)
NAMES = {LOAD: "load", FWD: "forward", D2H: "write-back", SCHED: "schedule"}


def story(*ops) -> Trace:
    return Trace(ops=list(ops), stream_names=dict(NAMES))


def forward_writes(region: Region = NEW) -> Kernel:
    return Kernel(FWD, (), (region,), "L0 attention")


# ---- the analyser ------------------------------------------------------------------


def test_a_backup_unordered_with_the_forward_that_writes_it_is_store_before_compute():
    (f,) = find_races(story(forward_writes(), CopyToHost(D2H, NEW, HOST_K)))
    assert (f.kind, f.copy_stream, f.copy_region, f.access_stream, f.what) == (
        RaceKind.STORE_BEFORE_COMPUTE, "write-back", NEW, "forward", "L0 attention")
    assert f.access_first
    assert "D2H copy on write-back backs up k[L0, slots 272:304]" in f.describe()


def test_a_backup_after_the_write_fence_is_ordered():
    fenced = story(forward_writes(), Record(FWD, EV), Wait(D2H, EV), CopyToHost(D2H, NEW, HOST_K))
    assert find_races(fenced) == []


def test_a_start_event_on_another_stream_orders_nothing_after_the_forward():
    # The engine's start event, recorded on the scheduler's stream (not the forward's).
    unfenced = story(forward_writes(), Record(SCHED, EV), Wait(D2H, EV), CopyToHost(D2H, NEW, HOST_K))
    assert [f.kind for f in find_races(unfenced)] == [RaceKind.STORE_BEFORE_COMPUTE]


def test_a_backup_unordered_with_a_pending_load_of_the_slot_is_store_before_compute_too():
    (f,) = find_races(story(Copy(LOAD, PREFIX), CopyToHost(D2H, PREFIX, HOST_K)))
    assert f.kind is RaceKind.STORE_BEFORE_COMPUTE and f.what == "H2D copy" and f.access_stream == "load"


def test_a_load_into_a_slot_whose_backup_is_pending_is_reuse_before_backup():
    (f,) = find_races(story(CopyToHost(D2H, NEW, HOST_K), Copy(LOAD, NEW)))
    assert (f.kind, f.copy_stream, f.access_stream, f.what, f.access_first) == (
        RaceKind.REUSE_BEFORE_BACKUP, "write-back", "load", "H2D copy", False)
    assert f.describe().startswith("H2D copy (stream on load) writes k[L0, slots 272:304], but nothing orders it "
                                   "after the D2H copy on write-back")


def test_a_kernel_write_over_a_pending_backup_is_reuse_before_backup():
    assert [f.kind for f in find_races(story(CopyToHost(D2H, NEW, HOST_K), forward_writes()))] == [
        RaceKind.REUSE_BEFORE_BACKUP]


def test_reuse_after_the_ack_is_ordered():
    acked = story(CopyToHost(D2H, NEW, HOST_K), Record(D2H, EV), Wait(FWD, EV), Record(FWD, EV2),
                  Wait(LOAD, EV2), Copy(LOAD, NEW))
    assert find_races(acked) == []


def test_a_backup_and_a_read_of_the_same_slot_do_not_race():
    assert find_races(story(CopyToHost(D2H, NEW, HOST_K), Kernel(FWD, (NEW,), (), "L0 attention"))) == []


def test_a_host_refill_of_a_buffer_a_pending_copy_reads_is_a_staging_overwrite():
    (f,) = find_races(story(Copy(LOAD, PREFIX, source=STAGE), HostWrite((STAGE,), "refill")))
    assert (f.kind, f.copy_region, f.access_stream, f.access_region, f.what) == (
        RaceKind.STAGING_OVERWRITE, STAGE, "host", STAGE, "refill")
    assert f.describe().startswith("refill (the host) rewrites host_k[L0, slots 0:256], but nothing orders it after "
                                   "the H2D copy on load that reads host_k[L0, slots 0:256]")


def test_a_refill_after_the_host_saw_the_copy_complete_is_ordered():
    waited = story(Copy(LOAD, PREFIX, source=STAGE), Record(LOAD, EV), HostWait(EV), HostWrite((STAGE,), "refill"))
    assert find_races(waited) == []
    assert find_races(story(Copy(LOAD, PREFIX, source=STAGE), HostSync(), HostWrite((STAGE,), "refill"))) == []


def test_a_stream_wait_does_not_order_the_host():
    # The forward stream waiting on the load says nothing about when the host may write.
    waited = story(Copy(LOAD, PREFIX, source=STAGE), Record(LOAD, EV), Wait(FWD, EV), HostWrite((STAGE,), "refill"))
    assert [f.kind for f in find_races(waited)] == [RaceKind.STAGING_OVERWRITE]


def test_a_refill_of_another_buffer_is_no_race():
    other = Region("staging1_k", 0, 0, 256)
    assert find_races(story(Copy(LOAD, PREFIX, source=STAGE), HostWrite((other,), "refill"))) == []


# ---- the simulator -----------------------------------------------------------------


def test_the_simulator_lands_a_device_to_host_copy_at_its_end():
    dev = SimDevice()
    src = torch.ones(1024)
    dst = torch.zeros(1024)
    side = dev.Stream("write-back")
    with dev.stream(side):
        dev.delay(50.0)
        dev.copy_to_host(dst, src, NEW, HOST_K)
    dev.launch(lambda: src.fill_(2.0), writes=(NEW,))  # not ordered: runs at once
    dev.synchronize()
    assert dst.eq(2.0).all()  # the copy read the slot after the unordered write


def test_a_host_write_reaches_a_pending_copy_but_not_a_landed_one():
    dev = SimDevice()
    staging, landed, pending = torch.ones(256), torch.zeros(256), torch.zeros(256)
    load = dev.Stream("load")
    with dev.stream(load):
        dev.copy_async(landed, staging, PREFIX, STAGE)
        dev.delay(1000.0)
        dev.copy_async(pending, staging, PREFIX, STAGE)
    dev.host_clock += 100.0  # the host moves on: the first copy has landed by now
    dev.host_write(lambda: staging.fill_(7.0), (STAGE,), "refill")
    dev.synchronize()
    assert landed.eq(1.0).all() and pending.eq(7.0).all()


# ---- the write-back path, against the engine's start_writing ------------------------

SHAPE = ModelShape(layers="AM", hidden=64, heads=2, kv_heads=1, head_dim=32, state=4)
BATCH = (Request(prefix=16, new=4), Request(prefix=16, new=2))


def bed(hazard: Hazard = Hazard.REUSE, transfer: str | None = None) -> Testbed:
    s = Scenario("wb", SHAPE, BATCH, Backend.EAGER, Expect.CLEAN, hazard=hazard, transfer=transfer)
    return Testbed(s, SimDevice())


@pytest.mark.parametrize("transfer", ["engine", "no_write_fence"])
def test_one_write_back_is_the_engines_start_writing(transfer):
    tb = bed(transfer=transfer)
    wb = tb.writeback
    assert wb is not None
    with tb.dev.tracing() as trace, tb.dev.stream(tb.forward):
        op = wb.write(FaultPlan(Fault()), TRANSFERS[transfer])
    s, d = wb.schedule.id, wb.d2h.id
    fence = [Record(tb.forward.id, wb.fenced.id), Wait(d, wb.fenced.id)] if transfer == "engine" else []
    copies = [CopyToHost(d, c.region, c.host_region) for layer in wb.plan for c in layer]
    assert trace.ops == [Record(s, op.start_event.id), *fence, Wait(d, op.start_event.id),
                         Record(d, op.ack_start.id), *copies, Record(d, op.finish_event.id)]
    # Every layer, in layer order: the new tokens' KV, then the Mamba state.
    assert [c.src for c in copies] == [r for lid in range(SHAPE.num_layers) for r in backup_regions(tb.layout, lid)]


def test_the_write_back_copies_the_slots_into_the_host_copy():
    tb = bed()
    wb = tb.writeback
    assert wb is not None
    tb.pool.kv.k.normal_()
    tb.pool.mamba.ssm.normal_()
    with tb.dev.stream(tb.forward):
        wb.write(FaultPlan(Fault()), ENGINE)
    tb.dev.synchronize()
    a, rows = 0, tb.layout.mamba_rows
    for r in tb.layout.requests:
        assert wb.host.k[a, r.tokens.start : r.tokens.stop].equal(tb.pool.kv.k[a, r.new.start : r.new.stop])
    assert wb.host.ssm[0].equal(tb.pool.mamba.ssm[0, rows])


def test_release_waits_on_the_ack_only_in_the_engines_path():
    for transfer, waits in (("engine", True), ("no_ack_wait", False)):
        tb = bed(transfer=transfer)
        assert tb.writeback is not None
        with tb.dev.stream(tb.forward):
            op = tb.writeback.write(FaultPlan(Fault()), TRANSFERS[transfer])
            with tb.dev.tracing() as trace:
                op.release()
        assert trace.ops == ([Wait(tb.forward.id, op.finish_event.id)] if waits else [])


def test_the_arena_holds_one_backup_unit_per_backed_up_slot():
    tb = bed()
    units = [u for u in arena_layout(tb.layout, backup=True).units if u.kind == BACKUP]
    new_slots = sum(len(r.new) for r in tb.layout.requests)
    assert len(units) == 2 * new_slots + 2 * len(BATCH)  # K and V per new token; conv and SSM per request
    assert not [u for u in arena_layout(tb.layout).units if u.kind == BACKUP]
    assert {u.pool for u in units} == {Pool.K, Pool.V, Pool.CONV, Pool.SSM}


def test_only_the_write_back_hazards_build_a_write_back():
    assert {h for h, cls in HAZARDS.items() if cls.backs_up} == {Hazard.STORE, Hazard.REUSE,
                                                                 Hazard.FORWARD_OVER_BACKUP}
    assert {h for h, cls in HAZARDS.items() if cls.uses_transfer} == {
        Hazard.STORE, Hazard.REUSE, Hazard.STAGING, Hazard.FORWARD_OVER_BACKUP, Hazard.RELOAD, Hazard.COW,
        Hazard.ZEROING}
    assert bed(Hazard.RAW).writeback is None


# ---- the kill matrix's write-back rows on the simulator -----------------------------

OWN_KIND = {Hazard.STORE: RaceKind.STORE_BEFORE_COMPUTE, Hazard.REUSE: RaceKind.REUSE_BEFORE_BACKUP,
            Hazard.STAGING: RaceKind.STAGING_OVERWRITE,
            # sgl-project/sglang#38300: the next forward, not a load, writes the slots being backed up.
            Hazard.FORWARD_OVER_BACKUP: RaceKind.REUSE_BEFORE_BACKUP}
# The rows of the hazards above (the load-side hazards that name a transfer path are
# tests/protocol/test_sglang_classes.py's).
MATRIX = [s for s in load_files([SCENARIO_DIR / "mutants" / "kill_matrix.toml"]) if s.hazard in OWN_KIND]
DEFAULTS = [s for s in load_files([SCENARIO_DIR / "writeback.toml"])]


def test_every_write_back_hazard_has_a_mutant_and_a_correct_variant():
    for hazard in OWN_KIND:
        rows = [s for s in MATRIX if s.hazard is hazard]
        assert {s.expect.value for s in rows} == {"race", "clean"}, hazard
        assert all(s.evidence is not None and s.evidence.value == "data" for s in rows if s.expect.value == "race")
        assert all(s.fault.kind is FaultKind.GATE for s in rows)
        # Teeth: the mutant is its correct variant with one defect in the transfer path.
        (good,) = [s for s in rows if s.expect.value == "clean"]
        (bad,) = [s for s in rows if s.expect.value == "race"]
        assert good.transfer == "engine" and bad.transfer != "engine"
        assert good.with_overrides(name=bad.name, transfer=bad.transfer, expect=bad.expect,
                                   evidence=bad.evidence) == bad


@pytest.mark.parametrize("scenario", MATRIX + DEFAULTS, ids=[s.name for s in MATRIX + DEFAULTS])
def test_write_back_verdicts_on_the_simulator(scenario):
    r = run_scenario(scenario, SimDevice(), replays=4)
    row = classify(r)
    assert r.error is None, r.error
    if row.role is Role.MUTANT:
        assert row.outcome is Outcome.KILLED and "data" in row.evidence and "analysis" in row.evidence
        assert r.tally.stale_replays == r.tally.replays  # every replay, not a fluke
        assert row.finding_kinds == (OWN_KIND[scenario.hazard].value,)  # caught as itself
        layers = set(range(scenario.model.num_layers))
        if scenario.hazard is Hazard.STAGING:  # the device got the wrong bytes: the forward read them
            assert set(r.tally.layer_counts) == layers and not r.tally.backup_layer_counts
            assert row.data_in[0] == "reads" and "host copy" not in row.data_in
        else:  # the host copy is wrong; what the forward read is right
            assert set(r.tally.backup_layer_counts) == layers and not r.tally.layer_counts
            assert set(r.timeline_backup_layers) == layers
            assert row.data_in == ("host copy",)
    else:
        assert row.outcome is Outcome.CLEAN and not r.findings


def test_the_timeline_shows_device_to_host_copies_and_marks_the_wrong_ones():
    (bad,) = [s for s in MATRIX if s.hazard is Hazard.STORE and s.expect.value == "race"]
    r = run_scenario(bad, SimDevice(), replays=1)
    spans = [{"stream": s.stream, "name": s.name, "kind": s.kind, "start_us": s.start_us, "end_us": s.end_us}
             for s in r.timeline]
    timeline = {"clock": r.clock, "spans": spans, "stale_layers": list(r.timeline_stale_layers),
                "backup_stale_layers": list(r.timeline_backup_layers)}
    d2h = [s for s in spans if s["kind"] == "d2h"]
    assert d2h and all(s["stream"] == "write-back" and s["name"].startswith("D2H ") for s in d2h)
    assert stream_order(spans)[:3] == ["forward", "load", "write-back"]
    marks = stale_marks(timeline)
    assert all(m for s, m in zip(spans, marks, strict=True) if s["kind"] == "d2h")
    assert not any(m for s, m in zip(spans, marks, strict=True) if s["kind"] == "copy")
    trace = chrome_trace(timeline)
    assert {e["cat"] for e in trace["traceEvents"] if e.get("ph") == "X"} >= {"copy", "d2h"}
    assert trace["otherData"]["backup_stale_layers"] == [0, 1, 2, 3]
    fig = timeline_figure(bad.name, timeline)
    assert fig is not None
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "copy (write-back, D2H)" in labels and "copy (load-back, H2D)" in labels
    assert "a write-back copy whose host copy came out wrong" in labels
    assert "host copy wrong: layers 0, 1, 2, 3" in fig.axes[0].get_title(loc="left")
