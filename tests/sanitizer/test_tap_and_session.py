"""The sanitizer's dispatch-mode tap on CPU tensors, with a fake current stream: what it takes
from each operator's schema (reads, writes, views, outputs), the spans, the stacks, and the
`harness.sanitizer` facade around it."""

from __future__ import annotations

import weakref
from pathlib import Path

import pytest
import torch

import harness
from harness.records.errors import RacesFound
from harness.sanitizer import Sanitizer
from harness.sanitizer.model import SanitizerModel
from harness.sanitizer.tap import OpWatch, short_stack

pytest_plugins = ["pytester"]


class FakeStreams:
    """`stream_of` for CPU tensors: a current stream the test switches by hand."""

    def __init__(self) -> None:
        self.current = 0

    def __call__(self) -> int:
        return self.current


class Spy(SanitizerModel):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, list[tuple[str, bool]]]] = []

    def op(self, stream, uses):
        self.seen.append((uses[0].site.operator, sorted((u.site.argument, u.is_write) for u in uses)))
        super().op(stream, uses)

    def host_op(self, uses):
        self.seen.append(("host " + uses[0].site.operator, sorted((u.site.argument, u.is_write) for u in uses)))
        super().host_op(uses)


def watch(model, streams, host=()):
    host_ids = {id(t) for t in host}
    ptrs = {t.data_ptr() for t in host}
    return OpWatch(model, stream_of=streams,
                   space_of=lambda t: "host" if id(t) in host_ids or t.data_ptr() in ptrs else "cpu")


def test_an_in_place_op_writes_self_and_reads_the_rest():
    m, s = Spy(), FakeStreams()
    a, b = torch.zeros(8), torch.ones(8)
    with watch(m, s):
        a.add_(b)
    assert m.seen == [("aten::add_.Tensor", [("other", False), ("self, output", True)])]


def test_an_out_argument_is_written_and_a_view_is_not_an_access():
    m, s = Spy(), FakeStreams()
    a, b, c = torch.zeros(8), torch.ones(8), torch.empty(8)
    with watch(m, s):
        a.view(2, 4)
        a.unsqueeze(0)
        a[2:]
        torch.add(a, b, out=c)
    assert m.seen == [("aten::add.out", [("other", False), ("out, output", True), ("self", False)])]


def test_a_copy_writes_its_target_and_reads_its_source():
    m, s = Spy(), FakeStreams()
    a, b = torch.zeros(8), torch.ones(8)
    with watch(m, s):
        a.copy_(b)
    assert m.seen == [("aten::copy_", [("self, output", True), ("src", False)])]


@pytest.mark.parametrize("waits", [True, False])
def test_two_streams_race_through_real_ops(waits):
    m, s = SanitizerModel(), FakeStreams()
    x, y = torch.zeros(1024), torch.ones(1024)
    with watch(m, s):
        s.current = 0x100
        x.copy_(y)  # the side stream writes x
        m.record(1, 0x100)
        s.current = 0
        if waits:
            m.wait(1, 0)
        (x * 2).sum()
    assert [r.kind.value for r in m.races] == ([] if waits else ["read-after-write"])
    if not waits:
        race = m.races[0]
        assert race.earlier.use.site.operator == "aten::copy_"
        assert race.later.use.site.operator == "aten::mul.Tensor"
        assert race.later.use.span.start == x.data_ptr() and race.later.use.span.stop == x.data_ptr() + 4096
        assert any("test_tap_and_session.py" in f for f in race.later.use.site.stack)


@pytest.mark.parametrize("pageable", [True, False])
def test_a_copy_into_pageable_host_memory_orders_the_host_after_its_stream(pageable):
    """A device-to-pageable copy returns only when its stream's work is done, so what the host
    enqueues next on another stream is ordered after it; into pinned memory it is asynchronous."""
    m, s = SanitizerModel(), FakeStreams()
    x, y = torch.zeros(64), torch.ones(64)  # device tensors here
    out = torch.empty(64)  # host memory: pageable (untracked) or pinned
    space = {id(out): None if pageable else "host"}
    with OpWatch(m, stream_of=s, space_of=lambda t: space.get(id(t), "cpu")):
        s.current = 1
        x.copy_(y)  # stream 1 writes x
        out.copy_(x)  # the host reads x back
        s.current = 2
        x.fill_(0)  # then enqueues a write of x on stream 2
    assert sorted(r.kind.value for r in m.races) == ([] if pageable else ["write-after-read", "write-after-write"])


