"""Happens-before race analysis of a recorded `Trace` (pure logic: no torch, no device).

Ops are walked in the order they were enqueued, with the stream clocks of
`harness.checkers.clocks` (copies and accesses stamped, records, waits, host syncs).
Replay(stream=S, body): the body's ops run as if on S, in order; only body waits
captured as graph nodes (`in_graph=True`) are honoured. Delay and Hold: nothing.

Value waits: a flag write is stamped like an event record (it carries its stream's clock);
a wait until the flag reaches a value is ordered after whichever write it may have seen
(`FlagWrites.release`): every write of a value that reaches the target that no later
write already ordered before the waiter has hidden; the waiter gets what all of them have
in common. The flag's value when the trace started (`Trace.flag_values`) is one of them
where it reaches the target and no write before the waiter hid it (a previous load op's
LOADED that nothing re-armed), and orders nothing of this op's copies; a value short of
the target (a generation counter's previous generation) releases nothing.

Something stamped (L, e) happens-before work on a stream whose clock C has
C.get(L, -1) >= e. A pool access unordered with an earlier-enqueued copy to an
overlapping region is a race (read after write, or write after write), and so
is a copy unordered with an earlier-enqueued access to an overlapping region
(write after read, or write after write).

The write-back direction and host buffers add three more:

- store-before-compute: a device-to-host copy reads a region that an earlier
  write (a kernel, or a load-back copy) is not ordered before;
- reuse-before-backup: a write (a kernel, or a load-back copy) to a region an
  earlier device-to-host copy reads, not ordered after that copy;
- staging overwrite: the host writes host memory an earlier load-back copy reads
  (its `source`) before it has seen that copy complete (the host is ordered after
  stream work only by what it saw complete: `StreamClocks.host_ordered`).
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.checkers.clocks import Clock, Stamp, StreamClocks
from harness.records.races import HOST, HOST_NAME, RaceKind
from harness.records.trace import (
    Copy,
    CopyToHost,
    Delay,
    FlagWait,
    FlagWrite,
    Hold,
    HostSync,
    HostWait,
    HostWrite,
    Kernel,
    Op,
    Record,
    Region,
    Replay,
    StreamId,
    Trace,
    Wait,
    flag_reached,
)

__all__ = ["Finding", "find_races", "FlagWrites", "FlagWriteStamp"]

@dataclass(frozen=True)
class Finding:
    """One unordered (copy, access) pair, by region and kernel.

    `access_first` is True when the access was enqueued before the copy
    (WRITE_AFTER_READ always; WRITE_AFTER_WRITE when the write came first;
    STORE_BEFORE_COMPUTE always: the write came first, the D2H copy reads after it).

    The "copy" side is the H2D copy (its destination), the D2H copy (the device region
    it backs up), or, for a staging overwrite, the H2D copy (the host memory it reads);
    the "access" side is the kernel, the other copy (`what` "H2D copy"), or the host's
    write (`access_stream` "host").
    """

    kind: RaceKind
    copy_stream: str
    copy_region: Region
    access_stream: str
    access_region: Region
    what: str
    in_replay: bool
    access_first: bool = False

    def _who(self) -> str:
        what = self.what or "an access"
        if self.access_stream == HOST_NAME:
            return f"{what} (the host)"
        where = "graph replay" if self.in_replay else "stream"
        return f"{what} ({where} on {self.access_stream})"

    def describe(self) -> str:
        """One sentence a person can act on: the later side, the earlier one, the missing edge."""
        kind = self.kind
        if kind is RaceKind.STORE_BEFORE_COMPUTE:
            return (f"the D2H copy on {self.copy_stream} backs up {self.copy_region}, but nothing orders it "
                    f"after {self._who()} writes {self.access_region}: {self.copy_stream} waited on no event "
                    "recorded after that")
        if kind is RaceKind.REUSE_BEFORE_BACKUP:
            return (f"{self._who()} writes {self.access_region}, but nothing orders it after the D2H copy on "
                    f"{self.copy_stream} that backs up {self.copy_region}: {self.access_stream} waited on no "
                    "event recorded after that")
        if kind is RaceKind.STAGING_OVERWRITE:
            return (f"{self._who()} rewrites {self.access_region}, but nothing orders it after the H2D copy on "
                    f"{self.copy_stream} that reads {self.copy_region}: the host saw no event recorded after "
                    "that copy complete")
        # The access writes only in a write-after-write; a copy over a read is write-after-read.
        verb = "writes" if kind is RaceKind.WRITE_AFTER_WRITE else "reads"
        access = f"{self._who()} {verb} {self.access_region}"
        copy_verb = "overwrites" if kind is RaceKind.WRITE_AFTER_READ else "writes"
        copy = f"the H2D copy on {self.copy_stream} that {copy_verb} {self.copy_region}"
        first, later, waiter = (access, copy, self.copy_stream) if self.access_first else (
            copy, access, self.access_stream)
        return f"{later}, but nothing orders it after {first}: {waiter} waited on no event recorded after that"


@dataclass(frozen=True)
class _Copy:
    stamp: Stamp  # its stream is the replay's stream inside a replay
    region: Region  # H2D: the device region it writes; D2H: the device region it reads
    source: Region | None = None  # H2D: the host memory it reads, where tracked


@dataclass(frozen=True)
class _Access:
    stamp: Stamp
    region: Region
    is_write: bool
    what: str
    in_replay: bool


@dataclass(frozen=True)
class FlagWriteStamp:
    """One write to a flag: where it was enqueued, what it is ordered after, and the value."""

    stamp: Stamp
    clock: Clock  # its stream's clock when it was enqueued: what it is ordered after
    value: int


class FlagWrites:
    """Every write to one flag, in enqueue order (the analyser's and the graph check's: one rule).

    `initial`: every value the flag may hold when the op list starts (`Trace.flag_values`); None
    where that is not known, when it may hold anything.
    """

    def __init__(self, initial: tuple[int, ...] | None = None) -> None:
        self.initial = initial
        self.writes: list[FlagWriteStamp] = []

    def initial_reaches(self, target: int) -> bool:
        """May the flag's value from before the op list reach `target`?"""
        return self.initial is None or any(flag_reached(v, target) for v in self.initial)

    def write(self, clocks: StreamClocks, sid: StreamId, value: int) -> None:
        """A write of `value` enqueued on `sid` now (stamped, and carrying its clock, like a record)."""
        self.writes.append(FlagWriteStamp(clocks.stamp(sid), clocks.record(sid), value))

    def release(self, waiter: Clock, target: int) -> Clock | None:
        """The clock a wait until the flag reaches `target`, by work whose clock is `waiter`, is
        ordered after; None when it is ordered after nothing.

        A write W is hidden from the waiter when a later write X is ordered after W and before the
        waiter (coherence: the waiter sees X or something later); the flag's value from before the
        op list is hidden by any write before the waiter. Not hidden, that value releases the waiter
        if it may reach the target (`initial`: a previous load op's LOADED, say; unknown, it may
        reach anything), and then the waiter is ordered after nothing. Otherwise each write that is
        not hidden and whose value reaches the target may be the one that released the waiter, so
        it is ordered only after what all of them are ordered after: the pointwise minimum of their
        clocks. A wait that no write enqueued so far can release waits for a later one, and gains
        nothing here.
        """
        seen = [w for w in self.writes if waiter.get(w.stamp.stream, -1) >= w.stamp.epoch]
        if not seen and self.initial_reaches(target):
            return None  # the value from before the op list may be what releases it
        live = [w for w in self.writes if not any(_before(w, x) for x in seen if x is not w)]
        candidates = [w for w in live if flag_reached(w.value, target)]
        if not candidates:
            return None
        common = dict(candidates[0].clock)
        for w in candidates[1:]:
            common = {s: min(e, w.clock[s]) for s, e in common.items() if s in w.clock}
        return common


