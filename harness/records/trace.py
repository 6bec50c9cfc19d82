"""The op list: plain, frozen records of stream-ordered work, executable and analysable.

One schema for both devices. While capturing, a device appends these records to the
graph's body; while tracing, to a `Trace`. The records carry what a replay needs to
run them again without any of the Python that issued them: a kernel carries its
closure, a copy its tensors. So one list is both the model of a replay that the
simulator executes and the one the happens-before analyser reads
(`harness.checkers.happens_before`). Payloads (closures, tensors) take no part in equality
or repr: two traces are equal when they describe the same work.

Ids are small integers given out by the device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

StreamId = int
EventId = int
GraphId = int
GateId = int
FlagId = int


class Pool:
    """Names of the pools a region can live in (plain strings keep JSON simple)."""

    K = "k"
    V = "v"
    CONV = "conv"
    SSM = "ssm"
    IDX = "idx"  # an attention layer's sparse-attention index (compressed slots: KV slot // ratio)

    @staticmethod
    def on_host(buffer: str, pool: str) -> str:
        """The name of a host buffer's copy of a pool ("host_k", "backup_ssm"): host memory,
        so it never overlaps a device region."""
        return f"{buffer}_{pool}"


@dataclass(frozen=True)
class Region:
    """A set of slots of one pool at one layer (global layer id)."""

    pool: str
    layer: int
    start: int  # first slot
    stop: int  # one past the last slot

    def overlaps(self, other: Region) -> bool:
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
    """An async host-to-device copy into `dst` (its payload: the device view and the host view).

    `source` names the host memory it reads, where that memory is ever written while a copy
    may be pending (a pinned staging buffer the host refills): a copy reads its source when it
    runs, not when it is enqueued.
    """

    stream: StreamId
    dst: Region
    nbytes: int = field(default=0, compare=False)
    tensors: tuple[Any, Any] | None = field(default=None, compare=False, repr=False)
    source: Region | None = None


@dataclass(frozen=True)
class CopyToHost:
    """An async device-to-host copy (a write-back): it reads the device region `src` and
    writes the host region `dst` (its payload: the host view and the device view)."""

    stream: StreamId
    src: Region
    dst: Region
    nbytes: int = field(default=0, compare=False)
    tensors: tuple[Any, Any] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class HostWrite:
    """The host writes host memory the device may copy from (a refill of a staging buffer).

    It is ordered after device work only by what the host saw complete (a synchronize, an
    event it waited on or polled done), never by stream order.
    """

    regions: tuple[Region, ...]
    what: str = ""


@dataclass(frozen=True)
class Record:
    stream: StreamId
    event: EventId
    handle: Any = field(default=None, compare=False, repr=False)  # the device's event


@dataclass(frozen=True)
class Wait:
    stream: StreamId
    event: EventId
    in_graph: bool = False  # captured as a graph node (external event)
    handle: Any = field(default=None, compare=False, repr=False)  # the device's event


def flag_reached(value: int, target: int) -> bool:
    """Has a flag holding `value` reached `target`? `cuStreamWaitValue32`'s GEQ test, which is
    cyclic: (int32)(value - target) >= 0, so a counter that wraps past 2**32 still compares."""
    diff = (value - target) & 0xFFFFFFFF
    return diff < 0x80000000


@dataclass(frozen=True)
class FlagWrite:
    """The stream writes `value` into each of `flags` (32-bit words in device or pinned memory)
    once all its earlier work has finished: `cuStreamWriteValue32` (one per flag), or one kernel
    that writes them all."""

    stream: StreamId
    flags: tuple[FlagId, ...]
    value: int
    handle: Any = field(default=None, compare=False, repr=False)  # the device's flag set


@dataclass(frozen=True)
class FlagWait:
    """Later work on the stream waits until `flag` has reached `value` (`flag_reached`):
    `cuStreamWaitValue32` with GEQ. Captured, it is a graph node, like a wait on an external
    event, and it waits on whatever the flag holds when the replay gets there."""

    stream: StreamId
    flag: FlagId
    value: int
    in_graph: bool = False
    handle: Any = field(default=None, compare=False, repr=False)  # the device's flag set


@dataclass(frozen=True)
class Kernel:
    """Device work and the pool regions it reads and writes, as the model announces them.

    `fn` enqueues the work (on CUDA) or computes it (on the simulator); a replay runs
    it and nothing else of the Python around it.
    """

    stream: StreamId
    reads: tuple[Region, ...] = ()
    writes: tuple[Region, ...] = ()
    what: str = ""
    fn: Callable[[], object] | None = field(default=None, compare=False, repr=False)

    @property
    def touches_pools(self) -> bool:
        return bool(self.reads or self.writes)


@dataclass(frozen=True)
class Collective(Kernel):
    """A collective across the ranks of a tensor-parallel group (an all-reduce), as a kernel of its
    stream: NCCL's is one kernel node of a captured graph, and the analyser sees a kernel that touches
    no pool. `exchange(start_us) -> end_us` is the simulator's: it swaps the data and the ranks'
    arrival times, and the collective ends on every rank after the last rank has arrived."""

    exchange: Callable[[float], float] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Delay:
    stream: StreamId
    us: float


@dataclass(frozen=True)
class Hold:
    """The stream waits on a host-released gate (it orders nothing: the host is not a stream)."""

    stream: StreamId
    gate: GateId


@dataclass(frozen=True)
class HostSync:
    pass


@dataclass(frozen=True)
class HostWait:
    """The host saw one event complete (a blocking wait, or a query that returned True)."""

    event: EventId


@dataclass(frozen=True)
class Replay:
    """A graph replay: the work captured in the graph, run on `stream` with no Python."""

    stream: StreamId
    graph: GraphId
    body: tuple[Op, ...] = field(default=())


Op = (Copy | CopyToHost | HostWrite | Record | Wait | FlagWrite | FlagWait | Kernel | Collective | Delay | Hold
      | HostSync | HostWait | Replay)


def describe(op: Op, names: dict[StreamId, str], indent: str = "") -> str:
    """One op in words, for `repro` output."""

    def name(sid: StreamId) -> str:
        return names.get(sid, f"stream{sid}")

    if isinstance(op, Copy):
        source = f" (from {op.source})" if op.source is not None else ""
        return f"{indent}{name(op.stream)}: H2D copy -> {op.dst}{source}"
    if isinstance(op, CopyToHost):
        return f"{indent}{name(op.stream)}: D2H copy {op.src} -> {op.dst}"
    if isinstance(op, HostWrite):
        return f"{indent}host: {op.what or 'write'} {', '.join(map(str, op.regions))}"
    if isinstance(op, Record):
        return f"{indent}{name(op.stream)}: record event {op.event}"
    if isinstance(op, Wait):
        where = " (graph node)" if op.in_graph else ""
        return f"{indent}{name(op.stream)}: wait event {op.event}{where}"
    if isinstance(op, FlagWrite):
        flags = ", ".join(f"f{f}" for f in op.flags)
        return f"{indent}{name(op.stream)}: write {op.value} to flag {flags}"
    if isinstance(op, FlagWait):
        where = " (graph node)" if op.in_graph else ""
        return f"{indent}{name(op.stream)}: wait until flag f{op.flag} >= {op.value}{where}"
    if isinstance(op, Delay):
        return f"{indent}{name(op.stream)}: delay {op.us:g} us"
    if isinstance(op, Kernel):
        parts = [f"reads {', '.join(map(str, op.reads))}"] if op.reads else []
        parts += [f"writes {', '.join(map(str, op.writes))}"] if op.writes else []
        return f"{indent}{name(op.stream)}: {op.what or 'kernel'} {'; '.join(parts)}".rstrip()
    if isinstance(op, Hold):
        return f"{indent}{name(op.stream)}: hold on gate {op.gate} until the host releases it"
    if isinstance(op, HostSync):
        return f"{indent}host: synchronize"
    if isinstance(op, HostWait):
        return f"{indent}host: saw event {op.event} complete (a wait on it returned, or a query said done)"
    lines = [f"{indent}{name(op.stream)}: replay graph {op.graph} ({len(op.body)} captured ops)"]
    # A captured op runs inside the replay, on the replaying stream: named by its graph, not by the
    # side stream it was captured on.
    inside = {sid: f"graph {op.graph}" for sid in {getattr(o, "stream", None) for o in op.body} if sid is not None}
    lines += [describe(o, {**names, **inside}, indent + "    ") for o in op.body]
    return "\n".join(lines)


class SpanKind:
    """What a timeline span shows (plain strings keep JSON simple)."""

    COPY = "copy"  # host to device: the load-back
    D2H = "d2h"  # device to host: the write-back
    RECORD = "record"
    WAIT = "wait"
    REPLAY = "replay"
    DELAY = "delay"
    GATE = "gate"
    ACCESS = "access"  # a kernel that reads or writes pool memory
    KERNEL = "kernel"  # a kernel that touches no pool
    HARNESS = "harness"  # the harness's own work around a replay: poisoning, observing, comparing

    ALL = (COPY, D2H, RECORD, WAIT, REPLAY, DELAY, GATE, ACCESS, KERNEL, HARNESS)


@dataclass(frozen=True)
class Span:
    """A stretch of one stream's time, for the timeline of a traced replay."""

    stream: str
    name: str
    kind: str  # a SpanKind
    start_us: float
    end_us: float


@dataclass
class Trace:
    """An append-only list of ops plus the names of streams, for people to read.

    `marks` holds (stream id, name, kind, begin marker, end marker) for each op the
    device timed while tracing; markers become times only once the work has run
    (`Device.timeline`).

    `flag_values` holds, for each flag that exists when the trace starts (or is made during
    it), every value it may hold then: the value its writes left at the host's last
    synchronize, and the value of every write enqueued since, which may or may not have run.
    A value wait is released by that value only if one of them reaches the target. A flag
    not in it (an op list built by hand) may hold anything.
    """

    ops: list[Op] = field(default_factory=list)
    stream_names: dict[StreamId, str] = field(default_factory=dict)
    marks: list[tuple] = field(default_factory=list)
    flag_values: dict[FlagId, tuple[int, ...]] = field(default_factory=dict)

    def add(self, op: Op) -> None:
        self.ops.append(op)
