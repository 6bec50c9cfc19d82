"""Happens-before race analysis: hand-built stories, then real simulator traces."""

from __future__ import annotations

import contextlib
import functools

import pytest

from harness.checkers.happens_before import Finding, find_races
from harness.records.races import RaceKind
from harness.records.trace import (
    Copy,
    Delay,
    FlagWait,
    FlagWrite,
    HostSync,
    Kernel,
    Record,
    Region,
    Replay,
    Trace,
    Wait,
)

LOAD, FWD, CAP, OTHER = 1, 2, 9, 3
START, EV, EV2 = 100, 101, 102
K0 = Region("k", 0, 16, 272)
K0_PART = Region("k", 0, 200, 300)
K1 = Region("k", 1, 16, 272)
NAMES = {LOAD: "load", FWD: "forward", CAP: "capture", OTHER: "other"}


def story(*ops) -> Trace:
    return Trace(ops=list(ops), stream_names=dict(NAMES))


def read(stream, *regions, what="L0 attention"):
    return Kernel(stream, tuple(regions), (), what)


def write(stream, *regions, what="L0 mamba"):
    return Kernel(stream, (), tuple(regions), what)


# ---- hand-built stories -------------------------------------------------------


def test_copy_then_unordered_read_is_raw():
    (f,) = find_races(story(Copy(LOAD, K0), Delay(LOAD, 5.0), read(FWD, K0_PART)))
    assert f == Finding(
        RaceKind.READ_AFTER_WRITE, "load", K0, "forward", K0_PART, "L0 attention", False
    )


def test_non_overlapping_region_is_no_race():
    assert find_races(story(Copy(LOAD, K0), read(FWD, K1))) == []


def test_same_stream_is_ordered():
    assert find_races(story(Copy(LOAD, K0), read(LOAD, K0))) == []


def test_record_after_copy_waited_orders_it():
    t = story(Copy(LOAD, K0), Record(LOAD, EV), Wait(FWD, EV), read(FWD, K0))
    assert find_races(t) == []


def test_record_before_copy_does_not_order_it():
    t = story(Record(LOAD, EV), Copy(LOAD, K0), Wait(FWD, EV), read(FWD, K0))
    assert [f.kind for f in find_races(t)] == [RaceKind.READ_AFTER_WRITE]


def test_wait_is_transitive_through_a_third_stream():
    t = story(
        Copy(LOAD, K0), Record(LOAD, EV), Wait(OTHER, EV), Record(OTHER, EV2), Wait(FWD, EV2),
        read(FWD, K0),
    )
    assert find_races(t) == []


def test_host_sync_orders_earlier_copies_only():
    assert find_races(story(Copy(LOAD, K0), HostSync(), read(FWD, K0))) == []
    t = story(HostSync(), Copy(LOAD, K0), read(FWD, K0))
    assert len(find_races(t)) == 1


def test_host_sync_orders_streams_first_seen_after_it():
    assert find_races(story(Copy(LOAD, K0), HostSync(), read(OTHER, K0))) == []


def test_wait_on_never_recorded_event_does_not_order():
    t = story(Copy(LOAD, K0), Wait(FWD, EV), read(FWD, K0))
    assert len(find_races(t)) == 1


def test_wait_enqueued_before_the_record_does_not_order():
    # sglang#38472's class: the record comes later in enqueue order (another host thread), so the
    # wait binds to no record, or to the one before it; the same ops with the record first are clean.
    late = story(Wait(FWD, EV), Copy(LOAD, K0), Record(LOAD, EV), read(FWD, K0))
    assert [f.kind for f in find_races(late)] == [RaceKind.READ_AFTER_WRITE]
    reused = story(Record(LOAD, EV), HostSync(), Wait(FWD, EV), Copy(LOAD, K0), Record(LOAD, EV), read(FWD, K0))
    assert [f.kind for f in find_races(reused)] == [RaceKind.READ_AFTER_WRITE]
    assert find_races(story(Copy(LOAD, K0), Record(LOAD, EV), Wait(FWD, EV), read(FWD, K0))) == []


def test_replay_body_read_after_captured_graph_wait_is_ordered():
    body = (Wait(CAP, EV, in_graph=True), read(CAP, K0))
    t = story(Copy(LOAD, K0), Record(LOAD, EV), Replay(FWD, 7, body))
    assert find_races(t) == []


def test_replay_body_ignores_python_level_waits():
    body = (Wait(CAP, EV, in_graph=False), read(CAP, K0))
    t = story(Copy(LOAD, K0), Record(LOAD, EV), Replay(FWD, 7, body))
    (f,) = find_races(t)
    assert f.in_replay and f.access_stream == "forward"  # runs on the replay's stream
    assert "graph replay on forward" in f.describe()


def test_wait_before_replay_on_final_event_orders_the_whole_body():
    body = (read(CAP, K0), read(CAP, K1, what="L1 attention"))
    t = story(
        Copy(LOAD, K0), Record(LOAD, EV), Copy(LOAD, K1), Record(LOAD, EV2),
        Wait(FWD, EV2), Replay(FWD, 7, body),
    )
    assert find_races(t) == []