def _before(x: FlagWriteStamp, w: FlagWriteStamp) -> bool:
    """Is write x ordered before write w (w's clock covers x's stamp)?"""
    return w.clock.get(x.stamp.stream, -1) >= x.stamp.epoch


class _Walker:
    def __init__(self, trace: Trace):
        self.names = trace.stream_names
        self.flag_values = trace.flag_values
        self.clocks = StreamClocks()
        self.events: dict[int, dict[StreamId, int]] = {}
        self.flags: dict[int, FlagWrites] = {}
        self.copies: list[_Copy] = []  # H2D
        self.backups: list[_Copy] = []  # D2H
        self.accesses: list[_Access] = []  # kernels' reads and writes
        self.findings: list[Finding] = []
        self._seen: set[tuple] = set()

    def name(self, sid: StreamId) -> str:
        return HOST_NAME if sid <= HOST else self.names.get(sid, f"stream{sid}")

    def report(self, kind: RaceKind, copy: _Copy, acc: _Access, first: bool, copy_region: Region | None = None) -> None:
        region = copy_region or copy.region
        key = (region, acc.what, kind)
        if key in self._seen:
            return
        self._seen.add(key)
        self.findings.append(
            Finding(
                kind=kind,
                copy_stream=self.name(copy.stamp.stream),
                copy_region=region,
                access_stream=self.name(acc.stamp.stream),
                access_region=acc.region,
                what=acc.what,
                in_replay=acc.in_replay,
                access_first=first,
            )
        )

    def run(self, op: Op, stream: StreamId | None = None, in_replay: bool = False) -> None:
        """Apply one op; inside a replay `stream` overrides the op's own stream."""
        if isinstance(op, (Delay, Hold)):
            return  # a hold or a spin delays a stream; it orders nothing
        if isinstance(op, HostSync):
            self.clocks.host_sync()
            return
        if isinstance(op, HostWait):
            self.clocks.host_wait(self.events.get(op.event))
            return
        if isinstance(op, HostWrite):
            self.host_write(op)
            return
        if isinstance(op, Replay):
            sid = op.stream if stream is None else stream
            for inner in op.body:
                self.run(inner, sid, True)
            return
        sid = op.stream if stream is None else stream
        if isinstance(op, Record):
            self.events[op.event] = self.clocks.record(sid)
        elif isinstance(op, Wait):
            if in_replay and not op.in_graph:
                return  # a Python-level wait: a replay never runs it
            self.clocks.wait(sid, self.events.get(op.event))
        elif isinstance(op, FlagWrite):
            stamp, clock = self.clocks.stamp(sid), self.clocks.record(sid)
            for flag in op.flags:  # one write of every flag: one stamp
                self.flags.setdefault(flag, FlagWrites(self.flag_values.get(flag))).writes.append(
                    FlagWriteStamp(stamp, clock, op.value))
        elif isinstance(op, FlagWait):
            if in_replay and not op.in_graph:
                return
            writes = self.flags.get(op.flag)
            if writes is not None:
                self.clocks.wait(sid, writes.release(self.clocks.clock(sid), op.value))
        elif isinstance(op, Copy):
            copy = _Copy(self.clocks.stamp(sid), op.dst, op.source)
            for acc in self.accesses:
                if acc.region.overlaps(copy.region) and not self.clocks.ordered(sid, acc.stamp):
                    kind = RaceKind.WRITE_AFTER_WRITE if acc.is_write else RaceKind.WRITE_AFTER_READ
                    self.report(kind, copy, acc, True)
            self.overwrites_backups(sid, op.dst, "H2D copy", in_replay)
            self.copies.append(copy)
        elif isinstance(op, CopyToHost):
            backup = _Copy(self.clocks.stamp(sid), op.src)
            writers = [a for a in self.accesses if a.is_write] + [
                _Access(c.stamp, c.region, True, "H2D copy", False) for c in self.copies]
            for w in writers:
                if w.region.overlaps(op.src) and not self.clocks.ordered(sid, w.stamp):
                    self.report(RaceKind.STORE_BEFORE_COMPUTE, backup, w, True)
            self.backups.append(backup)
        elif isinstance(op, Kernel):
            sides = [(r, False) for r in op.reads] + [(w, True) for w in op.writes]
            for region, is_write in sides:
                acc = _Access(self.clocks.stamp(sid), region, is_write, op.what, in_replay)
                for copy in self.copies:
                    if copy.region.overlaps(region) and not self.clocks.ordered(sid, copy.stamp):
                        kind = RaceKind.WRITE_AFTER_WRITE if is_write else RaceKind.READ_AFTER_WRITE
                        self.report(kind, copy, acc, False)
                if is_write:
                    self.overwrites_backups(sid, region, op.what, in_replay)
                self.accesses.append(acc)
        else:  # pragma: no cover - a new op type must be taught here
            raise TypeError(f"unknown trace op {op!r}")

    def overwrites_backups(self, sid: StreamId, region: Region, what: str, in_replay: bool) -> None:
        """A write to `region` on `sid`: a race with any earlier D2H copy of it not ordered before."""
        for backup in self.backups:
            if backup.region.overlaps(region) and not self.clocks.ordered(sid, backup.stamp):
                acc = _Access(self.clocks.stamp(sid), region, True, what, in_replay)
                self.report(RaceKind.REUSE_BEFORE_BACKUP, backup, acc, False)

    def host_write(self, op: HostWrite) -> None:
        """The host writes host memory: a race with any earlier H2D copy reading it that the host
        has not seen complete."""
        for region in op.regions:
            acc = _Access(Stamp(HOST, 0), region, True, op.what, False)
            for copy in self.copies:
                if (copy.source is not None and copy.source.overlaps(region)
                        and not self.clocks.host_ordered(copy.stamp)):
                    self.report(RaceKind.STAGING_OVERWRITE, copy, acc, False, copy.source)


def find_races(trace: Trace) -> list[Finding]:
    """Every copy/access pair to overlapping regions with no happens-before between them.

    Deduplicated by (copy region, access `what`, kind), in the order first found.
    """
    w = _Walker(trace)
    for op in trace.ops:
        w.run(op)
    return w.findings
