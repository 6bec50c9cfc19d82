"""A deterministic CPU model of CUDA stream semantics in virtual time.

Nothing runs when Python enqueues it. Every op goes into its stream's queue with
the host's virtual time at enqueue (each launch costs the host `launch_us`), and a
scheduler runs the queues in virtual time, as a GPU would:

- an op starts when its stream is free, the host has enqueued it, and what it
  depends on has happened (the latest record of an event it waits on, the host's
  release of a gate it holds on);
- a kernel runs its closure at its start, and takes `access_us` (pool-touching)
  or `kernel_us` of device time;
- a copy lands (its destination is written) at its end, after its latency
  and `nbytes / bandwidth`; a copy enqueued later that lands earlier lands first;
- a record completes its event at its start.

The scheduler runs lazily, only as far as the host has got: when the host blocks
(synchronize, an event's synchronize, a bounded host wait) or polls (`query`,
which costs `poll_us` of host time, so a polling loop moves on). Work that has
run never started later than the host clock, so anything the host enqueues next
starts after it, and a read can never see a write from its future.

Work that can never run (a wait on a flag value nothing writes, on an event whose
record is queued behind such a wait) is an error when the host would block on it,
naming the stream, its wait and what that waits for; the stuck work is dropped
then, so that it ends only the scenario that enqueued it.

Capture records the op list (harness.records.trace) and runs nothing; a replay
enqueues that list on the replay stream and runs none of the Python that built
it. Only waits captured as graph nodes (on external events) order a replay; a
wait on a plain event during capture fails, as CUDA's does
(`cudaErrorStreamCaptureInvalidated`).
"""

from __future__ import annotations

import bisect
import contextlib
import heapq
import math
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from harness.devices.base import (
    Device,
    Event,
    Flags,
    FlagValues,
    Gate,
    Graph,
    Memory,
    Stream,
    _Capture,
    _Event,
    _Stream,
)
from harness.devices.host_memory import host_memory
from harness.records.device_settings import SimCosts  # the cost model, torch-free for the CLI's help
from harness.records.errors import CaptureInvalidated, HarnessError
from harness.records.graph_model import GraphModel, chain_model
from harness.records.trace import (
    Collective,
    Copy,
    CopyToHost,
    Delay,
    FlagWait,
    FlagWrite,
    Hold,
    Kernel,
    Op,
    Record,
    Region,
    SpanKind,
    Wait,
    flag_reached,
)


@dataclass(eq=False)
class _Mark:
    """A point the scheduler waits for: an event's record, or a gate's release."""

    time: float | None = None  # virtual microseconds; None: not happened yet
    what: str = ""  # "event e5", "gate g3": for the message of work that can never run
    stream: SimStream | None = None  # an event's: the stream its record is queued on

    def at(self, earliest: float) -> float | None:
        """When work that could start at `earliest` may start: once this has happened."""
        return None if self.time is None else max(earliest, self.time)


@dataclass(eq=False)
class _Flag:
    """One flag's values in virtual time: (time, order, value) of every write that has run, in
    time order, from its initial value at the start of time."""

    writes: list[tuple[float, int, int]]
    id: int = 0


@dataclass(eq=False)
class _Reached:
    """What a value wait waits for: the flag to reach `target` (GEQ, as cuStreamWaitValue32)."""

    flag: _Flag
    target: int

    def at(self, earliest: float) -> float | None:
        """The first time from `earliest` on at which the flag holds a value that reaches the target,
        among the writes that have run; None: not yet (a write still to come may get there)."""
        writes = self.flag.writes
        i = bisect.bisect_right(writes, (earliest, math.inf)) - 1
        if flag_reached(writes[i][2], self.target):
            return earliest
        return next((t for t, _, v in writes[i + 1:] if flag_reached(v, self.target)), None)


@dataclass(eq=False)
class _Work:
    """One op in a stream's queue."""

    seq: int  # enqueue order: ties in virtual time go to the earlier op
    ready: float  # the host's virtual time at enqueue: the op cannot start before it
    duration: float
    after: _Mark | _Reached | None = None  # it starts once this has happened
    # Its effect, called with its start time; a collective's returns when it ends (it waits for the
    # other ranks), any other's None (it ends `duration` after its start).
    run: Callable[[float], float | None] | None = None
    writes: tuple[tuple[_Flag, ...], int] | None = None  # a value write's flags and value
    records: _Mark | None = None  # a record's: the mark it completes
    start: float | None = None  # set once it has run
    end: float | None = None


