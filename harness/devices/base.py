"""The small device interface that model, pools, load-back, runners and fences use.

It is shaped like the `device_module` a serving engine uses (`Event()`,
`current_stream()`, `stream(s)`, `event.record()`, `stream.wait_event(e)`), plus
the few things a harness needs on top: async copies that name the region they
write, kernels that name the pool regions they read and write (`launch`), a delay
on a stream, graph capture and replay, a bounded synchronize, and the op list of
all of it (`harness.records.trace`).

Device memory is touched only inside `launch` (or by `copy_async`): on the
simulator a kernel runs at its virtual time, not when Python launches it.

Two implementations sit side by side: `cuda` (real streams and graphs) and
`sim` (a CPU model of stream semantics in virtual time).
"""

from __future__ import annotations

import abc
import contextlib
import gc
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from harness.records.errors import FlagUnavailable, GateUnavailable, GraphUnavailable
from harness.records.graph_model import GraphModel, GraphSource
from harness.records.trace import (
    Collective,
    HostSync,
    HostWait,
    HostWrite,
    Kernel,
    Op,
    Region,
    Replay,
    Span,
    SpanKind,
    Trace,
)

if TYPE_CHECKING:
    from harness.devices.collective import RankGroup

_heap_frozen = False


def freeze_startup_heap() -> None:
    """Once per process: move every object alive now (torch's and the harness's modules, a test
    session's collected items) into the collector's permanent generation.

    A capture collects first (an old graph freed mid-capture would invalidate it), and a full
    collection over torch's own heap costs 0.1 s on an H200 host and more on a small CPU: most of
    a small scenario's set-up. What start-up made lives as long as the process, so freezing it frees
    nothing later; what scenarios make stays collectable."""
    global _heap_frozen
    if not _heap_frozen:
        gc.collect()
        gc.freeze()
        _heap_frozen = True

@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cycle collector off for the block (and back on after, if it was on): a pause
    mid-replay is host jitter, and a graph it frees mid-capture invalidates the capture."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


class Stream(abc.ABC):
    """A device stream. `wait_event` and `wait_stream` order later work on this stream."""

    id: int
    name: str
    _device: Device

    @abc.abstractmethod
    def wait_event(self, event: Event) -> None:
        """Later work on this stream waits until `event`'s latest record has completed."""

    def wait_stream(self, other: Stream) -> None:
        """Later work on this stream waits for all work enqueued on `other` so far."""
        event = self._device.Event()
        event.record(other)
        self.wait_event(event)


class Event(abc.ABC):
    id: int
    external: bool  # may be waited on inside a captured graph
    _device: Device

    @property
    @abc.abstractmethod
    def created(self) -> bool:
        """Does the event exist on the device yet? CUDA creates one at its first record, and torch
        enqueues no wait on one not created yet. Under capture such a wait is no op at all (no wait
        node in the graph, no `Wait` in the op list); eagerly it stays in the op list, where it
        orders nothing, as a wait on a never-recorded event does. An external event is recorded
        once when it is made (`Device.Event`), unless asked not to be."""

    @abc.abstractmethod
    def record(self, stream: Stream | None = None) -> None:
        """Record on `stream` (default: the current stream)."""

    def wait(self, stream: Stream | None = None) -> None:
        """`stream` (default: the current one) waits on this event."""
        (stream or self._device.current_stream()).wait_event(self)

    @abc.abstractmethod
    def query(self) -> bool:
        """Has the latest record completed? The host does not block; a True orders it after
        the event, as a synchronize does (traced as `HostWait`)."""

    @abc.abstractmethod
    def synchronize(self) -> None:
        """Block the host until the latest record has completed."""


# Inside `Device` and its subclasses the methods `Stream` and `Event` (named as in
# device_module) shadow these classes, so annotations there use these names.
_Stream = Stream
_Event = Event


class Gate(abc.ABC):
    """A host-released hold on a stream: the stream waits until the host opens it.

    A watchdog opens a gate that stays shut past its timeout and sets
    `timed_out`, so a forgotten release is an error in a result, never a hang.
    """

    id: int
    mode: str  # how it is built, for reports
    timeout_s: float
    timed_out: bool = False

    @abc.abstractmethod
    def hold(self) -> None:
        """Later work on the current stream waits until `release()`."""

    @abc.abstractmethod
    def release(self) -> None: ...

    def close(self) -> None:
        """Open anything still held (nothing may stay blocked after a scenario)."""
        self.release()