@pytest.mark.parametrize("overlap", [True, False])
def test_slices_of_one_tensor_race_only_where_they_overlap(overlap):
    m, s = SanitizerModel(), FakeStreams()
    x = torch.zeros(64)
    with watch(m, s):
        s.current = 1
        x[:32].fill_(1)
        s.current = 2
        x[32 - overlap:].fill_(2)
    assert [r.kind.value for r in m.races] == (["write-after-write"] if overlap else [])


def test_a_strided_view_spans_its_whole_extent():
    m, s = SanitizerModel(), FakeStreams()
    x = torch.zeros(4, 8)
    with watch(m, s):
        s.current = 1
        x[:, 0].fill_(1)  # column 0: bytes of rows 0..3, stride 8
        s.current = 2
        x[2, 1:].fill_(2)  # bytes between its elements, inside its extent: taken as overlapping
    assert len(m.races) == 1
    assert m.races[0].earlier.use.span.stop - m.races[0].earlier.use.span.start == (3 * 8 + 1) * 4


@pytest.mark.parametrize("seen", [True, False])
def test_an_op_on_host_memory_only_is_the_hosts_own_work(seen):
    m, s = Spy(), FakeStreams()
    pinned, dev = torch.ones(16), torch.zeros(16)
    with watch(m, s, host=[pinned]):
        s.current = 0x100
        dev.copy_(pinned)  # an H2D copy on the side stream reads the pinned source
        m.record(1, 0x100)
        if seen:
            m.event_sync(1)
        pinned.fill_(3)  # the host refills it
    assert m.seen[-1][0] == "host aten::fill_.Scalar"
    assert [r.kind.value for r in m.races] == ([] if seen else ["write-after-read"])


def test_the_short_stack_leaves_out_torch_and_keeps_the_caller():
    frames = short_stack(3, 1)
    assert frames and frames[-1].startswith("sanitizer/test_tap_and_session.py:")  # the last two parts of the path


class CpuWatch:
    def __init__(self, model, depth):
        self.streams = FakeStreams()
        self.ops = OpWatch(model, stream_of=self.streams, space_of=lambda t: "cpu", stack_depth=depth)

    def start(self):
        self.ops.__enter__()

    def stop(self):
        self.ops.__exit__(None, None, None)


def racy(s: Sanitizer, x: torch.Tensor) -> None:
    w = s._watch
    w.streams.current = 1
    x.fill_(1)
    w.streams.current = 2
    x.sum()


def test_the_sanitizer_collects_and_reports():
    x = torch.zeros(8)
    with Sanitizer(watch=CpuWatch) as s:
        racy(s, x)
    assert len(s.races) == 1
    text = s.report()
    assert "1 unordered pair" in text and "aten::sum" in text and "aten::fill_" in text and "in racy" in text


def test_raise_on_race_raises_at_exit_and_only_then():
    x = torch.zeros(8)
    with pytest.raises(RacesFound) as e:
        with Sanitizer(raise_on_race=True, watch=CpuWatch) as s:
            racy(s, x)
    assert len(e.value.races) == 1 and "read-after-write" in str(e.value)
    with Sanitizer(raise_on_race=True, watch=CpuWatch) as s:
        x.fill_(1)  # one stream: ordered
        x.sum()
    assert s.races == [] and s.report().endswith("no unordered accesses")


def test_an_error_in_the_block_goes_through_with_the_races_kept():
    x = torch.zeros(8)
    with pytest.raises(ZeroDivisionError):
        with Sanitizer(raise_on_race=True, watch=CpuWatch) as s:
            racy(s, x)
            1 / 0  # noqa: B018
    assert len(s.races) == 1