def test_replay_body_record_orders_later_work():
    # A record captured in the graph runs on the replay stream.
    body = (Wait(CAP, EV, in_graph=True), Record(CAP, EV2))
    t = story(Copy(LOAD, K0), Record(LOAD, EV), Replay(FWD, 7, body), Wait(OTHER, EV2),
              read(OTHER, K0))
    assert find_races(t) == []


def test_unordered_write_to_copied_region_is_waw():
    (f,) = find_races(story(Copy(LOAD, K0), write(FWD, K0)))
    assert f.kind is RaceKind.WRITE_AFTER_WRITE and not f.access_first


def test_write_then_unordered_copy_is_waw_but_ordered_poison_is_not():
    (f,) = find_races(story(write(FWD, K0, what="x"), Copy(LOAD, K0)))
    assert f.kind is RaceKind.WRITE_AFTER_WRITE and f.access_first
    poisoned = story(
        write(FWD, K0, what="poison"), Record(FWD, START), Wait(LOAD, START), Copy(LOAD, K0)
    )
    assert find_races(poisoned) == []


def test_copy_unordered_after_earlier_read_is_war():
    (f,) = find_races(story(read(FWD, K0), Copy(LOAD, K0)))
    assert f.kind is RaceKind.WRITE_AFTER_READ and f.access_first
    # The copy overwrites what the access read: the access is a read, and says so.
    assert "overwrites" in f.describe() and " reads k[L0" in f.describe() and " writes k[L0" not in f.describe()
    ordered = story(read(FWD, K0), Record(FWD, EV), Wait(LOAD, EV), Copy(LOAD, K0))
    assert find_races(ordered) == []


def test_findings_are_deduplicated_and_stable():
    t = story(
        Copy(LOAD, K1), Copy(LOAD, K0), Copy(LOAD, K0),
        read(FWD, K0), read(FWD, K0), read(FWD, K1, what="L1 attention"),
    )
    first = find_races(t)
    assert [(f.copy_region, f.what) for f in first] == [(K0, "L0 attention"), (K1, "L1 attention")]
    assert find_races(t) == first


def test_unknown_stream_gets_a_fallback_name():
    (f,) = find_races(Trace(ops=[Copy(LOAD, K0), read(FWD, K0)]))
    assert (f.copy_stream, f.access_stream) == ("stream1", "stream2")


# ---- real simulator traces ---------------------------------------------------------

KINDS = ("attention", "mamba", "hybrid")


@functools.cache
def _scenarios():
    from harness.input.scenario_file import default_files, load_files

    return {s.name: s for s in load_files(default_files())}


@functools.cache
def _findings(name: str, zero_delay: bool = False) -> tuple[Finding, ...]:
    from harness.devices.sim import SimDevice
    from harness.records.scenario import Fault
    from harness.run.pipeline import run_scenario

    scenario = _scenarios()[name]
    if zero_delay:
        scenario = scenario.with_overrides(fault=Fault())
    trace = run_scenario(scenario, SimDevice(), replays=1).trace
    assert trace is not None and trace.ops
    return tuple(find_races(trace))


@pytest.mark.parametrize("kind", KINDS)
def test_full_none_races_on_every_layer(kind):
    name = f"{kind}-full-none"
    findings = _findings(name)
    assert findings
    assert all(f.in_replay and f.copy_stream != f.access_stream for f in findings)
    assert not any(f.what == "poison" for f in findings)  # ordered before the load
    assert any(f.kind is RaceKind.READ_AFTER_WRITE for f in findings)
    copied = _copied_layers(name)
    assert copied and {f.copy_region.layer for f in findings
                       if f.kind is RaceKind.READ_AFTER_WRITE} == copied


def _copied_layers(name: str) -> set[int]:
    from harness.devices.sim import SimDevice
    from harness.run.pipeline import run_scenario

    trace = run_scenario(_scenarios()[name], SimDevice(), replays=1).trace
    return {op.dst.layer for op in trace.ops if isinstance(op, Copy)}


@pytest.mark.parametrize("kind", KINDS)
def test_full_none_race_is_structural_without_injected_delay(kind):
    name = f"{kind}-full-none"
    zero = _findings(name, zero_delay=True)
    assert zero
    assert {(f.kind, f.copy_region, f.what) for f in zero} == {
        (f.kind, f.copy_region, f.what) for f in _findings(name)
    }


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", ["full-final_event", "breakable-none"])
def test_synchronised_modes_have_no_findings(kind, mode):
    assert _findings(f"{kind}-{mode}") == ()
    assert _findings(f"{kind}-{mode}", zero_delay=True) == ()


@pytest.mark.parametrize("kind", KINDS)
def test_eager_without_waits_has_findings(kind):
    findings = _findings(f"{kind}-eager-nowaits")
    assert findings
    assert not any(f.in_replay for f in findings)


def test_describe_is_one_line_naming_stream_and_region():
    for f in _findings("hybrid-full-none"):
        text = f.describe()
        assert "\n" not in text and text.strip() == text
        assert "load" in text and "forward" in text
        assert str(f.access_region) in text and str(f.copy_region) in text
        assert f.what in text