class FlagValues:
    """What each flag of a set may hold, as the host knows it without reading device memory.

    `settled[i]`: the values flag i may hold once every write enqueued before the host's last
    synchronize has run (the value of whichever ran last: the last of some stream's, as writes on
    different streams may run in either order). `pending[i]`: the last value each stream has
    written since (enqueued; run or not). A write captured into a graph is written by each replay
    of it, on the replay's stream.

    A trace starts from these (`Trace.flag_values`): without them the analyser must take a flag's
    value from before the trace to release any wait, and a wait target that grows with each load
    op (a generation counter) would look released by the previous op's value.
    """

    def __init__(self, count: int, initial: int):
        self.settled: list[frozenset[int]] = [frozenset({initial})] * count
        self.pending: list[dict[int, int]] = [{} for _ in range(count)]

    def wrote(self, which: Sequence[int], value: int, stream: int) -> None:
        """Flags `which` are written `value` by work enqueued on `stream` now."""
        for i in which:
            self.pending[i][stream] = value

    def settle(self) -> None:
        """The host synchronized: every write enqueued so far has run."""
        for i, pending in enumerate(self.pending):
            if pending:
                self.settled[i] = frozenset(pending.values())
                pending.clear()

    def may_hold(self, index: int) -> tuple[int, ...]:
        return tuple(sorted(self.settled[index] | set(self.pending[index].values())))


class Flags(abc.ABC):
    """A set of 32-bit flags in device memory that streams write and wait on: value waits.

    `write(i, v)` (`cuStreamWriteValue32`) stores v into flag i once all earlier work on the
    current stream has finished (its copies have landed); `wait(i, v)` (`cuStreamWaitValue32`,
    GEQ) makes later work on the current stream wait until flag i has reached v
    (`harness.records.trace.flag_reached`). A wait made during capture is a node of the graph and,
    unlike a wait on an event, needs no special event: every replay waits on what the flag holds
    when it gets there. `write_all(v)` stores v into every flag at once (one kernel on CUDA).
    """

    ids: tuple[int, ...]  # one id per flag, for the op list
    initial: int
    values: FlagValues  # what each may hold now, as the host knows it (for a trace's start)

    def __len__(self) -> int:
        return len(self.ids)

    def may_hold(self) -> dict[int, tuple[int, ...]]:
        """Every value each flag may hold now, by flag id (`Trace.flag_values`)."""
        return {fid: self.values.may_hold(i) for i, fid in enumerate(self.ids)}

    @abc.abstractmethod
    def write(self, index: int, value: int) -> None: ...

    @abc.abstractmethod
    def write_all(self, value: int) -> None: ...

    @abc.abstractmethod
    def wait(self, index: int, value: int) -> None: ...


# `Device.Flags` (made like Event()) shadows the class there too.
_Flags = Flags


class Graph(abc.ABC):
    id: int
    body: Sequence[Op]  # the ops captured into it: what a replay runs and the analyser reads

    @abc.abstractmethod
    def replay(self) -> None:
        """Enqueue the captured work on the current stream. No Python runs in it."""

    @abc.abstractmethod
    def model(self) -> GraphModel:
        """The graph the device runs, by its own nodes and edges (`harness.records.graph_model`); raises
        GraphUnavailable where it cannot be read."""


_G = TypeVar("_G", bound=Graph)
_F = TypeVar("_F", bound=Flags)


@dataclass
class _Capture:
    """What is being captured right now: the ops that will live in the graph."""

    graph_id: int
    body: list[Op]


@dataclass(frozen=True)
class Memory:
    """A reading of the memory a device keeps its tensors in, in bytes."""

    where: str  # what that memory is, for a message ("GPU memory")
    in_use: int  # what this process holds there now
    available: int  # what it could still take