def test_the_cuda_watch_patches_only_while_it_watches_and_one_at_a_time():
    from harness.records.errors import SanitizerError
    from harness.sanitizer.tap import CudaWatch

    before = {n: torch.cuda.CUDAGraph.__dict__.get(n) for n in ("capture_begin", "capture_end", "replay")}
    new_before = torch.cuda.Event.__dict__["__new__"]
    with Sanitizer() as s:
        assert torch.cuda.CUDAGraph.__dict__["replay"] is not before["replay"]
        with pytest.raises(SanitizerError, match="already watching"):
            Sanitizer().__enter__()
        x = torch.zeros(4)
        x.add_(1)  # CPU memory that is not pinned: not tracked
    assert s.races == [] and s.model._history == {}
    assert {n: torch.cuda.CUDAGraph.__dict__.get(n) for n in before} == before
    assert torch.cuda.Event.__dict__["__new__"] is new_before
    assert isinstance(CudaWatch(s.model), CudaWatch)


def test_the_pytest_fixture_is_in_the_plugin(pytester, monkeypatch):
    pytester.makepyfile(test_fix="""
        from harness.sanitizer.model import Site, Span, Use

        def race(model):
            model.op(1, [Use(Span("cuda:0", 0, 8), True, Site("aten::fill_", "self"))])
            model.op(2, [Use(Span("cuda:0", 0, 8), False, Site("aten::sum", "self"))])

        def test_watched(stream_sanitizer):
            assert stream_sanitizer.races == []

        def test_a_race_fails_it(stream_sanitizer):
            race(stream_sanitizer.model)

        def test_a_race_it_looks_at_itself(stream_sanitizer):
            stream_sanitizer.raise_on_race = False
            race(stream_sanitizer.model)
            assert len(stream_sanitizer.races) == 1

        def test_zz_a_mode_left_active_fails_it(stream_sanitizer):  # last: the mode stays active
            from torch.utils._python_dispatch import TorchDispatchMode

            class Left(TorchDispatchMode):
                def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                    return func(*args, **(kwargs or {}))

            Left().__enter__()
    """)
    # In its own process: an in-process run drops the modules it imported (numpy's among them),
    # and a later test of this worker that imports them again fails.
    monkeypatch.setenv("PYTHONPATH", str(Path(harness.__file__).resolve().parent.parent))  # this checkout's
    result = pytester.runpytest_subprocess("-p", "harness.frontends.pytest_plugin", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4, errors=2)
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_a_race_fails_it*", "*read-after-write race*",
                                 "*ERROR at teardown of test_zz_a_mode_left_active_fails_it*",
                                 "*still active at its exit: Left; they stay active*"])


# ---- the whole tap on CPU: torch's trace callbacks fired by hand, the graph hooks called ----

MAIN, SIDE, CAP = 0, 0x100, 0x200


def fire(name: str, *args: int) -> None:
    import torch.cuda._gpu_trace as gpu_trace

    getattr(gpu_trace, name).fire_callbacks(*args)


