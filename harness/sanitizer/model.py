"""The stream sanitizer's happens-before model (pure logic: no torch, no device).

It is fed what a program enqueues, in the order the host enqueues it: tensor
operations with the memory each argument reads or writes (`Use`), event records
and waits, host synchronisations, and graph captures and replays. It reports every
pair of accesses to overlapping memory, one of them a write, with no happens-before
between them (`Race`). `harness.sanitizer.tap` feeds it from real torch calls;
the tests feed it synthetic sequences.

Clocks are `harness.checkers.clocks.StreamClocks` (PyTorch's sanitizer's model): work
on a stream is stamped (stream, epoch); a record snapshots the stream's clock; a wait
merges the event's snapshot; host synchronisations move the host's floor.

What PyTorch's sanitizer does not model, and this one does:

- Capture. Work enqueued on a capturing stream is kept in the graph, not run. A wait
  on an event recorded in the same capture joins the waiting stream to the capture (an
  edge inside the graph); a wait on a capturing stream on an event recorded outside it
  is an external wait node (CUDA invalidates a capture that waits on a plain outside
  event, so one that succeeded was external).
- Replay. Each replay re-enacts the graph's work at replay time: every captured stream
  becomes one virtual stream per graph, started after the replay stream's work so far
  (a graph launch is ordered after its stream, and after the graph's earlier launches);
  captured waits order it as captured, external waits against the event's record at
  replay time; the replay stream is ordered after all of it. A record of an external
  event inside the graph (`external_event`) re-records that event at replay.
- Host memory. Work the host does itself on pinned memory (a CPU op) is ordered after
  stream work only through what the host saw complete, as in the analyser.
- The caching allocator's reuse. A freed block goes back to the pool of the stream it was
  allocated on, at once, whatever other streams still do with it, unless `record_stream(s)`
  was called: then the allocator reuses it only once s's work enqueued before the free has
  finished. So a block's accesses do not end with the free: those its stream is not ordered
  after (a side stream's read), less those a `record_stream` covers, stay pending in that
  stream's pool, and the next allocation there that overlaps them inherits them; its first
  write unordered with the old reader is a race. An allocation on another stream comes from
  other memory (a pool is per stream; a segment is freed back to CUDA only with the device
  synchronized), and inherits nothing.

Real graph edges can replace the captured wait records: `GraphEdges` is asked, per
captured access, which external events the graph orders it after.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

from harness.checkers.clocks import Clock, Stamp, StreamClocks
from harness.records.races import HOST, RaceKind

__all__ = [
    "HOST", "Span", "Site", "Use", "Access", "Race", "RaceKind", "CapturedOp", "CapturedRecord",
    "CapturedWait", "GraphEdges", "SanitizerModel",
]

StreamId = int
EventId = int
GraphKey = Hashable


@dataclass(frozen=True)
class Span:
    """Bytes [start, stop) of one address space ("cuda:0", "host")."""

    space: str
    start: int
    stop: int

    def overlaps(self, other: Span) -> bool:
        return self.space == other.space and self.start < other.stop and other.start < self.stop

    def covers(self, other: Span) -> bool:
        return self.space == other.space and self.start <= other.start and other.stop <= self.stop

    def __str__(self) -> str:
        return f"{self.space} [{self.start:#x}, {self.stop:#x}) ({self.stop - self.start} bytes)"


@dataclass(frozen=True)
class Site:
    """What enqueued an access: the operator, the schema argument, a short stack (innermost last)."""

    operator: str
    argument: str
    stack: tuple[str, ...] = ()


@dataclass(frozen=True)
class Use:
    """One tensor argument of one operation: the memory it reads or writes.

    `base` names the allocation (its first byte; unique across address spaces under CUDA's
    unified addressing): freeing it ends its own accesses, but not those still pending on it
    (`SanitizerModel.free`)."""

    span: Span
    is_write: bool
    site: Site
    base: int = 0


@dataclass(frozen=True)
class Access:
    """A use as it ran: where (`stream` is the clock's stream, HOST for the host's own work)
    and, for a replayed one, the graph, the replay, and the stack of the replay call."""

    use: Use
    stamp: Stamp
    where: str
    graph: str = ""  # "graph 3 replay 7", for a re-enacted access (the first replay that raced)
    replay_stack: tuple[str, ...] = ()
    freed: str = ""  # the pool stream's name, once its block was freed with this access pending

    @property
    def on_host(self) -> bool:
        return self.stamp.stream == HOST

    def describe(self) -> str:
        u = self.use
        verb = "writes" if u.is_write else "reads"
        arg = f" `{u.site.argument}`" if u.site.argument else ""
        head = f"{u.site.operator} {verb}{arg} {u.span} on {self.where}"
        lines = [head, ("    captured at: " if self.graph else "    enqueued at: ") + _stack(u.site.stack)]
        if self.graph:
            lines.append(f"    replayed at: {_stack(self.replay_stack)} (first in {self.graph})")
        if self.freed:
            lines.append(f"    then its memory was freed with no record_stream for {self.where}, and the caching "
                         f"allocator handed it out again on {self.freed}")
        return "\n".join(lines)


def _stack(frames: tuple[str, ...]) -> str:
    """Innermost first, as one reads where it came from."""
    return " <- ".join(reversed(frames)) or "(no stack)"


@dataclass
class Race:
    """Two accesses to overlapping memory, one a write, with no happens-before between them.

    `earlier` was enqueued first; `times` counts how often the same pair (same operators,
    arguments, memory, streams and stacks) came round again (a race in a replay loop)."""

    earlier: Access
    later: Access
    times: int = 1

    @property
    def kind(self) -> RaceKind:
        if self.earlier.use.is_write:
            return RaceKind.WRITE_AFTER_WRITE if self.later.use.is_write else RaceKind.READ_AFTER_WRITE
        return RaceKind.WRITE_AFTER_READ

    def describe(self) -> str:
        if self.later.on_host:
            missing = "the host saw nothing recorded after the earlier one complete"
        else:
            missing = "its stream waited on no event recorded after the earlier one"
        return "\n".join([
            f"{self.kind.value} race ({self.times}x): nothing orders the later access after the earlier one "
            f"({missing})",
            "  later:   " + self.later.describe().replace("\n", "\n  "),
            "  earlier: " + self.earlier.describe().replace("\n", "\n  "),
        ])


# ---- a captured graph ------------------------------------------------------------

@dataclass(frozen=True)
class CapturedOp:
    stream: StreamId
    uses: tuple[Use, ...]


@dataclass(frozen=True)
class CapturedRecord:
    stream: StreamId
    event: EventId


@dataclass(frozen=True)
class CapturedWait:
    stream: StreamId
    event: EventId
    external: bool  # a wait node on an event recorded outside the capture


Captured = CapturedOp | CapturedRecord | CapturedWait

# The plug for a reader of the captured graph's own nodes and edges (cuGraphGetNodes):
# (graph, index, op) -> the external events the real graph orders that captured access after,
# or None to use the captured wait records for it. `graph` is the key capture_begin was given
# (the CUDA tap: id() of the torch.cuda.CUDAGraph); `index` is the op's place in the capture,
# counting captured records and waits too; `op` names its captured stream and its uses
# (operator, argument, bytes). Asked at every replay, so the answer may change between replays.
GraphEdges = Callable[[GraphKey, int, CapturedOp], "frozenset[EventId] | None"]


@dataclass
class _Graph:
    key: GraphKey
    label: str
    origin: StreamId
    body: list[Captured] = field(default_factory=list)
    streams: list[StreamId] = field(default_factory=list)  # captured streams, origin first
    recorded: set[EventId] = field(default_factory=set)  # events recorded inside the capture
    complete: bool = False
    replays: int = 0


# ---- the model -------------------------------------------------------------------

class SanitizerModel:
    def __init__(self, *, graph_edges: GraphEdges | None = None,
                 stream_names: dict[StreamId, str] | None = None) -> None:
        self.clocks = StreamClocks()
        self.graph_edges = graph_edges
        self.names: dict[StreamId, str] = dict(stream_names or {})
        self._events: dict[EventId, Clock] = {}  # each event's last record outside any capture
        self._external: set[EventId] = set()  # events created with the external flag
        self._history: dict[int, list[Access]] = {}  # allocation base -> the accesses kept
        self._allocated_on: dict[int, StreamId] = {}  # allocation base -> the stream whose pool it is from
        self._stream_uses: dict[int, set[StreamId]] = {}  # allocation base -> its record_stream streams
        self._released: dict[StreamId, list[Access]] = {}  # freed blocks' pending accesses, by pool stream
        self._inherits: dict[int, StreamId] = {}  # allocation base -> the pool whose pending accesses it takes on
        self._graphs: dict[GraphKey, _Graph] = {}
        self._capturing: dict[StreamId, _Graph] = {}  # stream -> the capture it belongs to
        self._virtual: dict[tuple[GraphKey, StreamId], StreamId] = {}
        self._virtual_made = 0
        self._races: dict[tuple, Race] = {}
        self.unknown_replays = 0  # replays of graphs captured before the model saw them

    # ---- naming
    def name(self, sid: StreamId) -> str:
        if sid == HOST:
            return "the host"
        return self.names.get(sid) or ("stream 0 (legacy default)" if sid == 0 else f"stream {sid:#x}")

    @property
    def races(self) -> list[Race]:
        return list(self._races.values())

    def capturing(self, stream: StreamId) -> bool:
        return stream in self._capturing

    # ---- tensor work
    def op(self, stream: StreamId, uses: Sequence[Use]) -> None:
        """An operation enqueued on `stream` (into its graph when the stream is capturing)."""
        if not uses:
            return
        g = self._capturing.get(stream)
        if g is not None:
            g.body.append(CapturedOp(stream, tuple(uses)))
            return
        self._run(uses, self.clocks.stamp(stream), self.clocks.clock(stream), self.name(stream))

    def host_op(self, uses: Sequence[Use]) -> None:
        """Work the host does itself, now, on (pinned) host memory."""
        self._run(uses, Stamp(HOST, 0), None, "the host")

    def allocate(self, base: int, stream: StreamId) -> None:
        """The caching allocator handed out the block at `base` on `stream` (the current one).

        What an earlier owner of this memory left pending in `stream`'s pool may be its now: the
        pending accesses its own accesses overlap are taken on as they come (`_run`). Memory for a
        capture comes from the graph's private pool, and inherits nothing.
        """
        self._history.pop(base, None)  # a free not seen: that owner's accesses no longer matter
        self._stream_uses.pop(base, None)
        self._inherits.pop(base, None)
        if stream in self._capturing:
            self._allocated_on.pop(base, None)
            return
        self._allocated_on[base] = stream
        released = self._released.get(stream)
        if released is not None:
            clock = self.clocks.clock(stream)
            released[:] = [a for a in released if not _covered(a, clock)]  # ordered before all of it now
            if released:
                self._inherits[base] = stream
            else:
                del self._released[stream]

    def record_stream(self, base: int, stream: StreamId) -> None:
        """`tensor.record_stream(stream)` on the block at `base`: its free waits for `stream`."""
        self._stream_uses.setdefault(base, set()).add(stream)

    def free(self, base: int) -> None:
        """The block at `base` was freed (back to its stream's pool in the caching allocator).

        Its accesses that its stream is not ordered after now stay pending in that pool, less
        those ordered before the work of a `record_stream` stream so far (the allocator records
        an event there and reuses the block only once it has completed).
        """
        kept = self._history.pop(base, [])
        stream = self._allocated_on.pop(base, None)
        uses = self._stream_uses.pop(base, set())
        self._inherits.pop(base, None)
        if stream is None or not kept:
            return  # allocated before the model watched, or never used: nothing known to carry
        waited = [self.clocks.record(s) for s in sorted(uses)]
        clock = self.clocks.clock(stream)
        pending = [dataclasses.replace(a, freed=a.freed or self.name(stream)) for a in kept
                   if not _covered(a, clock) and not any(_covered(a, c) for c in waited)]
        if pending:
            self._released.setdefault(stream, []).extend(pending)

    # ---- events and synchronisation
    def forget_event(self, event: EventId) -> None:
        """`event` was created or destroyed: a handle CUDA may hand out again means nothing yet."""
        self._events.pop(event, None)
        self._external.discard(event)

    def external_event(self, event: EventId) -> None:
        """`event` was created with the external flag: recorded inside a capture, it is a record node."""
        self._external.add(event)

    def record(self, event: EventId, stream: StreamId) -> None:
        g = self._capturing.get(stream)
        if g is not None:
            g.body.append(CapturedRecord(stream, event))
            g.recorded.add(event)
            return
        self._events[event] = self.clocks.record(stream)

    def wait(self, event: EventId, stream: StreamId) -> None:
        joining = next((g for g in self._graphs.values() if not g.complete and event in g.recorded), None)
        if joining is not None:  # an edge inside the graph; the stream joins its capture
            self._join(joining, stream)
            joining.body.append(CapturedWait(stream, event, external=False))
            return
        g = self._capturing.get(stream)
        if g is not None:
            g.body.append(CapturedWait(stream, event, external=True))
            return
        self.clocks.wait(stream, self._events.get(event))

    def host_sync(self) -> None:
        self.clocks.host_sync()

    def stream_sync(self, stream: StreamId) -> None:
        self.clocks.host_wait(self.clocks.record(stream))

    def event_sync(self, event: EventId) -> None:
        """The host waited for `event`, or polled it done."""
        self.clocks.host_wait(self._events.get(event))

    # ---- graphs
    def capture_begin(self, graph: GraphKey, stream: StreamId, label: str = "") -> None:
        g = _Graph(graph, label or f"graph {len(self._graphs) + 1}", stream)
        self._graphs[graph] = g
        for key in [k for k in self._virtual if k[0] == graph]:  # a key used again: a new graph
            del self._virtual[key]
        self._join(g, stream)

    def capture_end(self, graph: GraphKey) -> None:
        g = self._graphs.get(graph)
        if g is None:
            return
        g.complete = True
        for s in g.streams:
            self._capturing.pop(s, None)

    def captured(self, graph: GraphKey) -> tuple[Captured, ...]:
        """What a capture recorded, in order (the indices `GraphEdges` is asked about)."""
        g = self._graphs.get(graph)
        return tuple(g.body) if g is not None else ()

    def replay(self, graph: GraphKey, stream: StreamId, stack: tuple[str, ...] = ()) -> None:
        """Re-enact the graph's captured work on `stream`, now."""
        g = self._graphs.get(graph)
        if g is None or not g.complete:
            self.unknown_replays += 1
            return
        where = f"{g.label} replayed on {self.name(stream)}"
        which = f"{g.label} replay {g.replays}"
        g.replays += 1
        start = self.clocks.record(stream)  # the stream's work so far comes first
        virt = {c: self._virtual_stream(g, c) for c in g.streams}
        for v in virt.values():
            self.clocks.wait(v, start)
        local: dict[EventId, Clock] = {}  # the graph's own records, this replay
        for i, op in enumerate(g.body):
            v = virt[op.stream]
            if isinstance(op, CapturedRecord):
                local[op.event] = self.clocks.record(v)
                if op.event in self._external:  # a record node: the event is recorded by the replay
                    self._events[op.event] = local[op.event]
            elif isinstance(op, CapturedWait):
                self.clocks.wait(v, self._events.get(op.event) if op.external else local.get(op.event))
            else:
                clock = self.clocks.clock(v)
                edges = self.graph_edges(g.key, i, op) if self.graph_edges else None
                if edges is not None:  # the real graph's edges in place of the captured waits
                    clock = _merge(start, *(self._events.get(e) or {} for e in edges))
                    clock[v] = self.clocks.clock(v)[v]
                label = f"{self.name(op.stream)} as captured" if op.stream != g.origin else ""
                self._run(op.uses, self.clocks.stamp(v), clock,
                          where + (f" ({label})" if label else ""), which, stack)
        for v in virt.values():
            self.clocks.wait(stream, self.clocks.record(v))

    def _join(self, g: _Graph, stream: StreamId) -> None:
        if stream not in g.streams:
            g.streams.append(stream)
        self._capturing[stream] = g

    def _virtual_stream(self, g: _Graph, captured: StreamId) -> StreamId:
        key = (g.key, captured)
        v = self._virtual.get(key)
        if v is None:  # below HOST: never a real stream's handle
            self._virtual_made += 1
            v = self._virtual[key] = HOST - self._virtual_made
        return v

    # ---- the check
    def _run(self, uses: Sequence[Use], stamp: Stamp, clock: Clock | None, where: str,
             graph: str = "", replay_stack: tuple[str, ...] = ()) -> None:
        for use in uses:
            acc = Access(use, stamp, where, graph, replay_stack)
            kept = self._history.get(use.base, [])
            pool = self._inherits.get(use.base)
            if pool is not None:
                kept = self._inherit(pool, use.span) + kept
            survivors = []
            for prev in kept:
                if not prev.use.span.overlaps(use.span):
                    survivors.append(prev)
                    continue
                ordered = self._ordered(prev, stamp, clock)
                if (prev.use.is_write or use.is_write) and not ordered:
                    self._report(prev, acc)
                # An access this one covers and comes after stands for nothing more: a later
                # access ordered after this one is ordered after it too (for a read: only
                # earlier reads, which conflict with the same writes).
                if ordered and use.span.covers(prev.use.span) and (use.is_write or not prev.use.is_write):
                    continue
                survivors.append(prev)
            survivors.append(acc)
            self._history[use.base] = survivors

    def _inherit(self, pool: StreamId, span: Span) -> list[Access]:
        """The pending accesses of `pool`'s freed blocks that overlap `span`, taken out of the pool."""
        released = self._released.get(pool, [])
        taken = [a for a in released if a.use.span.overlaps(span)]
        if taken:
            released[:] = [a for a in released if not a.use.span.overlaps(span)]
        return taken

    def _ordered(self, prev: Access, stamp: Stamp, clock: Clock | None) -> bool:
        if prev.on_host:
            return True  # the host did it before it enqueued anything after
        if stamp.stream == HOST or clock is None:
            return self.clocks.host_ordered(prev.stamp)
        return clock.get(prev.stamp.stream, -1) >= prev.stamp.epoch

    def _report(self, earlier: Access, later: Access) -> None:
        def side(a: Access) -> tuple:
            return (a.use.site, a.use.is_write, a.use.span, a.where, a.use.base)

        key = (side(earlier), side(later))
        known = self._races.get(key)
        if known is not None:
            known.times += 1
        else:
            self._races[key] = Race(earlier, later)


def _covered(a: Access, clock: Clock) -> bool:
    """Is access `a` ordered before work whose clock is `clock`? (The host's own work always is:
    the host did it before it enqueued anything after.)"""
    return a.on_host or clock.get(a.stamp.stream, -1) >= a.stamp.epoch


def _merge(*clocks: Clock) -> Clock:
    out: Clock = {}
    for c in clocks:
        for s, e in c.items():
            out[s] = max(out.get(s, e), e)
    return out