class Device(abc.ABC):
    """Streams, events, copies, kernels, delays, graphs and their op list, on one device."""

    name: str
    torch_device: torch.device
    clock: str  # what its timings count: "device" time (CUDA events) or "virtual" time (the simulator)

    def __init__(self) -> None:
        self._next_id = 0
        self._trace: Trace | None = None
        self._capture: _Capture | None = None
        self._own = False  # inside harness_work()
        # join()'s events, one per stream it waits for: recorded again at every join (a wait
        # orders after the record before it), so a replay's look allocates nothing.
        self._join_events: weakref.WeakKeyDictionary[Stream, Event] = weakref.WeakKeyDictionary()
        # Weak: a graph goes with its runner; the graph check finds a traced replay's graph by id.
        self._graphs: weakref.WeakValueDictionary[int, Graph] = weakref.WeakValueDictionary()
        # Weak: a scenario's flags go with it. A trace starts from what each may hold; CUDA also
        # names a graph's value nodes by them.
        self._flag_sets: weakref.WeakSet[Flags] = weakref.WeakSet()

    # ---- ids and the op list -------------------------------------------------
    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    @contextlib.contextmanager
    def tracing(self) -> Iterator[Trace]:
        """Record every op enqueued inside the block, and time it (costly: not for the hot loop)."""
        trace = Trace()
        # Streams made before the trace began keep their names in it (the forward, the load stream,
        # a capture's side stream), so no row of it is an unnamed "streamN".
        trace.stream_names.update({s.id: s.name for s in self._made_streams()})
        for flags in list(self._flag_sets):
            trace.flag_values.update(flags.may_hold())
        self._trace = trace
        try:
            yield trace
        finally:
            self._trace = None

    @property
    def recording(self) -> bool:
        """True while tracing or capturing: only then is building op records worth it."""
        return self._trace is not None or self._capture is not None

    @property
    def current_trace(self) -> Trace | None:
        """The op list being recorded by `tracing()` now, or None (read-only: for a check that
        the ops so far are in the order it needs)."""
        return self._trace

    @property
    def capturing(self) -> bool:
        return self._capture is not None

    def _note(self, op: Op) -> None:
        if self._capture is not None:
            self._capture.body.append(op)
        elif self._trace is not None:
            self._trace.add(op)

    def _name_stream(self, stream: _Stream) -> None:
        if self._trace is not None:
            self._trace.stream_names[stream.id] = stream.name

    @property
    def timing(self) -> bool:
        """True while tracing outside a capture: the ops enqueued now get timeline spans."""
        return self._trace is not None and self._capture is None

    def _span(self, stream: _Stream, kind: str, name: str, begin: Any, end: Any) -> None:
        """Keep one op's markers for the timeline (only while `timing`)."""
        assert self._trace is not None
        self._trace.marks.append((stream.id, name, kind, begin, end))

    def marker_us(self, marker: Any) -> float | None:
        """A marker's time in microseconds, once the work has run."""
        return None

    def timeline(self, trace: Trace) -> list[Span]:
        """The timed spans of a trace, in microseconds from the first; call after a synchronize."""
        raw = [(sid, name, kind, self.marker_us(b), self.marker_us(e)) for sid, name, kind, b, e in trace.marks]
        timed = [(sid, name, kind, b, e) for sid, name, kind, b, e in raw if b is not None and e is not None]
        if not timed:
            return []
        t0 = min(r[3] for r in timed)
        names = trace.stream_names
        return [
            Span(names.get(sid, f"stream{sid}"), name, kind, round(b - t0, 3), round(max(e, b) - t0, 3))
            for sid, name, kind, b, e in timed
        ]

    # ---- gates ---------------------------------------------------------------
    def gate(self, timeout_s: float) -> Gate:
        """A gate for the load stream; raises GateUnavailable where none can be built."""
        raise GateUnavailable(f"the {self.name} device has no gate")

    # ---- value waits -------------------------------------------------------------
    def Flags(self, count: int, initial: int) -> Flags:  # noqa: N802 - made like Event()
        """`count` flags, each holding `initial`; raises FlagUnavailable where none can be built."""
        raise FlagUnavailable(f"the {self.name} device has no value waits")

    def _made_flags(self, flags: _F) -> _F:
        """Keep a new flag set known (a trace made now starts from its initial values)."""
        self._flag_sets.add(flags)
        if self._trace is not None:
            self._trace.flag_values.update(flags.may_hold())
        return flags

    def _flags_written(self, flags: _Flags, which: Sequence[int], value: int, stream: _Stream) -> None:
        """A value write enqueued on `stream` (one captured now runs only when replayed)."""
        if not self.capturing:
            flags.values.wrote(which, value, stream.id)

    def host_wait(self, event: _Event, timeout_s: float) -> bool:
        """Block the host until `event` completes or `timeout_s` passes; True if it completed."""
        deadline = time.monotonic() + timeout_s
        while not event.query():  # a True query orders the host after the event
            if time.monotonic() > deadline:
                return False
            time.sleep(20e-6)
        return True

    # ---- the device_module-like surface -----------------------------------------
    @abc.abstractmethod
    def Stream(self, name: str) -> Stream:  # noqa: N802 - mirrors device_module.Stream
        ...

    @abc.abstractmethod
    def Event(self, *, external: bool = False, created: bool = True) -> Event:  # noqa: N802
        """`external`: may be waited on inside a captured graph (a wait node). `created`: an external
        event is recorded once now, so that it exists before any capture waits on it; False leaves it
        as a bare `torch.cuda.Event(external=True)` is until its first record (a wait on it captured
        before then is dropped: the graph holds no wait node)."""

    @abc.abstractmethod
    def current_stream(self) -> _Stream: ...

    @abc.abstractmethod
    def stream(self, stream: _Stream) -> contextlib.AbstractContextManager: ...


    # ---- what a harness needs on top ----------------------------------------------
    @abc.abstractmethod
    def copy_async(self, dst: torch.Tensor, src: torch.Tensor, region: Region, source: Region | None = None) -> None:
        """Host-to-device copy on the current stream; `region` names what it writes, `source` the
        host memory it reads where the host may rewrite that memory (a staging buffer)."""

    def copy_batch_async(self, copies: Sequence[tuple[torch.Tensor, torch.Tensor, Region, Region | None]]) -> None:
        """Host-to-device copies (destination, source, region written, host rows read) enqueued as
        one batch on the current stream, where the device has a batched copy (CUDA's
        `cudaMemcpyBatchAsync`): the host enqueues them in one call. Here, one `copy_async` each."""
        for dst, src, region, source in copies:
            self.copy_async(dst, src, region, source)

    @abc.abstractmethod
    def copy_to_host(self, dst: torch.Tensor, src: torch.Tensor, src_region: Region, dst_region: Region) -> None:
        """Device-to-host copy (a write-back) on the current stream into host memory from
        `empty_host`; `src_region` names the device region it reads, `dst_region` the host one."""

    def host_write(self, fn: Callable[[], object], regions: Sequence[Region], what: str = "") -> None:
        """The host writes host memory the device copies from (`fn` does it, now, on the host).

        An async copy reads its source when it runs, not when it is enqueued: a copy still
        pending sees what `fn` wrote. The simulator first runs the device up to the host's time.
        """
        if self.recording:
            self._note(HostWrite(tuple(regions), what))
        fn()

    @abc.abstractmethod
    def delay(self, us: float) -> None:
        """Hold the current stream for `us` microseconds (a fault, not a sleep on the host)."""

    def launch(
        self,
        fn: Callable[[], object],
        reads: Sequence[Region] = (),
        writes: Sequence[Region] = (),
        what: str = "",
    ) -> None:
        """Run device work `fn` on the current stream; it reads and writes these pool regions.

        On CUDA `fn` enqueues its kernels now (and is captured with them); the op it
        becomes names the regions for the analyser. The simulator runs `fn` at the
        kernel's virtual start instead.
        """
        if self.recording:
            stream = self.current_stream()
            self._note(Kernel(stream.id, tuple(reads), tuple(writes), what, fn))
            if self.timing:
                with self._timed(stream, self._kernel_span(bool(reads or writes)), what or "kernel"):
                    fn()
                return
        fn()

    def all_reduce(self, tensor: torch.Tensor, group: RankGroup, what: str = "all-reduce") -> None:
        """Sum `tensor` over the ranks of `group` in place, on the current stream: a collective op
        (`Collective`) of the op list, captured into a graph like a kernel. Here NCCL's all-reduce,
        enqueued now; the simulator swaps the data through gloo when it runs the op."""

        def run() -> None:
            group.all_reduce(tensor)

        if self.recording:
            stream = self.current_stream()
            self._note(Collective(stream.id, what=what, fn=run))
            if self.timing:
                with self._timed(stream, SpanKind.KERNEL, what):
                    run()
                return
        run()

    @contextlib.contextmanager
    def _timed(self, stream: _Stream, kind: str, name: str) -> Iterator[None]:
        """Mark `stream` around the work enqueued in the block (CUDA: device-time markers)."""
        begin = self.mark(stream)
        yield
        self._span(stream, kind, name, begin, self.mark(stream))

    @contextlib.contextmanager
    def harness_work(self) -> Iterator[None]:
        """Kernels launched in the block are the harness's own (poisoning, observing), not the
        work under test: their timeline spans say so, so a reader does not take them for it."""
        self._own = True
        try:
            yield
        finally:
            self._own = False

    def _kernel_span(self, touches_pools: bool) -> str:
        """The timeline kind of a kernel span."""
        if self._own:
            return SpanKind.HARNESS
        return SpanKind.ACCESS if touches_pools else SpanKind.KERNEL

    def mark(self, stream: _Stream, reuse: Any = None) -> Any:
        """A timing marker on `stream`: where work enqueued next could start. Read it with
        `marker_us` after a synchronize (device time on CUDA, virtual time on the simulator).
        `reuse`: a marker from an earlier call, read already, that may be recorded again (CUDA
        then makes no new event)."""
        return None

    @abc.abstractmethod
    def capture(self, fn: Callable[[], None], *, warmup: int = 2) -> Graph:
        """Warm `fn` up, then capture it into a graph on a side stream."""

    @abc.abstractmethod
    def synchronize(self, timeout_s: float = 30.0) -> None:
        """Wait for all streams; raise ReplayTimeout instead of hanging."""

    def drop_stuck_work(self) -> None:  # noqa: B027 - a real device has nothing it can drop
        """A scenario ended early: the work it left queued runs where it can, and what never can is
        dropped, so that the next scenario does not wait behind it. Only the simulator can drop
        work; on a real device work that never runs is a hung stream (`ReplayTimeout`)."""

    def _synchronized(self) -> None:
        """All work enqueued so far has finished (a synchronize returned): the op list says so, and
        each flag now holds what its last write left."""
        for flags in list(self._flag_sets):
            flags.values.settle()
        self._note(HostSync())

    def join(self, stream: _Stream) -> None:
        """Later work on `stream` waits for all work enqueued so far on every stream the harness
        made: a device-side synchronize, for that stream only (the host does not block)."""
        for other in self._made_streams():
            if other is not stream:
                event = self._join_events.get(other)
                if event is None:
                    event = self._join_events[other] = self.Event()
                event.record(other)
                stream.wait_event(event)

    @abc.abstractmethod
    def _made_streams(self) -> Sequence[_Stream]:
        """The streams made with `Stream()` that are still in use, in the order they were made."""

    @abc.abstractmethod
    def empty_host(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """Host memory the device copies from asynchronously (pinned on CUDA)."""

    def memory(self) -> Memory | None:
        """Where this device keeps its tensors: what the process holds there and what it could still
        take (None: this platform does not say)."""
        return None

    def describe(self) -> dict:
        """Versions and names for reports."""
        return {"device": self.name, "torch": torch.__version__}

    def _captured(self, graph: _G) -> _G:
        """Keep a new graph findable by its id (for `graph_source`)."""
        self._graphs[graph.id] = graph
        return graph

    def graph_source(self, trace: Trace) -> GraphSource:
        """The models of the graphs `trace` replays, for the graph check (`harness.records.graph_model`)."""
        source = GraphSource()
        for gid in dict.fromkeys(op.graph for op in trace.ops if isinstance(op, Replay)):
            graph = self._graphs.get(gid)
            if graph is None:
                continue
            try:
                source.models[gid] = graph.model()
            except GraphUnavailable as e:
                source.unavailable = str(e)
        return source

    def _replayed(self, graph: Graph) -> None:
        """Trace a replay of `graph` on the current stream (nothing when not tracing)."""
        if self._trace is not None and self._capture is None:
            self._trace.add(Replay(self.current_stream().id, graph.id, tuple(graph.body)))

    def _saw(self, event: _Event) -> None:
        """The host saw `event` complete: later host work is ordered after it."""
        if self.recording:
            self._note(HostWait(event.id))


def dtype_of(name: str) -> torch.dtype:
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[str(name)]