@pytest.mark.parametrize("fence", ["none", "wait_stream", "event", "in_graph"])
def test_the_example_sequence_through_the_cuda_watch(fence):
    """harness/examples/h2d_graph_race.py's calls, as CUDA would trace them, on CPU tensors."""
    from harness.sanitizer.tap import CudaWatch

    streams = FakeStreams()
    host, dev, out = torch.ones(256), torch.zeros(256), torch.empty(256)
    pinned = host.data_ptr()

    def make(model, depth):
        return CudaWatch(model, stack_depth=depth, stream_of=streams,
                         space_of=lambda t: "host" if t.data_ptr() == pinned else "cpu")

    graph = object()
    with Sanitizer(watch=make) as s:
        w = s._watch
        fire("EventRecordCallbacks", 11, SIDE)  # copied.record(side)
        fire("DeviceSynchronizationCallbacks")
        streams.current = CAP
        w.on_capture_begin(graph)
        if fence == "in_graph":
            fire("EventWaitCallbacks", 11, CAP)  # copied.wait() inside the capture
        torch.mul(dev, 2, out=out)
        w.on_capture_end(graph)
        fire("DeviceSynchronizationCallbacks")
        for i in range(3):
            streams.current = MAIN
            dev.fill_(float("nan"))
            fire("EventRecordCallbacks", 20 + i, MAIN)  # side.wait_stream(current)
            fire("EventWaitCallbacks", 20 + i, SIDE)
            streams.current = SIDE
            dev.copy_(host)
            fire("EventRecordCallbacks", 11, SIDE)  # copied.record()
            streams.current = MAIN
            if fence == "wait_stream":
                fire("EventRecordCallbacks", 30 + i, SIDE)
                fire("EventWaitCallbacks", 30 + i, MAIN)
            elif fence == "event":
                fire("EventWaitCallbacks", 11, MAIN)
            w.on_replay(graph, ("example.py:40 in run",))
            fire("DeviceSynchronizationCallbacks")
            bool(out.isnan().any())
    if fence != "none":
        assert s.races == [], s.report()
        return
    assert len(s.races) == 1, s.report()
    race = s.races[0]
    assert race.times == 3 and race.kind.value == "read-after-write"
    assert race.earlier.use.site.operator == "aten::copy_" and race.earlier.where == "stream 0x100"
    assert race.later.use.site.operator == "aten::mul.out" and race.later.use.site.argument == "self"
    assert race.later.where == "graph 1 replayed on stream 0 (legacy default)"
    assert "example.py:40 in run" in race.describe()


def test_a_trace_callback_with_no_sanitizer_watching_does_nothing():
    fire("EventRecordCallbacks", 11, SIDE)  # registered once per process; no one to tell
    with Sanitizer() as s:
        fire("EventRecordCallbacks", 12, SIDE)
    assert 12 in s.model._events and 11 not in s.model._events


def test_the_comparison_tables_rows(capsys):
    from harness.studies.sanitizer_compare import CASES, Case, _row

    assert [c.name for c in CASES if c.racy] == [
        "example:none", "attention-full-none", "mamba-full-none", "hybrid-full-none"]
    assert _row(Case("example:none"), {"stale": 50, "races": 1, "ours_stale": 50, "torch": "silent"}, 50)
    assert not _row(Case("attention-full-final_event"), {"stale": 0, "races": 2}, 10)
    assert not _row(Case("example:none"), {"error": "RuntimeError: boom"}, 50)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "| example:none | race | 50/50 | 1 | 50/50 | - / - | silent | yes |"
    assert out[1].endswith("| NO |") and "error: RuntimeError: boom" in out[2]


class FakeCuda:
    """torch.cuda.Event and CUDAGraph stand-ins that trace as CUDA's do, so that the CUDA tap's
    own patches (of __init__, record, query, capture_begin/end, replay) run on CPU."""

    def __init__(self, streams: FakeStreams):
        ids = iter(range(1000, 2000))

        class Event:
            def __new__(cls, enable_timing=False, blocking=False, interprocess=False, external=False):
                ev = object.__new__(cls)
                ev.cuda_event = 0  # created at its first record, as CUDA's
                return ev

            def record(self, stream=None):
                if not self.cuda_event:
                    self.cuda_event = next(ids)
                    fire("EventCreationCallbacks", self.cuda_event)
                fire("EventRecordCallbacks", self.cuda_event, streams())

            def wait(self, stream=None):
                if self.cuda_event:
                    fire("EventWaitCallbacks", self.cuda_event, streams())

            def query(self):
                return True

        class CUDAGraph:
            def capture_begin(self, pool=None, capture_error_mode="global"):
                pass

            def capture_end(self):
                pass

            def replay(self):
                pass

        self.Event, self.CUDAGraph = Event, CUDAGraph


@pytest.fixture
def fake_cuda(monkeypatch):
    streams = FakeStreams()
    fake = FakeCuda(streams)
    monkeypatch.setattr(torch.cuda, "Event", fake.Event)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", fake.CUDAGraph)
    from harness.sanitizer.tap import CudaWatch

    def watch(model, depth):
        return CudaWatch(model, stack_depth=depth, stream_of=streams, space_of=lambda t: "cuda:0")

    return streams, watch


