"""The simulator's stream semantics on small hand-built stories, one property each.

Cast: stream L (load) copies SRC into DST, a region of pool k at layer 0; stream F
(forward) runs kernels that read it. Nothing runs when it is enqueued: a kernel runs
at its virtual start, a copy lands at its virtual end, so what a kernel saw is known
after a synchronize. The default costs land a tiny copy within a fraction of a
microsecond, so most stories use a slow link (SLOW) to keep a copy in flight for a
long virtual time; none of them sleeps.
"""

from __future__ import annotations

import pytest
import torch

from harness.devices.sim import SimCosts, SimDevice
from harness.protocol.loadback import LayerDoneCounter
from harness.records.errors import CaptureInvalidated, HarnessError
from harness.records.trace import Copy, Delay, HostSync, HostWait, Kernel, Record, Region, Replay, Wait

POISON = -1.0
REGION = Region("k", 0, 0, 4)
SLOW = SimCosts(bandwidth_gbps=1e-6)  # 16 bytes take 16000 virtual us


class Story:
    def __init__(self, costs: SimCosts | None = None):
        self.dev = SimDevice(costs)
        self.L = self.dev.Stream("load")
        self.F = self.dev.Stream("forward")
        self.src = torch.arange(1.0, 5.0)
        self.dst = torch.full((4,), POISON)

    def copy(self) -> None:
        with self.dev.stream(self.L):
            self.dev.copy_async(self.dst, self.src, REGION)

    def record_on_L(self, **kw):
        e = self.dev.Event(**kw)
        e.record(self.L)
        return e

    def read(self, stream=None) -> list[torch.Tensor]:
        """A kernel (on F by default) that reads the region; the list gets what it saw when it runs."""
        seen: list[torch.Tensor] = []
        with self.dev.stream(stream or self.F):
            self.dev.launch(lambda: seen.append(self.dst.clone()), reads=[REGION], what="read")
        return seen

    def fresh(self, seen: list[torch.Tensor]) -> bool:
        self.dev.synchronize()
        (value,) = seen
        if value.equal(self.src):
            return True
        assert (value == POISON).all()
        return False


def test_nothing_runs_when_it_is_enqueued():
    s = Story()
    seen = s.read()
    assert seen == []  # the kernel has not run: nothing has asked the device yet
    s.dev.synchronize()
    assert len(seen) == 1


def test_copy_is_invisible_to_an_unordered_kernel_before_it_lands():
    s = Story(SLOW)
    s.copy()
    assert not s.fresh(s.read())


def test_wait_on_event_recorded_after_the_copy_makes_it_visible():
    s = Story(SLOW)
    s.copy()
    s.F.wait_event(s.record_on_L())
    assert s.fresh(s.read())


def test_event_recorded_before_the_copy_does_not_order_it():
    s = Story(SLOW)
    e = s.record_on_L()
    s.copy()
    s.F.wait_event(e)
    assert not s.fresh(s.read())


def test_wait_stream_orders_after_everything_enqueued_there():
    s = Story(SLOW)
    s.copy()
    s.F.wait_stream(s.L)
    assert s.fresh(s.read())


def test_long_delay_before_copy_keeps_it_invisible():
    s = Story()  # default costs: the copy itself is quick
    with s.dev.stream(s.L):
        s.dev.delay(1e6)
    s.copy()
    assert not s.fresh(s.read())


def test_kernel_after_landing_time_sees_the_copy_without_any_wait():
    s = Story(SLOW)
    s.copy()
    with s.dev.stream(s.F):
        s.dev.delay(1e6)  # F starts its kernel after the landing time
    assert s.fresh(s.read())


def test_a_copy_enqueued_later_that_lands_earlier_lands_first():
    # Write-after-read in the data: the kernel is held, the copy behind it lands before it runs.
    s = Story()
    with s.dev.stream(s.F):
        s.dev.delay(1e6)
    seen = s.read()  # enqueued first, starts late
    s.copy()  # enqueued after it, on another stream, lands at once
    assert s.fresh(seen)


def test_synchronize_lands_everything_and_advances_the_host():
    s = Story(SLOW)
    s.copy()
    s.dev.synchronize()
    assert s.dst.equal(s.src)
    assert s.dev.host_clock >= 16000.0


def test_a_copy_issued_after_synchronize_is_not_ordered_by_it():
    s = Story(SLOW)
    s.dev.synchronize()
    s.copy()
    assert not s.fresh(s.read())


def test_wait_on_never_recorded_event_is_a_noop():
    s = Story(SLOW)
    s.copy()
    s.F.wait_event(s.dev.Event())
    assert not s.fresh(s.read())