# ---- value waits on a generation counter: what a flag holds when the trace starts ---------


class GenerationFence:
    """An eager design with a wait target that grows with each load op: the load stream writes each
    layer's flag to the op's generation right after that layer's copies, and every accessor waits
    until the flag reaches the current generation. Nothing re-arms the flags: the value a flag holds
    from the previous op is one generation short, so it can never release this op's waits."""

    written_at_start = False  # the twin: the generation written before the copies

    def setup(self, s) -> None:
        self.flags = s.dev.Flags(s.counter.num_layers, 0)
        self.generation = 0
        s.on_load_start(self._start)
        if not self.written_at_start:
            s.on_layer_loaded(lambda layer: self.flags.write(layer, self.generation))
        s.add_wait(lambda counter, layer_id, pool: self.flags.wait(layer_id, self.generation))

    def _start(self) -> None:
        self.generation += 1
        if self.written_at_start:
            self.flags.write_all(self.generation)  # on the scheduling stream: before the op's copies

    def __call__(self, ctx) -> None:
        return None  # the waits are the accessors'


class GenerationWrittenAtStart(GenerationFence):
    written_at_start = True


def _generation_run(fence: str):
    from harness.devices.sim import SimDevice
    from harness.records.scenario import Backend, Expect, Fault, FaultKind
    from harness.run.pipeline import run_scenario
    from tests.support.builders import small_scenario

    s = small_scenario(backend=Backend.EAGER, accessor="none", fence=f"{__name__}:{fence}",
                       fault=Fault(FaultKind.GATE), expect=Expect.CLEAN, replays=4)
    return run_scenario(s, SimDevice())


def test_a_generation_counter_fence_is_clean_in_the_analysis_and_the_data():
    r = _generation_run("GenerationFence")
    assert r.error is None, r.error
    assert r.findings == [], [f.describe() for f in r.findings]
    assert r.tally.replays == 4 and r.tally.stale_replays == 0
    assert r.met


def test_a_generation_written_before_the_copies_is_a_race_in_the_analysis_and_the_data():
    r = _generation_run("GenerationWrittenAtStart")
    assert r.error is None, r.error
    assert RaceKind.READ_AFTER_WRITE in {f.kind for f in r.findings}
    assert r.tally.stale_replays == 4
    assert not r.met


def _generations(loads: int, *, grown: bool = True) -> tuple[list, list[Finding]]:
    """`loads` load ops on the simulator, each writing its generation to the flag after its copy, and
    a forward after each that waits for the flag to reach its op's generation (or, not `grown`, the
    first op's) and reads: what each read saw, and the findings of the last op's trace."""
    import torch

    from harness.devices.sim import SimDevice

    dev = SimDevice()
    load, fwd = dev.Stream("load"), dev.Stream("forward")
    flags = dev.Flags(1, 0)
    dst, seen, trace = torch.zeros(4), [], None
    for generation in range(1, loads + 1):
        src = torch.full((4,), float(generation))
        with contextlib.ExitStack() as last:
            if generation == loads:
                trace = last.enter_context(dev.tracing())
            with dev.stream(fwd):
                start = dev.Event()
                start.record()
            with dev.stream(load):
                start.wait()
                dev.delay(500.0)  # the copy lands well after the forward is launched
                dev.copy_async(dst, src, K0)
                flags.write(0, generation)
            with dev.stream(fwd):
                flags.wait(0, generation if grown else 1)
                dev.launch(lambda: seen.append(dst[0].item()), reads=[K0], what="L0 attention")
            dev.synchronize()
    assert trace is not None
    return seen, find_races(trace)


def test_a_wait_target_that_grows_with_each_load_is_ordered_after_that_loads_write():
    # The trace of the third load starts with the flag at 2: only the write of 3 can release the wait.
    seen, findings = _generations(3)
    assert seen == [1.0, 2.0, 3.0]
    assert findings == []


def test_a_wait_target_that_does_not_grow_is_released_by_the_value_before_the_trace():
    # The flag holds 2 when the trace starts, and a wait for 1 passes at once: a stale read.
    seen, findings = _generations(3, grown=False)
    assert seen[1:] == [1.0, 2.0]
    assert [f.kind for f in findings] == [RaceKind.READ_AFTER_WRITE]


F0 = 300


def _value_story(*ops, flag_values=None) -> Trace:
    t = story(*ops)
    if flag_values is not None:
        t.flag_values = flag_values
    return t


GENERATION_3 = (Copy(LOAD, K0), FlagWrite(LOAD, (F0,), 3), FlagWait(FWD, F0, 3), read(FWD, K0))


def test_a_flag_value_from_before_the_trace_short_of_the_target_releases_nothing():
    assert find_races(_value_story(*GENERATION_3, flag_values={F0: (2,)})) == []


def test_a_flag_value_from_before_the_trace_that_reaches_the_target_may_release_the_wait():
    for values in ({F0: (3,)}, {F0: (2, 4)}, None):  # None: not known, it may hold anything
        (f,) = find_races(_value_story(*GENERATION_3, flag_values=values))
        assert f.kind is RaceKind.READ_AFTER_WRITE, values