@pytest.mark.parametrize("external", [True, False])
def test_an_external_event_recorded_in_a_graph_through_the_patches(fake_cuda, external):
    streams, watch = fake_cuda
    x, out = torch.zeros(64), torch.empty(64)
    with Sanitizer(watch=watch) as s:
        done = torch.cuda.Event(external=external)
        # Marked on the event itself: a set of weak references to torch's events crashed the process.
        assert weakref.getweakrefcount(done) == 0
        graph = torch.cuda.CUDAGraph()
        streams.current = CAP
        graph.capture_begin()
        torch.mul(x, 2, out=out)  # the graph reads x
        done.record()  # a record node when external: each replay records it
        graph.capture_end()
        streams.current = MAIN
        for _ in range(2):
            graph.replay()
            streams.current = SIDE
            done.wait()  # the next copy waits for the replay's read
            x.fill_(1)
            streams.current = MAIN
            fire("DeviceSynchronizationCallbacks")
    assert [r.kind.value for r in s.races] == ([] if external else ["write-after-read"])
    if not external:
        assert "test_tap_and_session.py" in s.races[0].earlier.replay_stack[-1]
    assert torch.cuda.Event.__dict__["__new__"].__func__.__qualname__.startswith("FakeCuda")  # untouched
    assert "__init__" not in torch.cuda.Event.__dict__  # the patch is gone


@pytest.mark.parametrize("polled", [True, False])
def test_an_event_query_that_says_done_orders_what_the_host_does_next(fake_cuda, polled):
    streams, watch = fake_cuda
    x = torch.zeros(64)
    with Sanitizer(watch=watch) as s:
        copied = torch.cuda.Event()
        streams.current = SIDE
        x.fill_(1)
        copied.record()
        streams.current = MAIN
        if polled:
            assert copied.query()
        x.sum()
    assert [r.kind.value for r in s.races] == ([] if polled else ["read-after-write"])


# ---- teardown: every tap off, in reverse order, before the last reference goes ----


def _stack() -> list:
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return _get_current_dispatch_mode_stack()


def _ours_registered(registry_name: str) -> bool:
    import harness.sanitizer.tap as tw

    registry = getattr(tw._gpu_trace(), registry_name)
    return any(cb is forwarder for _, forwarder in tw._callbacks for cb in registry.callback_list)


def test_the_cuda_watch_leaves_in_reverse_order_and_keeps_its_mode():
    import gc
    import weakref

    import harness.sanitizer.tap as tw

    depth = len(_stack())
    with Sanitizer() as s:
        watch = s._watch
        assert tw._watching == [watch] and _stack()[-1] is watch.ops
        assert _ours_registered("MemoryDeallocationCallbacks") and _ours_registered("EventRecordCallbacks")
        ops, model = weakref.ref(watch.ops), watch.model
        del watch
    assert tw._watching == [] and s._watch is None
    assert len(_stack()) == depth  # our mode popped, nothing else
    assert not _ours_registered("MemoryDeallocationCallbacks") and not _ours_registered("EventRecordCallbacks")
    fire("EventRecordCallbacks", 13, SIDE)  # torch's trace reaches nothing of ours now
    assert 13 not in model._events
    gc.collect()
    # The mode outlives the sanitizer (torch never gets to free a mode it still points at), without its model.
    assert ops() is not None and ops() in tw._retired and ops().model is not model
    with Sanitizer() as again:  # and the next one starts clean
        fire("EventRecordCallbacks", 14, SIDE)
    assert 14 in again.model._events and 14 not in model._events