class SimStream(Stream):
    _device: SimDevice

    def __init__(self, device: SimDevice, name: str):
        self._device = device
        self.id = device._new_id()
        self.name = name
        self.queue: deque[_Work] = deque()
        self.free = 0.0  # virtual time its last run op ended

    def wait_event(self, event: Event) -> None:
        self._device._wait(self, event)  # type: ignore[arg-type]


class SimEvent(Event):
    _device: SimDevice

    def __init__(self, device: SimDevice, external: bool, created: bool = True):
        self._device = device
        self.id = device._new_id()
        self.external = external
        self.latest: _Mark | None = None  # its latest record that has run or is queued; None: none
        # As on CUDA: an external event is recorded once when made (unless asked not to be); a
        # record completed at once needs no mark, as a wait on it orders nothing.
        self._created = external and created

    @property
    def created(self) -> bool:
        return self._created

    def record(self, stream: Stream | None = None) -> None:
        self._device._record(self, stream or self._device.current_stream())  # type: ignore[arg-type]

    def query(self) -> bool:
        return self._device._query(self)

    def synchronize(self) -> None:
        self._device._block_on(self)


class SimGate(Gate):
    """A gate in virtual time: held work waits for the host's release; the watchdog fires when
    the host would have blocked on the held work, or polled past the timeout, in virtual time."""

    mode = "simulated"

    def __init__(self, device: SimDevice, timeout_s: float):
        self._device = device
        self.id = device._new_id()
        self.timeout_s = timeout_s
        self.timed_out = False
        self._open: _Mark | None = None  # the release a held stream waits for
        self._held_at = 0.0  # host time of the hold

    @property
    def held(self) -> bool:
        return self._open is not None

    def hold(self) -> None:
        if self.held:
            raise HarnessError("gate held twice without a release")
        dev = self._device
        self._open, self._held_at = _Mark(what=f"gate g{self.id}"), dev.host_clock
        stream = dev.current_stream()
        dev._note(Hold(stream.id, self.id))
        dev._enqueue(stream, 0.0, SpanKind.GATE, f"gate {self.id}", after=self._open)
        dev._gates.append(self)

    def release(self) -> None:
        if self._open is None:
            return
        self._open.time = self._device.host_clock
        self._open = None
        self._device._gates.remove(self)

    def expire(self) -> None:
        """The watchdog: the host was held up past the timeout, and the gate opens."""
        dev = self._device
        dev.host_clock = max(dev.host_clock, self._held_at + self.timeout_s * 1e6)
        self.timed_out = True
        self.release()


class SimFlags(Flags):
    def __init__(self, device: SimDevice, count: int, initial: int):
        self._device = device
        self.initial = initial
        self.ids = tuple(device._new_id() for _ in range(count))
        self.flags = [_Flag([(-math.inf, 0, initial)], fid) for fid in self.ids]
        self.values = FlagValues(count, initial)
        device._made_flags(self)

    def write(self, index: int, value: int) -> None:
        self._device._flag_write(self, (index,), value)

    def write_all(self, value: int) -> None:
        self._device._flag_write(self, tuple(range(len(self.ids))), value)

    def wait(self, index: int, value: int) -> None:
        self._device._flag_wait(self, index, value)


class SimGraph(Graph):
    def __init__(self, device: SimDevice, graph_id: int, body: list[Op]):
        self._device = device
        self.id = graph_id
        self.body = tuple(body)

    def replay(self) -> None:
        self._device._replay(self)

    def model(self) -> GraphModel:
        """A capture on one stream, as the simulator's is: its op list, one node after another."""
        return chain_model(self.id, self.body, "sim")