def test_a_wait_enqueued_before_the_events_first_record_orders_nothing():
    # sglang#38472's class: the load is enqueued (its event recorded) by another host thread after
    # the consumer's wait. CUDA binds a wait to the event's record at the time of the wait: none here,
    # so the wait completes at once, and the record enqueued later orders nothing before the reader.
    s = Story(SLOW)
    e = s.dev.Event()
    s.F.wait_event(e)
    s.copy()
    e.record(s.L)
    assert not s.fresh(s.read())
    # The twin: the record enqueued before the wait (the host knew it was recorded) orders the read.
    t = Story(SLOW)
    t.copy()
    t.F.wait_event(t.record_on_L())
    assert t.fresh(t.read())


def test_a_wait_binds_to_the_record_before_it_not_to_a_later_one():
    # A reused event (a ring slot of the load counter): the wait enqueued before this op's record
    # waits on the previous op's record, long completed, not on the copy recorded after it.
    s = Story(SLOW)
    e = s.dev.Event()
    e.record(s.L)
    s.dev.synchronize()
    s.F.wait_event(e)
    s.copy()
    e.record(s.L)
    assert not s.fresh(s.read())


def test_late_copy_clobbers_what_a_kernel_wrote():
    s = Story(SLOW)
    s.copy()
    with s.dev.stream(s.F):
        s.dev.launch(lambda: s.dst.fill_(7.0), writes=[REGION])
    s.dev.synchronize()
    assert s.dst.equal(s.src)  # the copy landed after the kernel's write (WAW)


# ---------------------------------------------------------------- the host
def test_host_event_query_and_synchronize_follow_virtual_time():
    s = Story()
    with s.dev.stream(s.L):
        s.dev.delay(500.0)
    e = s.record_on_L()
    assert not e.query()
    e.synchronize()
    assert e.query() and s.dev.host_clock >= 500.0


def test_a_polling_host_moves_on_and_its_true_query_orders_it():
    s = Story(SimCosts(poll_us=5.0))
    with s.dev.stream(s.L):
        s.dev.delay(500.0)
    e = s.record_on_L()
    with s.dev.tracing() as t:
        polls = 0
        while not e.query():
            polls += 1
    assert 0 < polls < 500  # each query costs the host poll_us
    assert t.ops == [HostWait(e.id)]  # only the query that returned True


def test_host_wait_gives_up_at_its_timeout():
    s = Story()
    with s.dev.stream(s.L):
        s.dev.delay(1e7)
    e = s.record_on_L()
    assert not s.dev.host_wait(e, timeout_s=1.0)  # 1 s of virtual time < 10 s of delay
    assert s.dev.host_wait(e, timeout_s=60.0)


def test_a_gate_holds_its_stream_until_the_host_opens_it():
    s = Story()
    gate = s.dev.gate(timeout_s=5.0)
    with s.dev.stream(s.L):
        gate.hold()
    s.copy()
    seen = s.read()
    e = s.record_on_L()
    assert not s.dev.host_wait(e, timeout_s=1.0)  # held: it cannot complete
    gate.release()
    assert s.dev.host_wait(e, timeout_s=1.0)
    assert not s.fresh(seen) and not gate.timed_out


def test_a_gate_nobody_opens_is_opened_by_its_watchdog():
    s = Story()
    gate = s.dev.gate(timeout_s=2.0)
    with s.dev.stream(s.L):
        gate.hold()
    s.copy()
    s.dev.synchronize()
    assert gate.timed_out and s.dst.equal(s.src) and s.dev.host_clock >= 2e6


def test_marks_read_virtual_times():
    s = Story()
    with s.dev.stream(s.F):
        a = s.dev.mark(s.F)
        s.dev.delay(300.0)
        b = s.dev.mark(s.F)
    s.dev.synchronize()
    assert s.dev.marker_us(b) - s.dev.marker_us(a) == pytest.approx(300.0 + s.dev.costs.launch_us)


# ---------------------------------------------------------------- capture and replay
def test_plain_event_wait_during_capture_invalidates_it():
    s = Story()
    e = s.record_on_L()
    with pytest.raises(CaptureInvalidated):
        s.dev.capture(lambda: s.dev.current_stream().wait_event(e), warmup=0)
    assert not s.dev.capturing


def test_external_event_wait_during_capture_is_a_graph_node():
    s = Story()
    e = s.record_on_L(external=True)
    g = s.dev.capture(lambda: s.dev.current_stream().wait_event(e), warmup=0)
    assert len(g.body) == 1
    assert isinstance(g.body[0], Wait) and g.body[0].event == e.id and g.body[0].in_graph


