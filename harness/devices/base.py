"""The small device interface that model, pools, load-back, runners and fences use.

It is shaped like the `device_module` a serving engine uses (`Event()`,
`current_stream()`, `stream(s)`, `event.record()`, `stream.wait_event(e)`), plus
the few things a harness needs on top: async copies that name the region they
write, a delay on a stream, graph capture and replay, pool-access annotations,
a bounded synchronize, and a trace of all of it.

Two implementations sit side by side: `cuda` (real streams and graphs) and
`sim` (a CPU model of stream semantics in virtual time).
"""

from __future__ import annotations

import abc
import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from harness.records.errors import HarnessError
from harness.records.trace import Access, HostWait, Op, Region, Replay, Span, Trace


class GateUnavailable(HarnessError):
    """No gate can be built here (the reason says why); a long delay stands in."""


class Stream(abc.ABC):
    id: int
    name: str

    @abc.abstractmethod
    def wait_event(self, event: "Event") -> None:
        """Later work on this stream waits until `event` has completed."""


class Event(abc.ABC):
    id: int
    external: bool  # may be waited on inside a captured graph

    @abc.abstractmethod
    def record(self, stream: Stream | None = None) -> None: ...

    def wait(self, stream: Stream | None = None) -> None:
        (stream or self._device.current_stream()).wait_event(self)

    @abc.abstractmethod
    def query(self) -> bool: ...

    @abc.abstractmethod
    def synchronize(self) -> None: ...

    _device: "Device"


class Gate(abc.ABC):
    """A host-released hold on a stream: the stream waits until the host opens it.

    A watchdog opens a gate that stays shut past its timeout and sets
    `timed_out`, so a forgotten release is an error in a result, never a hang.
    """

    id: int
    mode: str  # how it is built, for reports
    timed_out: bool = False

    @abc.abstractmethod
    def hold(self) -> None:
        """Later work on the current stream waits until `release()`."""

    @abc.abstractmethod
    def release(self) -> None: ...

    def close(self) -> None:
        """Open anything still held (nothing may stay blocked after a scenario)."""
        self.release()


class Graph(abc.ABC):
    id: int
    body: Sequence[Op]  # the ops captured into it, for the trace

    @abc.abstractmethod
    def replay(self) -> None:
        """Enqueue the captured work on the current stream. No Python runs in it."""


@dataclass
class _Capture:
    """What is being captured right now: the ops that will live in the graph."""

    graph_id: int
    body: list[Op]