class SimDevice(Device):
    name = "sim"
    torch_device = torch.device("cpu")
    clock = "virtual"

    def __init__(self, costs: SimCosts | None = None):
        super().__init__()
        self.costs = costs or SimCosts()
        self.host_clock = 0.0
        # Weak: a scenario's streams go with its testbed, so a long run stays fast.
        self._streams: weakref.WeakSet[SimStream] = weakref.WeakSet()
        self._busy: set[SimStream] = set()  # streams with queued work: kept alive until it has run
        self._landings: list[tuple[float, int, torch.Tensor, torch.Tensor]] = []  # a heap
        self._seq = 0
        self._gates: list[SimGate] = []  # gates holding a stream now
        self._in_replay: float | None = None  # while a replay enqueues: its launch time
        self._stack: list[SimStream] = [self.Stream("default")]

    # ---- device_module surface -------------------------------------------
    def Stream(self, name: str) -> SimStream:  # noqa: N802
        s = SimStream(self, name)
        self._streams.add(s)
        self._name_stream(s)
        return s

    def Event(self, *, external: bool = False, created: bool = True) -> SimEvent:  # noqa: N802
        return SimEvent(self, external, created)

    def Flags(self, count: int, initial: int) -> SimFlags:  # noqa: N802
        return SimFlags(self, count, initial)

    def current_stream(self) -> SimStream:
        return self._stack[-1]

    @contextlib.contextmanager
    def stream(self, stream: _Stream) -> Iterator[_Stream]:
        self._stack.append(stream)  # type: ignore[arg-type]
        self._name_stream(stream)
        try:
            yield stream
        finally:
            self._stack.pop()

    # ---- enqueue ------------------------------------------------------------------
    def _enqueue(
        self, stream: SimStream, duration: float, kind: str, name: str, *,
        after: _Mark | _Reached | None = None, run: Callable[[float], float | None] | None = None, span: bool = True,
        writes: tuple[tuple[_Flag, ...], int] | None = None, records: _Mark | None = None,
    ) -> _Work | None:
        """Queue one op on `stream` at the host's time (or the replay's launch); None when captured."""
        if self.capturing:
            return None
        if self._in_replay is not None:
            ready = self._in_replay  # the host launched the whole graph at once
        else:
            ready = self.host_clock
            self.host_clock += self.costs.launch_us
        self._seq += 1
        work = _Work(self._seq, ready, duration, after, run, writes, records)
        stream.queue.append(work)
        self._busy.add(stream)
        if span and self.timing:
            self._span(stream, kind, name, ("start", work), ("end", work))
        return work

    def mark(self, stream: _Stream, reuse: Any = None) -> Any:
        work = self._enqueue(stream, 0.0, "", "", span=False)  # type: ignore[arg-type]
        return None if work is None else ("start", work)

    def marker_us(self, marker: Any) -> float | None:
        if marker is None:
            return None
        which, work = marker
        return work.start if which == "start" else work.end

    def _record(self, event: SimEvent, stream: SimStream) -> None:
        event._created = True  # CUDA creates an event at its first record, captured or not
        self._note(Record(stream.id, event.id, event))
        mark = _Mark(what=f"event e{event.id}", stream=stream)

        def complete(t: float) -> None:
            mark.time = t

        if self._enqueue(stream, 0.0, SpanKind.RECORD, f"record e{event.id}", run=complete, records=mark) is not None:
            event.latest = mark

    def _wait(self, stream: SimStream, event: SimEvent) -> None:
        if self.capturing and not event.created:
            return  # torch enqueues no wait on an event CUDA has not created: the graph gets no node
        if self.capturing and not event.external:
            raise CaptureInvalidated(
                "a plain event was waited on during graph capture "
                "(CUDA: cudaErrorStreamCaptureInvalidated); use an external event"
            )
        self._note(Wait(stream.id, event.id, self.capturing, event))
        # A wait on a never-recorded event orders nothing, as CUDA completes it at once.
        self._enqueue(stream, 0.0, SpanKind.WAIT, f"wait e{event.id}", after=event.latest)

    def _flag_write(self, flags: SimFlags, which: tuple[int, ...], value: int, stream: SimStream | None = None) -> None:
        """A value write: the flags change when it runs, after everything earlier on its stream."""
        stream = stream or self.current_stream()
        self._note(FlagWrite(stream.id, tuple(flags.ids[i] for i in which), value, (flags, which)))
        self._flags_written(flags, which, value, stream)

        def write(t: float) -> None:
            for i in which:
                self._seq += 1
                bisect.insort(flags.flags[i].writes, (t, self._seq, value))

        self._enqueue(stream, 0.0, SpanKind.RECORD, f"write {value} to flags", run=write,
                      writes=(tuple(flags.flags[i] for i in which), value))

    def _flag_wait(self, flags: SimFlags, index: int, value: int, stream: SimStream | None = None) -> None:
        """A value wait: later work on the stream starts once the flag has reached `value`. Made during
        capture, it is a graph node (no external event needed)."""
        stream = stream or self.current_stream()
        self._note(FlagWait(stream.id, flags.ids[index], value, self.capturing, (flags, index)))
        self._enqueue(stream, 0.0, SpanKind.WAIT, f"wait flag f{flags.ids[index]} >= {value}",
                      after=_Reached(flags.flags[index], value))

    def copy_async(self, dst: torch.Tensor, src: torch.Tensor, region: Region, source: Region | None = None) -> None:
        nbytes = src.numel() * src.element_size()
        self._enqueue_op(Copy(self.current_stream().id, region, nbytes, (dst, src), source))

    def copy_to_host(self, dst: torch.Tensor, src: torch.Tensor, src_region: Region, dst_region: Region) -> None:
        nbytes = src.numel() * src.element_size()
        self._enqueue_op(CopyToHost(self.current_stream().id, src_region, dst_region, nbytes, (dst, src)))

    def host_write(self, fn, regions, what: str = "") -> None:
        # The device has run as far as the host's time: a copy that landed by now read the
        # old bytes, one still pending will read the new ones, as a DMA does.
        self._run_until(self.host_clock)
        self.host_clock += self.costs.launch_us
        super().host_write(fn, regions, what)

    def delay(self, us: float) -> None:
        if us > 0:
            self._enqueue_op(Delay(self.current_stream().id, us))

    def launch(self, fn, reads=(), writes=(), what: str = "") -> None:
        self._enqueue_op(Kernel(self.current_stream().id, tuple(reads), tuple(writes), what, fn))

    def all_reduce(self, tensor: torch.Tensor, group, what: str = "all-reduce") -> None:
        """The all-reduce as one op of the stream: when the simulator starts it (at this rank's
        arrival), it swaps data and arrival times with the other ranks through gloo, and it ends
        once the last rank has arrived (`RankGroup.exchange`). A replay of a graph that captured it
        exchanges again: no Python of the model runs, only the collective's own."""

        def exchange(start: float) -> float:
            return group.exchange(tensor, start)

        self._enqueue_op(Collective(self.current_stream().id, what=what, fn=lambda: None, exchange=exchange))

    def _enqueue_op(self, op: Copy | CopyToHost | Delay | Kernel) -> None:
        """Note and queue a copy, delay or kernel on the current stream (or on a replay's)."""
        self._note(op)
        stream = self.current_stream()
        if isinstance(op, (Copy, CopyToHost)):
            # Both directions: the copy reads its source and writes its destination as it lands.
            assert op.tensors is not None
            dst, src = op.tensors
            us = self.costs.copy_latency_us + op.nbytes / (self.costs.bandwidth_gbps * 1e3)  # GB/s -> bytes/us

            def lands(t: float) -> None:
                self._seq += 1  # a tie in landing time goes to the copy that started first
                heapq.heappush(self._landings, (t + us, self._seq, dst, src))

            kind, name = ((SpanKind.COPY, f"H2D {op.dst}") if isinstance(op, Copy)
                          else (SpanKind.D2H, f"D2H {op.src}"))
            self._enqueue(stream, us, kind, name, run=lands)
        elif isinstance(op, Delay):
            self._enqueue(stream, op.us, SpanKind.DELAY, f"delay {op.us:g}us")
        elif isinstance(op, Collective) and op.exchange is not None:
            exchange = op.exchange

            def collect(t: float) -> float:
                self._land_until(t)
                return exchange(t)

            self._enqueue(stream, 0.0, SpanKind.KERNEL, op.what or "all-reduce", run=collect)
        else:
            cost = self.costs.access_us if op.touches_pools else self.costs.kernel_us
            fn = op.fn
            assert fn is not None

            def run(t: float) -> None:
                self._land_until(t)  # a kernel sees every copy landed by its start
                fn()

            self._enqueue(stream, cost, self._kernel_span(op.touches_pools), op.what or "kernel", run=run)

    # ---- the scheduler ---------------------------------------------------------------
    def _next(self) -> tuple[float, SimStream] | None:
        """The op that starts first among the streams' heads, and its start; None if all wait."""
        best: tuple[float, int, SimStream] | None = None
        for s in self._busy:
            w = s.queue[0]
            earliest = max(s.free, w.ready)
            start = w.after.at(earliest) if w.after is not None else earliest
            if start is None:
                continue  # an event not recorded yet, a gate not released, a flag not reached yet
            if best is None or (start, w.seq) < best[:2]:
                best = (start, w.seq, s)
        return None if best is None else (best[0], best[2])

    def _step(self, limit: float) -> bool:
        """Run the next op if it starts by `limit`; False when none can."""
        found = self._next()
        if found is None or found[0] > limit:
            return False
        start, stream = found
        work = stream.queue.popleft()
        if not stream.queue:
            self._busy.discard(stream)
        work.start, work.end = start, start + work.duration
        stream.free = work.end
        if work.run is not None:
            ended = work.run(start)
            if ended is not None:  # a collective: it ended once the last rank had arrived
                work.end = stream.free = max(start, ended)
        return True

    def _run_until(self, limit: float) -> None:
        """Run every op that starts by `limit`, and land every copy that lands by then."""
        while self._step(limit):
            pass
        self._land_until(limit)

    def _land_until(self, t: float) -> None:
        while self._landings and self._landings[0][0] <= t:
            _, _, dst, src = heapq.heappop(self._landings)
            dst.copy_(src)

    def _pending(self) -> bool:
        return bool(self._busy)

    # ---- work that can never run ------------------------------------------------------
    def _run_all(self) -> bool:
        """Run everything that can run, opening held gates as their watchdogs would; False when
        work is left that nothing can start (waits on nothing that comes)."""
        while True:
            self._run_until(math.inf)
            if not self._pending():
                return True
            if not self._gates:
                return False
            self._gates[0].expire()

    def _never_runs(self, who: str, after: _Mark | _Reached | None) -> HarnessError:
        """The error for work that can never run, named by what it waits for; that work is dropped."""
        text = f"work on the simulator can never run: {who} {self._blocked(after, set())}"
        self._drop()
        return HarnessError(text)

    def _drop(self) -> None:
        """Drop all queued work (none of it can run), and the streams it kept alive.

        Once the host would block on it forever the scenario that enqueued it is over, and what it
        left queued could only hold up the next one's synchronizes. A dropped record counts as
        done now, so that nothing made later waits forever on an event of it.
        """
        for stream in self._busy:
            for work in stream.queue:
                if work.records is not None:
                    work.records.time = self.host_clock
            stream.queue.clear()
        self._busy.clear()

    def _blocked(self, after: _Mark | _Reached | None, seen: set[SimStream]) -> str:
        """What a stuck wait waits for, in words, following it to what nothing can release: an
        event's record queued behind another stuck wait, a value write queued behind one, a flag
        value nothing queued writes."""
        if isinstance(after, _Reached):
            flag, target = after.flag, after.target
            wait = f"until flag f{flag.id} >= {target}"
            for stream in sorted(self._busy, key=lambda s: s.id):
                for work in stream.queue:
                    if work.writes is not None and flag in work.writes[0] and flag_reached(work.writes[1], target):
                        return (f"{wait}, whose write of {work.writes[1]} is queued on stream '{stream.name}' "
                                f"behind {self._behind(stream, seen)}")
            return (f"{wait}, which nothing can release: f{flag.id} holds {flag.writes[-1][2]}, and no write of it "
                    f"queued on any stream reaches {target}")
        if after is not None and after.stream is not None and after.stream.queue:
            return (f"on {after.what}, whose record is queued on stream '{after.stream.name}' behind "
                    f"{self._behind(after.stream, seen)}")
        return f"on {after.what if after is not None else 'nothing'}, which nothing releases"

    def _behind(self, stream: SimStream, seen: set[SimStream]) -> str:
        """The stuck wait at the head of `stream`'s queue, in words."""
        if stream in seen:
            return "the wait above (they wait for each other)"
        return f"a wait {self._blocked(stream.queue[0].after, seen | {stream})}"

    def _stuck_head(self) -> SimStream:
        """The stream whose stuck wait to name: one no other stuck wait waits behind (the end of a
        chain, whose words follow it to its start), the one enqueued first among those."""
        behind = set()
        for stream in self._busy:
            after = stream.queue[0].after
            if isinstance(after, _Mark) and after.stream is not None:
                behind.add(after.stream)
            elif isinstance(after, _Reached):
                behind |= {s for s in self._busy for w in s.queue
                           if w.writes is not None and after.flag in w.writes[0]}
        ends = [s for s in self._busy if s not in behind] or list(self._busy)
        return min(ends, key=lambda s: s.queue[0].seq)

    def drop_stuck_work(self) -> None:
        """A scenario ended early: run what it left queued that can run, drop what never can."""
        if not self._run_all():
            self._drop()

    # ---- the host ---------------------------------------------------------------------
    def _query(self, event: SimEvent) -> bool:
        self._run_until(self.host_clock)
        mark = event.latest
        done = mark is None or (mark.time is not None and mark.time <= self.host_clock)
        self.host_clock += self.costs.poll_us  # a polling host moves on
        for gate in [g for g in self._gates if self.host_clock > g._held_at + g.timeout_s * 1e6]:
            gate.expire()
        if done:
            self._saw(event)
        return done

    def _until_done(self, mark: _Mark, limit: float) -> bool:
        """Run ops in time order until `mark` happens (True) or the next op starts past `limit`."""
        while mark.time is None:
            if not self._step(limit):
                return False
        return True

    def _block_on(self, event: SimEvent) -> None:
        """event.synchronize(): the host blocks until the event completes (a gate's watchdog
        opens what would hold it forever)."""
        mark = event.latest
        if mark is not None:
            while not self._until_done(mark, math.inf):
                if not self._gates:
                    raise self._never_runs("the host waits", mark)
                self._gates[0].expire()
            self.host_clock = max(self.host_clock, mark.time or 0.0)
            self._land_until(self.host_clock)
        self._saw(event)

    def host_wait(self, event: _Event, timeout_s: float) -> bool:
        mark = event.latest  # type: ignore[attr-defined]
        deadline = self.host_clock + timeout_s * 1e6
        if mark is not None:
            if not self._until_done(mark, deadline) or (mark.time or 0.0) > deadline:
                self.host_clock = deadline
                self._run_until(deadline)
                return False
            self.host_clock = max(self.host_clock, mark.time or 0.0)
            self._land_until(self.host_clock)
        self._saw(event)
        return True

    def synchronize(self, timeout_s: float = 30.0) -> None:
        # Virtual time always finishes (a held gate's watchdog opens it) unless some work waits on
        # nothing that comes; the timeout matters only on real devices.
        if not self._run_all():
            head = self._stuck_head()
            raise self._never_runs(f"stream '{head.name}' waits", head.queue[0].after)
        ends = [s.free for s in self._streams]  # a stream gone had ended before these
        self.host_clock = max([self.host_clock, *ends])
        self._synchronized()

    def gate(self, timeout_s: float) -> SimGate:
        return SimGate(self, timeout_s)

    # ---- graphs ---------------------------------------------------------------
    def capture(self, fn: Callable[[], None], *, warmup: int = 2) -> SimGraph:
        side = self.Stream("capture")
        for _ in range(warmup):
            with self.stream(side):
                fn()
        graph_id = self._new_id()
        self._capture = _Capture(graph_id, [])
        try:
            with self.stream(side):
                fn()
        finally:
            body, self._capture = self._capture.body, None
        # The caller is ordered after the capture stream's warm-up work, as on CUDA.
        self.current_stream().wait_stream(side)
        return self._captured(SimGraph(self, graph_id, body))

    def _replay(self, graph: SimGraph) -> None:
        """Enqueue the captured op list on the current stream: no captured Python runs."""
        self._replayed(graph)
        stream = self.current_stream()
        launched = self.host_clock
        self.host_clock += self.costs.replay_us
        trace, self._trace = self._trace, None  # the replay is one op of the trace ...
        first = len(stream.queue)
        self._in_replay = launched
        try:
            for op in graph.body:
                self._enqueue_captured(stream, op)
        finally:
            self._in_replay = None
            self._trace = trace
        if self.timing and len(stream.queue) > first:  # ... and one span of the timeline
            works = list(stream.queue)[first:]
            self._span(stream, SpanKind.REPLAY, f"replay graph {graph.id}", ("start", works[0]), ("end", works[-1]))

    def _enqueue_captured(self, stream: SimStream, op: Op) -> None:
        with self.stream(stream):
            if isinstance(op, (Copy, CopyToHost, Delay, Kernel)):
                self._enqueue_op(op)
            elif isinstance(op, Wait):  # a graph node: on the event's latest record at launch
                self._enqueue(stream, 0.0, SpanKind.WAIT, f"wait e{op.event}", after=op.handle.latest)
            elif isinstance(op, Record):
                self._record(op.handle, stream)
            elif isinstance(op, FlagWrite):
                flags, which = op.handle
                self._flag_write(flags, which, op.value, stream)
            elif isinstance(op, FlagWait):
                flags, index = op.handle
                self._flag_wait(flags, index, op.value, stream)
            else:  # pragma: no cover - a capture holds only stream work
                raise HarnessError(f"cannot replay captured op {op!r}")

    def empty_host(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(tuple(shape), dtype=dtype)

    def _made_streams(self) -> Sequence[SimStream]:
        return sorted(self._streams, key=lambda s: s.id)

    def memory(self) -> Memory | None:
        return host_memory()

    def describe(self) -> dict:
        d = super().describe()
        d["costs"] = self.costs.__dict__.copy()
        return d
