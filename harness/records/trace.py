"""The trace both devices record: plain, frozen records of stream-ordered work.

One schema for the CUDA device and the simulator, so that a happens-before
analysis reads either. Ids are small integers given out by the device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

StreamId = int
EventId = int
GraphId = int


class Pool:
    """Names of the pools a region can live in (plain strings keep JSON simple)."""

    K = "k"
    V = "v"
    CONV = "conv"
    SSM = "ssm"


@dataclass(frozen=True)
class Region:
    """A set of slots of one pool at one layer (global layer id)."""

    pool: str
    layer: int
    start: int  # first slot
    stop: int  # one past the last slot

    def overlaps(self, other: "Region") -> bool:
        return (
            self.pool == other.pool
            and self.layer == other.layer
            and self.start < other.stop
            and other.start < self.stop
        )

    def __str__(self) -> str:
        return f"{self.pool}[L{self.layer}, slots {self.start}:{self.stop}]"


@dataclass(frozen=True)
class Copy:
    stream: StreamId
    dst: Region


@dataclass(frozen=True)
class Record:
    stream: StreamId
    event: EventId


@dataclass(frozen=True)
class Wait:
    stream: StreamId
    event: EventId
    in_graph: bool = False  # captured as a graph node (external event)


@dataclass(frozen=True)
class Access:
    """A kernel's reads and writes of pool regions, as the model announces them."""

    stream: StreamId
    reads: tuple[Region, ...]
    writes: tuple[Region, ...]
    what: str = ""


@dataclass(frozen=True)
class Delay:
    stream: StreamId
    us: float


@dataclass(frozen=True)
class Hold:
    """The stream waits on a host-released gate (it orders nothing: the host is not a stream)."""

    stream: StreamId
    gate: int


@dataclass(frozen=True)
class HostSync:
    pass


@dataclass(frozen=True)
class HostWait:
    """The host blocked until one event completed (a host-side fence)."""

    event: EventId


@dataclass(frozen=True)
class Replay:
    """A graph replay: the work captured in the graph, run on `stream` with no Python."""

    stream: StreamId
    graph: GraphId
    body: tuple["Op", ...] = field(default=())


Op = Union[Copy, Record, Wait, Access, Delay, Hold, HostSync, HostWait, Replay]


def describe(op: "Op", names: dict[StreamId, str], indent: str = "") -> str:
    """One op in words, for `repro` output."""
    name = lambda sid: names.get(sid, f"stream{sid}")  # noqa: E731
    if isinstance(op, Copy):
        return f"{indent}{name(op.stream)}: H2D copy -> {op.dst}"
    if isinstance(op, Record):
        return f"{indent}{name(op.stream)}: record event {op.event}"
    if isinstance(op, Wait):
        where = " (graph node)" if op.in_graph else ""
        return f"{indent}{name(op.stream)}: wait event {op.event}{where}"
    if isinstance(op, Delay):
        return f"{indent}{name(op.stream)}: delay {op.us:g} us"
    if isinstance(op, Access):
        parts = [f"reads {', '.join(map(str, op.reads))}"] if op.reads else []
        parts += [f"writes {', '.join(map(str, op.writes))}"] if op.writes else []
        return f"{indent}{name(op.stream)}: {op.what or 'access'} {'; '.join(parts)}"
    if isinstance(op, Hold):
        return f"{indent}{name(op.stream)}: hold on gate {op.gate} until the host releases it"
    if isinstance(op, HostSync):
        return f"{indent}host: synchronize"
    if isinstance(op, HostWait):
        return f"{indent}host: wait for event {op.event}"
    lines = [f"{indent}{name(op.stream)}: replay graph {op.graph} ({len(op.body)} captured ops)"]
    lines += [describe(o, names, indent + "    ") for o in op.body]
    return "\n".join(lines)


@dataclass(frozen=True)
class Span:
    """A stretch of one stream's time, for the timeline of a traced replay."""

    stream: str
    name: str
    kind: str  # copy | record | wait | replay | delay | gate | access
    start_us: float
    end_us: float


@dataclass
class Trace:
    """An append-only list of ops plus the names of streams, for people to read.

    `marks` holds (stream id, name, kind, begin marker, end marker) for each op the
    device timed while tracing; markers become times only once the work has run
    (`Device.timeline`).
    """

    ops: list[Op] = field(default_factory=list)
    stream_names: dict[StreamId, str] = field(default_factory=dict)
    marks: list[tuple] = field(default_factory=list)

    def add(self, op: Op) -> None:
        self.ops.append(op)
