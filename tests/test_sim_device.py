"""The simulator's stream semantics on small hand-built stories, one property each.

Cast: stream L (load) copies SRC into DST, a region of pool k at layer 0; stream F
(forward) accesses it. The default costs land a tiny copy within a fraction of a
microsecond, so most stories use a slow link (SLOW) to keep a copy in flight
for a long virtual time; none of them sleeps.
"""

from __future__ import annotations

import pytest
import torch

from harness.devices.sim import CaptureInvalidated, SimCosts, SimDevice
from harness.protocol.loadback import LayerDoneCounter
from harness.records.trace import Access, Copy, Delay, HostSync, Record, Region, Replay, Wait

POISON = -1.0
REGION = Region("k", 0, 0, 4)
OTHER = Region("k", 0, 4, 8)
SLOW = SimCosts(bandwidth_gbps=1e-6)  # 16 bytes take 16000 virtual us


class Story:
    def __init__(self, costs: SimCosts | None = None):
        self.dev = SimDevice(costs)
        self.L = self.dev.Stream("load")
        self.F = self.dev.Stream("forward")
        self.src = torch.arange(1.0, 5.0)
        self.dst = torch.full((4,), POISON)

    def copy(self, region: Region = REGION) -> None:
        with self.dev.stream(self.L):
            self.dev.copy_async(self.dst, self.src, region)

    def record_on_L(self, **kw):
        e = self.dev.Event(**kw)
        e.record(self.L)
        return e

    def read(self, region: Region = REGION) -> torch.Tensor:
        """An access on F that reads `region`; returns what the kernel saw."""
        with self.dev.stream(self.F):
            self.dev.access(reads=[region])
        return self.dst.clone()

    def fresh(self, seen: torch.Tensor) -> bool:
        if seen.equal(self.src):
            return True
        assert (seen == POISON).all()
        return False


def test_copy_is_invisible_to_an_unordered_access_before_it_lands():
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


def test_access_to_another_region_does_not_land_the_copy():
    s = Story()
    s.copy()
    s.F.wait_event(s.record_on_L())
    s.read(OTHER)
    assert (s.dst == POISON).all()


def test_long_delay_before_copy_keeps_it_invisible():
    s = Story()  # default costs: the copy itself is quick
    with s.dev.stream(s.L):
        s.dev.delay(1e6)
    s.copy()
    assert not s.fresh(s.read())


def test_access_after_landing_time_sees_the_copy_without_any_wait():
    s = Story(SLOW)
    s.copy()
    with s.dev.stream(s.F):
        s.dev.delay(1e6)  # F's clock runs past the landing time
    assert s.fresh(s.read())


def test_synchronize_lands_everything():
    s = Story(SLOW)
    s.copy()
    s.copy(OTHER)  # same tensors, a second pending copy
    s.dev.synchronize()
    assert s.dst.equal(s.src)
    assert s.dev._pending == []


def test_synchronized_copy_does_not_land_again():
    s = Story(SLOW)
    s.copy()
    s.dev.synchronize()
    s.dst.fill_(POISON)  # the landed value is overwritten; the copy must not land again
    assert not s.fresh(s.read())


def test_copy_issued_after_synchronize_is_not_ordered_by_it():
    s = Story(SLOW)
    s.dev.synchronize()
    s.copy()
    assert not s.fresh(s.read())


def test_wait_on_never_recorded_event_is_a_noop():
    s = Story(SLOW)
    s.copy()
    clock, vc = s.F.clock, dict(s.dev.clocks.clock(s.F.id))
    s.F.wait_event(s.dev.Event())
    assert s.dev.clocks.clock(s.F.id) == vc and s.F.clock >= clock
    assert not s.fresh(s.read())


def test_host_event_query_and_synchronize_follow_virtual_time():
    s = Story()
    with s.dev.stream(s.L):
        s.dev.delay(500.0)
    e = s.record_on_L()
    assert not e.query()
    e.synchronize()
    assert e.query() and s.dev.host_clock >= 500.0


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


def test_replay_honours_external_event_waits():
    s = Story(SLOW)
    e = s.dev.Event(external=True)
    g = s.dev.capture(lambda: (s.dev.current_stream().wait_event(e), s.dev.access(reads=[REGION])))
    s.copy()
    e.record(s.L)
    with s.dev.stream(s.F):
        g.replay()
    assert s.dst.equal(s.src)


class Replayed:
    """fn waits via the counter (a Python-level wait), then snapshots what it reads."""

    def __init__(self):
        self.s = Story(SLOW)
        self.counter = LayerDoneCounter(self.s.dev, 1)
        self.seen = torch.empty(4)

    def fn(self) -> None:
        self.counter.wait_until(0)
        self.s.dev.access(reads=[REGION])
        self.seen.copy_(self.s.dst)

    def start_load(self) -> None:
        self.s.dst.fill_(POISON)
        self.s.copy()
        with self.s.dev.stream(self.s.L):
            self.counter.events[0].complete(0)
        self.counter.set_consumer(0)


def test_graph_replay_skips_python_waits_and_reads_stale():
    r = Replayed()
    assert r.counter.consumer_index == -1  # nothing pending at capture: no wait captured
    g = r.s.dev.capture(r.fn)
    r.start_load()
    with r.s.dev.stream(r.s.F):
        g.replay()
    assert not r.s.fresh(r.seen)


def test_same_fn_run_eagerly_waits_and_reads_fresh():
    r = Replayed()
    r.s.dev.capture(r.fn)
    r.start_load()
    with r.s.dev.stream(r.s.F):
        r.fn()
    assert r.s.fresh(r.seen)


def test_replay_is_traced_as_one_op_with_the_captured_body():
    r = Replayed()
    g = r.s.dev.capture(r.fn)
    r.start_load()
    with r.s.dev.tracing() as t, r.s.dev.stream(r.s.F):
        g.replay()
    assert t.ops == [Replay(r.s.F.id, g.id, tuple(g.body))]
    assert not any(isinstance(op, Wait) for op in g.body)


def test_late_copy_clobbers_what_an_access_wrote():
    s = Story(SLOW)
    s.copy()
    with s.dev.stream(s.F):
        s.dev.access(writes=[REGION])
        s.dst.fill_(7.0)  # the kernel's write, over the poison
    assert (s.dst == 7.0).all()
    s.dev.synchronize()
    assert s.dst.equal(s.src)  # the copy landed after it (WAW)


def story_once():
    s = Story(SimCosts(bandwidth_gbps=1e-4))
    with s.dev.tracing() as t:
        with s.dev.stream(s.L):
            s.dev.delay(3.0)
        s.copy()
        e = s.record_on_L()
        seen_before = s.read().clone()
        s.F.wait_event(e)
        seen_after = s.read().clone()
        s.dev.synchronize()
    return t.ops, t.stream_names, seen_before, seen_after, s.dst, s.dev.host_clock


def test_same_story_twice_gives_same_trace_and_data():
    a, b = story_once(), story_once()
    assert a[0] == b[0] and a[1] == b[1]
    for x, y in zip(a[2:5], b[2:5]):
        assert x.equal(y)
    assert a[5] == b[5]
    kinds = [type(op) for op in a[0]]
    assert kinds == [Delay, Copy, Record, Access, Wait, Access, HostSync]