def test_capture_runs_nothing_and_replay_runs_only_the_captured_work():
    s = Story()
    host_calls, kernel_runs = [], []

    def fn() -> None:
        host_calls.append(1)  # host Python: runs at warm-up and capture, never at replay
        s.dev.launch(lambda: kernel_runs.append(1), what="k")

    g = s.dev.capture(fn, warmup=1)
    s.dev.synchronize()
    assert (len(host_calls), len(kernel_runs)) == (2, 1)  # the capture ran no kernel
    with s.dev.stream(s.F):
        g.replay()
        g.replay()
    s.dev.synchronize()
    assert (len(host_calls), len(kernel_runs)) == (2, 3)
    assert [type(op) for op in g.body] == [Kernel]


def test_replay_honours_external_event_waits():
    s = Story(SLOW)
    e = s.dev.Event(external=True)
    seen: list[torch.Tensor] = []

    def fn() -> None:
        s.dev.current_stream().wait_event(e)
        s.dev.launch(lambda: seen.append(s.dst.clone()), reads=[REGION])

    g = s.dev.capture(fn, warmup=0)
    s.copy()
    e.record(s.L)
    with s.dev.stream(s.F):
        g.replay()
    assert s.fresh(seen)


class Replayed:
    """fn waits via the counter (a Python-level wait), then launches a kernel that reads."""

    def __init__(self):
        self.s = Story(SLOW)
        self.counter = LayerDoneCounter(self.s.dev, 1)
        self.seen: list[torch.Tensor] = []

    def fn(self) -> None:
        self.counter.wait_until(0)
        self.s.dev.launch(lambda: self.seen.append(self.s.dst.clone()), reads=[REGION])

    def start_load(self) -> None:
        self.s.copy()
        with self.s.dev.stream(self.s.L):
            self.counter.events[0].complete(0)
        self.counter.set_consumer(0)


def test_graph_replay_skips_python_waits_and_reads_stale():
    r = Replayed()
    assert r.counter.consumer_index == -1  # nothing pending at capture: no wait captured
    g = r.s.dev.capture(r.fn, warmup=0)
    r.start_load()
    with r.s.dev.stream(r.s.F):
        g.replay()
    assert not r.s.fresh(r.seen)


def test_waits_handed_over_after_capture_do_not_reach_the_graph():
    # The graph is what was captured: a wait the Python would issue now is not in it.
    r = Replayed()
    g = r.s.dev.capture(r.fn, warmup=0)
    r.start_load()  # a load is pending now: the same Python would wait
    with r.s.dev.stream(r.s.F):
        g.replay()
        r.fn()  # eager: waits
    r.s.dev.synchronize()
    stale, fresh = r.seen
    assert (stale == POISON).all() and fresh.equal(r.s.src)


def test_replay_is_traced_as_one_op_with_the_captured_body():
    r = Replayed()
    g = r.s.dev.capture(r.fn, warmup=0)
    r.start_load()
    with r.s.dev.tracing() as t, r.s.dev.stream(r.s.F):
        g.replay()
    assert t.ops == [Replay(r.s.F.id, g.id, tuple(g.body))]
    assert not any(isinstance(op, Wait) for op in g.body)


# ---------------------------------------------------------------- determinism
def story_once():
    s = Story(SimCosts(bandwidth_gbps=1e-4))
    with s.dev.tracing() as t:
        with s.dev.stream(s.L):
            s.dev.delay(3.0)
        s.copy()
        e = s.record_on_L()
        before = s.read()
        s.F.wait_event(e)
        after = s.read()
        s.dev.synchronize()
    return t.ops, t.stream_names, before[0], after[0], s.dst, s.dev.host_clock, s.dev.timeline(t)


def test_same_story_twice_gives_same_trace_data_and_times():
    a, b = story_once(), story_once()
    assert a[0] == b[0] and a[1] == b[1] and a[5] == b[5] and a[6] == b[6]
    for x, y in zip(a[2:5], b[2:5], strict=False):
        assert x.equal(y)
    assert [type(op) for op in a[0]] == [Delay, Copy, Record, Kernel, Wait, Kernel, HostSync]
    assert not a[2].equal(a[3])  # before the wait it saw poison, after it the copy


# ---- what a flag may hold when a trace starts ------------------------------------------------


def _flags_at_trace_start(dev: SimDevice) -> dict[int, tuple[int, ...]]:
    with dev.tracing() as trace:
        pass
    return trace.flag_values