class Counting(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


def test_a_mode_left_active_inside_the_block_stays_and_the_sanitizers_goes():
    from harness.records.errors import SanitizerError
    from harness.sanitizer.tap import OpWatch

    depth = len(_stack())
    other = Counting()
    s = Sanitizer().__enter__()
    other.__enter__()  # entered inside, never exited: torch's plain exit would pop this one instead
    try:
        with pytest.raises(SanitizerError, match="still active at its exit: Counting;"):
            s.__exit__(None, None, None)
        stack = _stack()
        assert stack[-1] is other and len(stack) == depth + 1
        assert not any(isinstance(m, OpWatch) for m in stack)
        calls = other.calls
        torch.ones(2).add_(1)
        assert other.calls == calls + 2  # still active: it saw both
    finally:
        other.__exit__(None, None, None)
    assert len(_stack()) == depth


def test_an_error_in_the_block_wins_over_a_mode_left_active():
    other = Counting()
    with pytest.raises(ZeroDivisionError):
        with Sanitizer():
            other.__enter__()
            1 / 0  # noqa: B018
    try:
        assert _stack()[-1] is other
    finally:
        other.__exit__(None, None, None)


def test_a_trace_callback_under_the_watch_lock_does_not_deadlock():
    """A tensor freed while the model is being fed (by the cycle collector, inside any Python
    call) fires torch's free callback on the same thread, under the lock the feed holds."""
    import threading

    done = threading.Event()

    def feed(watch) -> None:
        with watch.lock:
            fire("MemoryDeallocationCallbacks", 0x1000)
        done.set()

    with Sanitizer() as s:
        t = threading.Thread(target=feed, args=(s._watch,), daemon=True)
        t.start()
        t.join(timeout=10)
    assert done.is_set(), "the trace callback waited forever on the watch's own lock"


@pytest.mark.parametrize("recorded", [False, True])
def test_a_block_reused_by_the_caching_allocator_through_the_cuda_watch(recorded):
    """A tensor read on a side stream and freed, its memory handed out again on the stream it was
    allocated on and written there: the allocator's calls as CUDA would trace them, on one CPU tensor
    standing for both owners. `record_stream(side)` before the free makes the reuse wait."""
    from harness.sanitizer.tap import CudaWatch

    streams = FakeStreams()
    t = torch.zeros(256)
    block = t.data_ptr()

    def make(model, depth):
        return CudaWatch(model, stack_depth=depth, stream_of=streams, space_of=lambda _: "cuda:0",
                         stream_id=lambda s: SIDE)

    with Sanitizer(watch=make) as s:
        streams.current = MAIN
        fire("MemoryAllocationCallbacks", block)  # x = torch.empty(...) on MAIN
        t.fill_(1.0)
        fire("EventRecordCallbacks", 11, MAIN)  # side.wait_stream(main)
        fire("EventWaitCallbacks", 11, SIDE)
        streams.current = SIDE
        t.sum()  # read on the side stream
        streams.current = MAIN
        if recorded:
            with pytest.raises(NotImplementedError):  # noted by the tap, then CPU has no kernel for it
                t.record_stream(torch.Stream(device="cpu"))
        fire("MemoryDeallocationCallbacks", block)  # del x
        fire("MemoryAllocationCallbacks", block)  # y = torch.empty(...) on MAIN: the same block
        t.fill_(2.0)  # y written
    if recorded:
        assert s.races == [], s.report()
        return
    (race,) = s.races
    assert race.kind.value == "write-after-read"
    assert race.earlier.use.site.operator == "aten::sum" and race.later.use.site.operator == "aten::fill_.Scalar"
    assert "handed it out again on stream 0 (legacy default)" in race.describe()


def test_an_allocation_alone_writes_nothing_and_a_factory_that_fills_writes_its_output():
    """`torch.empty` runs no kernel: reported as a write, it raced with the pending reads a freed
    block carries over to its next owner, where only the first real write does. A factory that
    fills its output (`zeros_like`) writes it; the tensor it is given, it reads only for its shape."""
    from harness.sanitizer.tap import OpWatch

    class Model:
        def __init__(self) -> None:
            self.ops: list[list[tuple[str, bool]]] = []

        def op(self, stream, uses) -> None:
            self.ops.append([(u.site.operator, u.is_write) for u in uses])

        def host_op(self, uses) -> None:
            self.op(None, uses)

    model = Model()
    x = torch.ones(16)
    with OpWatch(model, stream_of=lambda: MAIN, space_of=lambda _: "cuda:0"):  # type: ignore[arg-type]
        torch.empty(16)
        torch.empty_like(x)
        torch.empty_strided((4, 4), (4, 1))
        torch.zeros_like(x)
    assert model.ops == [[("aten::zeros_like", True)]]