class Device(abc.ABC):
    """Streams, events, copies, delays, graphs and a trace, on one device."""

    name: str
    torch_device: torch.device

    def __init__(self) -> None:
        self._next_id = 0
        self._trace: Trace | None = None
        self._marks: Trace | None = None  # where timed spans go (the trace, also inside a replay)
        self._capture: _Capture | None = None

    # ---- ids and tracing -------------------------------------------------
    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    @contextlib.contextmanager
    def tracing(self) -> Iterator[Trace]:
        """Record every op enqueued inside the block (costly: not for the hot loop)."""
        trace = Trace()
        self._trace = self._marks = trace
        try:
            yield trace
        finally:
            self._trace = self._marks = None

    @property
    def recording(self) -> bool:
        """True while tracing or capturing: only then is building trace records worth it."""
        return self._trace is not None or self._capture is not None

    def _note(self, op: Op) -> None:
        if self._capture is not None:
            self._capture.body.append(op)
        elif self._trace is not None:
            self._trace.add(op)

    def _name_stream(self, stream: Stream) -> None:
        if self._trace is not None:
            self._trace.stream_names[stream.id] = stream.name

    @property
    def capturing(self) -> bool:
        return self._capture is not None

    # ---- timeline of a traced replay ----------------------------------------
    def _timed(self, stream: Stream | None, kind: str, fmt: str, *args) -> contextlib.AbstractContextManager:
        """Time the ops enqueued inside the block on `stream` (None: the current one).

        This wraps every copy, wait and replay, so outside a traced replay it is one
        check and a shared no-op: no stream lookup, no name formatted (`fmt.format(*args)`
        runs only when traced). Host time in the replay loop shifts the race window.
        """
        if self._marks is None or self.capturing:
            return _UNTIMED
        return _TimedSpan(self, stream or self.current_stream(), kind, fmt.format(*args))

    def mark(self, stream: Stream, *, end: bool = True):
        """A timing mark on `stream` (device time on CUDA, virtual time on the simulator).

        `end=False` marks where the next work could start (on the simulator, the host
        may be later than the stream); read it with `marker_us` after a synchronize.
        """
        return None

    def marker_us(self, marker) -> float | None:
        return None

    def timeline(self, trace: Trace) -> list[Span]:
        """The timed spans of a trace, in microseconds from the first; call after a synchronize."""
        raw = [(sid, name, kind, self.marker_us(b), self.marker_us(e)) for sid, name, kind, b, e in trace.marks]
        raw = [r for r in raw if r[3] is not None and r[4] is not None]
        if not raw:
            return []
        t0 = min(r[3] for r in raw)
        names = trace.stream_names
        return [
            Span(names.get(sid, f"stream{sid}"), name, kind, round(b - t0, 3), round(max(e, b) - t0, 3))
            for sid, name, kind, b, e in raw
        ]

    # ---- gates -----------------------------------------------------------------
    def gate(self, timeout_s: float) -> Gate:
        """A gate for the load stream; raises GateUnavailable where none can be built."""
        raise GateUnavailable(f"the {self.name} device has no gate")

    def host_wait(self, event: Event, timeout_s: float) -> bool:
        """Block the host until `event` completes or `timeout_s` passes; True if it completed."""
        deadline = time.monotonic() + timeout_s
        while not event.query():
            if time.monotonic() > deadline:
                return False
            time.sleep(20e-6)
        self._note(HostWait(event.id))
        return True

    # ---- the device_module-like surface ----------------------------------
    @abc.abstractmethod
    def Stream(self, name: str) -> Stream:  # noqa: N802 - mirrors device_module.Stream
        ...

    @abc.abstractmethod
    def Event(self, *, external: bool = False) -> Event:  # noqa: N802
        ...

    @abc.abstractmethod
    def current_stream(self) -> Stream: ...

    @abc.abstractmethod
    def stream(self, stream: Stream) -> contextlib.AbstractContextManager: ...

    # ---- what a harness needs on top --------------------------------------
    @abc.abstractmethod
    def copy_async(self, dst: torch.Tensor, src: torch.Tensor, region: Region) -> None:
        """Host-to-device copy on the current stream; `region` names what it writes."""

    @abc.abstractmethod
    def delay(self, us: float) -> None:
        """Hold the current stream for `us` microseconds (a fault, not a sleep on the host)."""

    def access(
        self,
        reads: Sequence[Region] = (),
        writes: Sequence[Region] = (),
        what: str = "",
    ) -> None:
        """Announce that the next kernels on the current stream read / write these regions.

        The model calls it right before it touches pool memory. The CUDA device only
        traces it; the simulator also decides here which pending copies have landed.
        """
        if self.recording:
            self._note(Access(self.current_stream().id, tuple(reads), tuple(writes), what))

    @abc.abstractmethod
    def capture(self, fn: Callable[[], None], *, warmup: int = 2) -> Graph:
        """Warm `fn` up, then capture it into a graph on a side stream."""

    @abc.abstractmethod
    def synchronize(self, timeout_s: float = 30.0) -> None:
        """Wait for all streams; raise ReplayTimeout instead of hanging."""

    @abc.abstractmethod
    def empty_host(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """Host memory the device copies from asynchronously (pinned on CUDA)."""

    def describe(self) -> dict:
        """Versions and names for reports."""
        return {"device": self.name, "torch": torch.__version__}

    def _replayed(self, graph: "Graph") -> None:
        """Trace a replay of `graph` on the current stream (nothing when not tracing)."""
        if self._trace is not None:
            self._trace.add(Replay(self.current_stream().id, graph.id, tuple(graph.body)))


_UNTIMED = contextlib.nullcontext()


class _TimedSpan:
    """One op's span on a stream while tracing: marks before and after, kept in the trace."""

    def __init__(self, dev: Device, stream: Stream, kind: str, name: str):
        self.dev, self.stream, self.kind, self.name = dev, stream, kind, name

    def __enter__(self) -> None:
        self.begin = self.dev.mark(self.stream, end=False)

    def __exit__(self, *exc) -> None:
        end = self.dev.mark(self.stream, end=True)
        self.dev._marks.marks.append((self.stream.id, self.name, self.kind, self.begin, end))


def dtype_of(name: str) -> torch.dtype:
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[str(name)]