def test_a_trace_starts_from_what_each_flag_may_hold():
    dev = SimDevice()
    load, fwd = dev.Stream("load"), dev.Stream("forward")
    flags = dev.Flags(2, 0)
    f0, f1 = flags.ids
    assert _flags_at_trace_start(dev) == {f0: (0,), f1: (0,)}
    with dev.stream(load):
        dev.delay(100.0)
        flags.write(0, 3)  # enqueued, not known to have run: the old value and the new
    assert _flags_at_trace_start(dev)[f0] == (0, 3)
    dev.synchronize()
    assert _flags_at_trace_start(dev) == {f0: (3,), f1: (0,)}
    with dev.stream(load):
        flags.write(0, 4)
        flags.write(0, 5)  # the same stream: 5 overwrites 4
    with dev.stream(fwd):
        flags.write_all(7)  # another stream: either may run last
    dev.synchronize()
    assert _flags_at_trace_start(dev) == {f0: (5, 7), f1: (7,)}


def test_a_captured_flag_write_changes_the_flag_only_when_replayed():
    dev = SimDevice()
    flags = dev.Flags(1, 0)
    (f0,) = flags.ids
    graph = dev.capture(lambda: flags.write(0, 2), warmup=0)
    dev.synchronize()
    assert _flags_at_trace_start(dev) == {f0: (0,)}
    graph.replay()
    dev.synchronize()
    assert _flags_at_trace_start(dev) == {f0: (2,)}


def test_flags_made_while_tracing_start_the_trace_at_their_initial_value():
    dev = SimDevice()
    with dev.tracing() as trace:
        flags = dev.Flags(1, 9)
    assert trace.flag_values == {flags.ids[0]: (9,)}


# ---- work that can never run ------------------------------------------------------------------


def _never(fn) -> str:
    with pytest.raises(HarnessError) as info:
        fn()
    text = str(info.value)
    assert text.startswith("work on the simulator can never run: ") and "\n" not in text
    return text.removeprefix("work on the simulator can never run: ")


def test_work_that_can_never_run_is_named_by_its_stream_its_wait_and_what_that_waits_for():
    dev = SimDevice()
    load, fwd = dev.Stream("load"), dev.Stream("forward")
    flags = dev.Flags(1, 0)
    (f,) = flags.ids
    with dev.stream(fwd):
        flags.wait(0, 5)
    assert _never(dev.synchronize) == (f"stream 'forward' waits until flag f{f} >= 5, which nothing can release: "
                                       f"f{f} holds 0, and no write of it queued on any stream reaches 5")
    with dev.stream(load):
        flags.wait(0, 5)
        done = dev.Event()
        done.record()
        flags.write(0, 6)
    with dev.stream(fwd):
        done.wait()
    # The forward's wait is the end of the chain; its words follow it to the wait that starts it.
    assert _never(dev.synchronize) == (
        f"stream 'forward' waits on event e{done.id}, whose record is queued on stream 'load' behind a wait "
        f"until flag f{f} >= 5, whose write of 6 is queued on stream 'load' behind the wait above (they wait for "
        "each other)")


def test_a_host_wait_on_an_event_that_can_never_complete_names_what_holds_its_record():
    dev = SimDevice()
    load = dev.Stream("load")
    flags = dev.Flags(1, 0)
    with dev.stream(load):
        flags.wait(0, 1)
        done = dev.Event()
        done.record()
    assert _never(done.synchronize) == (
        f"the host waits on event e{done.id}, whose record is queued on stream 'load' behind a wait until flag "
        f"f{flags.ids[0]} >= 1, which nothing can release: f{flags.ids[0]} holds 0, and no write of it queued on "
        "any stream reaches 1")


def test_after_work_that_can_never_run_the_device_runs_new_work():
    s = Story(SLOW)
    flags = s.dev.Flags(1, 0)
    stuck = s.dev.Event()
    with s.dev.stream(s.L):
        flags.wait(0, 1)
        stuck.record()
    _never(s.dev.synchronize)
    s.copy()  # on the stream that was stuck
    seen = []
    with s.dev.stream(s.F):
        stuck.wait()  # a record dropped with the stuck work counts as done: it holds nothing up
        s.record_on_L().wait()
        s.dev.launch(lambda: seen.append(s.dst.clone()), reads=[REGION])
    s.dev.synchronize()
    assert torch.equal(seen[0], s.src)


def test_dropping_stuck_work_runs_what_can_run_first():
    s = Story(SLOW)
    flags = s.dev.Flags(1, 0)
    s.copy()
    with s.dev.stream(s.F):
        flags.wait(0, 1)
    s.dev.drop_stuck_work()
    assert torch.equal(s.dst, s.src)  # the copy ran; the wait went
    s.dev.synchronize()
