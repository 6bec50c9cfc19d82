"""A deterministic CPU model of CUDA stream semantics in virtual time.

Compute runs on CPU tensors, in program order, as the Python that issues it
runs. Each stream keeps a virtual clock (microseconds) and a vector clock. An
async copy does not touch its destination when it is enqueued: it is pending,
with a modelled landing time. When the model announces a pool access
(`Device.access`), each pending copy to that region is applied first if it
happens-before the access (stream order, event waits, host syncs) or has landed
by the accessing stream's clock; otherwise the kernel reads what is there (the
poison), and the copy lands later, clobbering anything written meanwhile.

Graph replay re-runs the captured Python with Python-level waits ignored, as a
real replay runs none of them; only waits on external events (captured as graph
nodes) are honoured. A wait on a plain event during capture fails, as it does
under CUDA (`cudaErrorStreamCaptureInvalidated`).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

import torch

from harness.records.clocks import Clock, Stamp, StreamClocks
from harness.devices.base import Device, Event, Gate, Graph, Stream, _Capture
from harness.records.errors import HarnessError, InputError
from harness.records.trace import Copy, Delay, Hold, HostSync, HostWait, Record, Region, Wait


@dataclass(frozen=True)
class SimCosts:
    """The simulator's cost model; every constant can be set from the command line.

    bandwidth_gbps: pinned host-to-device copy bandwidth (55 GB/s measured on an H200).
    launch_us:      host time to enqueue one op outside a graph.
    replay_us:      host time to launch one graph replay.
    access_us:      device time of the work around one pool access (a layer's core).
    """

    bandwidth_gbps: float = 55.0
    launch_us: float = 5.0
    replay_us: float = 10.0
    access_us: float = 20.0

    @classmethod
    def from_settings(cls, settings: Sequence[str], source: str = "--sim-cost") -> "SimCosts":
        """`KEY=VALUE` strings (from the command line) over the defaults."""
        names = [f.name for f in fields(cls)]
        values = {}
        for item in settings:
            key, sep, text = item.partition("=")
            if key not in names:
                raise InputError(source, key or item, f"unknown cost; valid: {', '.join(names)} (as KEY=VALUE)")
            try:
                value = float(text) if sep else float("nan")
            except ValueError:
                value = float("nan")
            if not value > 0 or value == float("inf"):
                raise InputError(source, key, f"expected a positive number, got '{text}'")
            values[key] = value
        return cls(**values)


# While a gate holds a stream, its work is placed at HELD and later in virtual time
# (far past any real run); releasing the gate shifts everything placed there back to
# the release time. One uniform shift is exact: whatever depends on held work was
# placed after it through the same max(), so every such time moves together.
HELD = 1e12
_HELD_FROM = HELD / 2  # a time at or past this still waits on a held gate


def _is_held(t: float | None) -> bool:
    return t is not None and t >= _HELD_FROM


class CaptureInvalidated(HarnessError):
    """A plain event was waited on inside a capture (CUDA invalidates the capture)."""


class SimStream(Stream):
    def __init__(self, device: "SimDevice", name: str):
        self._device = device
        self.id = device._new_id()
        self.name = name
        self.clock = 0.0  # virtual microseconds: when this stream's last op ends

    def wait_event(self, event: Event) -> None:
        self._device._wait(self, event)  # type: ignore[arg-type]


class SimEvent(Event):
    def __init__(self, device: "SimDevice", external: bool):
        self._device = device
        self.id = device._new_id()
        self.external = external
        self.time: float | None = None  # virtual time of completion; None: never recorded
        self.clock: Clock | None = None  # the stream clock it carries; None: never recorded

    def record(self, stream: Stream | None = None) -> None:
        self._device._record(self, stream or self._device.current_stream())  # type: ignore[arg-type]

    def query(self) -> bool:
        return self.time is None or self.time <= self._device.host_clock

    def synchronize(self) -> None:
        if _is_held(self.time):
            self._device._open_gates()
        if self.time is not None:
            self._device._advance_host(self.time)


@dataclass
class _Pending:
    dst: torch.Tensor
    src: torch.Tensor
    region: Region
    stamp: Stamp  # its place in the stream order, for happens-before
    lands: float  # virtual time it lands


class SimGate(Gate):
    """A gate in virtual time: see HELD. Its watchdog fires when the host would block on it."""

    mode = "simulated"

    def __init__(self, device: "SimDevice", timeout_s: float):
        self._device = device
        self.id = device._new_id()
        self.timeout_s = timeout_s
        self.timed_out = False
        self._held_from: float | None = None  # virtual time the held stream reached the gate

    @property
    def held(self) -> bool:
        return self._held_from is not None

    def hold(self) -> None:
        if self.held:
            raise HarnessError("gate held twice without a release")
        stream = self._device.current_stream()
        with self._device._timed(stream, "gate", "gate {}", self.id):
            self._held_from = self._device._launch(stream, 0.0)
            stream.clock = max(stream.clock, HELD)
        self._device._gates.append(self)
        self._device._note(Hold(stream.id, self.id))

    def release(self) -> None:
        if not self.held:
            return
        start = max(self._held_from, self._device.host_clock)
        self._held_from = None
        self._device._gates.remove(self)
        self._device._shift_held(HELD - start)

    def expire(self) -> None:
        """The watchdog: the host would have blocked on held work until the timeout."""
        self._device.host_clock += self.timeout_s * 1e6
        self.timed_out = True
        self.release()


class SimGraph(Graph):
    def __init__(self, device: "SimDevice", graph_id: int, fn: Callable[[], None], body: list):
        self._device = device
        self.id = graph_id
        self._fn = fn
        self.body = body

    def replay(self) -> None:
        self._device._replay(self)


class SimDevice(Device):
    name = "sim"
    torch_device = torch.device("cpu")

    def __init__(self, costs: SimCosts | None = None):
        super().__init__()
        self.costs = costs or SimCosts()
        self.host_clock = 0.0
        self.clocks = StreamClocks()
        # Weak: a scenario's streams go with its bench (see CudaDevice), so a long run stays fast.
        self._streams: weakref.WeakSet[SimStream] = weakref.WeakSet()
        self._pending: list[_Pending] = []
        self._replaying = False  # re-running a graph's Python: only graph-node waits count
        self._gates: list[SimGate] = []  # gates holding a stream now
        self._held_events: list[SimEvent] = []  # events placed in held time
        self._held_marks: list[list[float]] = []  # timeline markers placed in held time
        self._stack: list[SimStream] = [self.Stream("default")]

    # ---- device_module surface -------------------------------------------
    def Stream(self, name: str) -> SimStream:  # noqa: N802
        s = SimStream(self, name)
        self._streams.add(s)
        self._name_stream(s)
        return s

    def Event(self, *, external: bool = False) -> SimEvent:  # noqa: N802
        return SimEvent(self, external)

    def current_stream(self) -> SimStream:
        return self._stack[-1]

    @contextlib.contextmanager
    def stream(self, stream: Stream):
        self._stack.append(stream)  # type: ignore[arg-type]
        self._name_stream(stream)
        try:
            yield stream
        finally:
            self._stack.pop()

    # ---- time ---------------------------------------------------------------
    def _launch(self, stream: SimStream, duration: float) -> float:
        """Enqueue `duration` of work on `stream`; returns its start time."""
        if self._replaying:
            start = stream.clock  # inside a replay the host launched everything at once
        else:
            start = max(stream.clock, self.host_clock)
            self.host_clock += self.costs.launch_us
        stream.clock = start + duration
        return start

    def _advance_host(self, t: float) -> None:
        self.host_clock = max(self.host_clock, t)
        self._land(lambda p: p.lands <= self.host_clock)

    def _shift_held(self, shift: float) -> None:
        """Move everything placed in held time back by `shift` (a gate opened)."""
        if shift <= 0:
            return
        for st in self._streams:
            if _is_held(st.clock):
                st.clock -= shift
        for p in self._pending:
            if _is_held(p.lands):
                p.lands -= shift
        for e in self._held_events:
            if _is_held(e.time):
                e.time -= shift
        for m in self._held_marks:
            if _is_held(m[0]):
                m[0] -= shift
        self._held_events = [e for e in self._held_events if _is_held(e.time)]
        self._held_marks = [m for m in self._held_marks if _is_held(m[0])]

    def _open_gates(self) -> None:
        """The host would block on work behind a gate: each gate's watchdog opens it."""
        while self._gates:
            self._gates[0].expire()

    def gate(self, timeout_s: float) -> SimGate:
        return SimGate(self, timeout_s)

    def host_wait(self, event: Event, timeout_s: float) -> bool:
        t = event.time  # type: ignore[attr-defined]
        if t is not None and t > self.host_clock:
            if _is_held(t) or t > self.host_clock + timeout_s * 1e6:
                self.host_clock += timeout_s * 1e6
                return False
            self._advance_host(t)
        self.clocks.host_wait(event.clock)  # type: ignore[attr-defined]
        self._note(HostWait(event.id))
        return True

    # ---- timeline markers: virtual times, shifted with held work ----------------
    def mark(self, stream: Stream, *, end: bool = True):
        t = stream.clock if end else max(stream.clock, self.host_clock)  # type: ignore[attr-defined]
        m = [t]
        if _is_held(t):
            self._held_marks.append(m)
        return m

    def marker_us(self, marker) -> float | None:
        return None if marker is None or _is_held(marker[0]) else marker[0]

    # ---- events ---------------------------------------------------------------
    def _record(self, event: SimEvent, stream: SimStream) -> None:
        with self._timed(stream, "record", "record e{}", event.id):
            self._launch(stream, 0.0)
        event.time = stream.clock
        if _is_held(event.time):
            self._held_events.append(event)
        event.clock = self.clocks.record(stream.id)
        self._note(Record(stream.id, event.id))

    def _wait(self, stream: SimStream, event: SimEvent) -> None:
        if self._replaying and not event.external:
            return  # a Python-level wait: a real replay never runs it
        if self.capturing and not event.external:
            raise CaptureInvalidated(
                "a plain event was waited on during graph capture "
                "(CUDA: cudaErrorStreamCaptureInvalidated); use an external event"
            )
        self._note(Wait(stream.id, event.id, in_graph=self.capturing))
        with self._timed(stream, "wait", "wait e{}", event.id):
            self._launch(stream, 0.0)
            self.clocks.wait(stream.id, event.clock)  # a never-recorded event orders nothing
            if event.time is not None:
                stream.clock = max(stream.clock, event.time)

    # ---- copies, delays, accesses -----------------------------------------------
    def copy_async(self, dst: torch.Tensor, src: torch.Tensor, region: Region) -> None:
        stream = self.current_stream()
        nbytes = src.numel() * src.element_size()
        with self._timed(stream, "copy", "H2D {}", region):
            start = self._launch(stream, 0.0)
            duration = nbytes / (self.costs.bandwidth_gbps * 1e3)  # GB/s -> bytes/us
            stream.clock = start + duration
        self._pending.append(_Pending(dst, src, region, self.clocks.stamp(stream.id), stream.clock))
        self._note(Copy(stream.id, region))

    def delay(self, us: float) -> None:
        with self._timed(None, "delay", "delay {:g}us", us):
            self._launch(self.current_stream(), us)
        self._note(Delay(self.current_stream().id, us))

    def access(self, reads=(), writes=(), what: str = "") -> None:
        super().access(reads, writes, what)
        stream = self.current_stream()
        with self._timed(stream, "access", "{}", what or "access"):
            start = self._launch(stream, self.costs.access_us)
        regions = tuple(reads) + tuple(writes)

        def visible(p: _Pending) -> bool:
            if not any(p.region.overlaps(r) for r in regions):
                return False
            return self.clocks.ordered(stream.id, p.stamp) or p.lands <= start

        self._land(visible)

    def _land(self, which: Callable[[_Pending], bool]) -> None:
        """Apply the pending copies `which` selects, in the order they were enqueued."""
        keep = []
        for p in self._pending:
            if which(p):
                p.dst.copy_(p.src)
            else:
                keep.append(p)
        self._pending = keep

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
        return SimGraph(self, graph_id, fn, body)

    def _replay(self, graph: SimGraph) -> None:
        self._replayed(graph)
        stream = self.current_stream()
        stream.clock = max(stream.clock, self.host_clock)
        self.host_clock += self.costs.replay_us
        prev_trace, self._trace = self._trace, None  # the replay is traced as one op
        self._replaying = True
        try:
            with self._timed(stream, "replay", "replay graph {}", graph.id):
                graph._fn()
        finally:
            self._replaying = False
            self._trace = prev_trace

    # ---- host ----------------------------------------------------------------
    def synchronize(self, timeout_s: float = 30.0) -> None:
        # Virtual time always finishes (a held gate's watchdog opens it); the timeout
        # matters only on real devices.
        self._open_gates()
        self._advance_host(max(s.clock for s in self._streams))
        self._land(lambda p: True)
        self.clocks.host_sync()
        self.clocks.forget({st.id for st in self._streams})
        self._note(HostSync())

    def empty_host(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(tuple(shape), dtype=dtype)

    def describe(self) -> dict:
        d = super().describe()
        d["costs"] = self.costs.__dict__.copy()
        return d
