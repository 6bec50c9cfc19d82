"""The graph check: a captured graph, by its own nodes and edges, against the loads it must wait for
(pure logic: no torch, no device; the graph itself is a `harness.records.graph_model.GraphModel`).

Two checks, neither needs a replay:

- `check_replays`: every node of a pool-touching step that reads or writes a region a load op
  wrote must be ordered after that copy: by an event wait node inside the graph that reaches
  it through edges, on an event whose record covers the copy, or by a wait enqueued on the
  replay stream before the replay. Findings (`GraphFinding`) name the node, the region and
  the missing edge, in the race kinds of `harness.records.races`.
- `compare_record`: the op list must match the graph: a wait node for each captured wait, on
  the same event; a record node for each captured record; work nodes for each kernel; no
  wait or record node the op list does not hold. A mismatch means the analyser's picture is
  wrong, so it is an error, never trusted.

Happens-before is the analyser's vector clocks (`harness.checkers.clocks`): the replay's
nodes start from the replay stream's clock at the launch, and a node also carries the clock
of every event a wait node among its ancestors waits on (its latest record at the launch).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from harness.checkers.clocks import Clock, Stamp, StreamClocks
from harness.checkers.happens_before import FlagWrites, FlagWriteStamp
from harness.records.graph_model import GraphModel, GraphNode, GraphSource, NodeKind
from harness.records.races import RaceKind
from harness.records.trace import (
    Copy,
    CopyToHost,
    EventId,
    FlagId,
    FlagWait,
    FlagWrite,
    GraphId,
    Hold,
    HostSync,
    HostWait,
    Kernel,
    Op,
    Record,
    Region,
    Replay,
    StreamId,
    Trace,
    Wait,
)

__all__ = ["GraphFinding", "GraphCheck", "GraphSummary", "check_replays", "compare_record", "check_graphs"]


# ---------------------------------------------------------------- the check


@dataclass(frozen=True)
class GraphFinding:
    """A node of a graph that reads or writes a loaded region with nothing ordering it after the copy."""

    kind: RaceKind  # read-after-write (the node reads) or write-after-write (it writes)
    graph: GraphId
    node: int
    kernel: str  # what a simulated node stands for; "kernel" for a node read from the driver
    step: str  # the captured op it belongs to (the model's step)
    access_region: Region
    copy_region: Region
    copy_stream: str
    replay_stream: str
    event: EventId | None  # the load event: the first recorded on the copy's stream after it (None: none)
    flags: tuple[FlagId, ...] = ()  # the flags of the value-wait nodes above the node (none: none)

    def describe(self) -> str:
        verb = "writes" if self.kind is RaceKind.WRITE_AFTER_WRITE else "reads"
        who = f"graph {self.graph} node {self.node} ({self.kernel}, step {self.step or '?'})"
        copy = f"the H2D copy on {self.copy_stream} that writes {self.copy_region}"
        if self.flags:
            on = ", ".join(f"flag {f}" for f in self.flags)
            missing = (f"the value waits above it ({on}) may be released by a flag write not ordered after that "
                       "copy (written before it, or a previous load op's value never re-armed)")
        elif self.event is None:
            missing = f"no event is recorded after that copy on {self.copy_stream}"
        else:
            missing = (f"no wait node on event {self.event} (recorded after that copy) reaches it, and "
                       f"{self.replay_stream} waited on no such event before the replay")
        return f"{who} {verb} {self.access_region}, but nothing orders it after {copy}: {missing}"


@dataclass(frozen=True)
class _LoadCopy:
    stamp: Stamp
    region: Region
    event: EventId | None  # the first event recorded on its stream after it (None: none)


def _next_record(ops: Iterable[Op], stream: StreamId | None) -> EventId | None:
    """The first event recorded in `ops` on `stream` (None: any stream, a replay's body)."""
    for op in ops:
        if isinstance(op, Record) and (stream is None or op.stream == stream):
            return op.event
    return None


def _load_event(rest: Sequence[Op], later: Sequence[Op], sid: StreamId) -> EventId | None:
    """The load event of a copy inside a replay: the first record after it in the graph, else the
    first on its stream after the replay."""
    event = _next_record(rest, None)
    return event if event is not None else _next_record(later, sid)


# The clock a wait until `flag` reaches `value`, by work whose clock is the given one, is ordered after.
Release = Callable[[FlagId, Clock, int], "Clock | None"]


class _Walk:
    """What the check knows at each op: stream clocks, each event's latest record, every flag's
    writes (the analyser's `FlagWrites`: one rule for what a value wait is ordered after), and
    the H2D copies so far (on their streams, or inside a replayed load graph on its stream)."""

    def __init__(self, flag_values: Mapping[FlagId, tuple[int, ...]]) -> None:
        self.clocks = StreamClocks()
        self.events: dict[EventId, Clock] = {}
        self.flag_values = flag_values  # what each flag may hold as the trace starts
        self.flags: dict[FlagId, FlagWrites] = {}
        self.copies: list[_LoadCopy] = []

    def release(self, flag: FlagId, waiter: Clock, value: int) -> Clock | None:
        writes = self.flags.get(flag)
        return None if writes is None else writes.release(waiter, value)

    def flag_write(self, sid: StreamId, flags: Iterable[FlagId], value: int) -> None:
        stamp, clock = self.clocks.stamp(sid), self.clocks.record(sid)
        for flag in flags:  # one write of every flag: one stamp
            writes = self.flags.setdefault(flag, FlagWrites(self.flag_values.get(flag)))
            writes.writes.append(FlagWriteStamp(stamp, clock, value))

    def flag_wait(self, sid: StreamId, flag: FlagId, value: int) -> None:
        self.clocks.wait(sid, self.release(flag, self.clocks.clock(sid), value))


def check_replays(trace: Trace, models: Mapping[GraphId, GraphModel]) -> list[GraphFinding]:
    """Findings for every replay in `trace` of a graph in `models` (others are not checked here).

    Deduplicated by (graph, step, copy region, kind), in the order first found.
    """
    w = _Walk(trace.flag_values)
    findings: list[GraphFinding] = []
    seen: set[tuple] = set()

    def name(sid: StreamId) -> str:
        return trace.stream_names.get(sid, f"stream{sid}")

    for at, op in enumerate(trace.ops):
        later = trace.ops[at + 1:]
        if isinstance(op, Record):
            w.events[op.event] = w.clocks.record(op.stream)
        elif isinstance(op, Wait):
            w.clocks.wait(op.stream, w.events.get(op.event))
        elif isinstance(op, FlagWrite):
            w.flag_write(op.stream, op.flags, op.value)
        elif isinstance(op, FlagWait):
            w.flag_wait(op.stream, op.flag, op.value)
        elif isinstance(op, HostSync):
            w.clocks.host_sync()
        elif isinstance(op, HostWait):
            w.clocks.host_wait(w.events.get(op.event))
        elif isinstance(op, Copy):
            w.copies.append(_LoadCopy(w.clocks.stamp(op.stream), op.dst, _next_record(later, op.stream)))
        elif isinstance(op, Replay):
            model = models.get(op.graph)
            if model is None:
                _replay_by_body(w, op, later)
                continue
            for f in _check_one(model, op, w, name):
                key = (f.graph, f.step, f.copy_region, f.kind)
                if key not in seen:
                    seen.add(key)
                    findings.append(f)
            _replay_by_graph(w, model, op, later)
        # Kernels, D2H copies, host writes, delays and holds order nothing here.
    return findings


def _join(into: Clock, other: Clock | None) -> Clock:
    """`into` joined with `other` (a new dict only where `other` adds something)."""
    if not other or all(into.get(s, -1) >= e for s, e in other.items()):
        return into
    out = dict(into)
    for s, e in other.items():
        out[s] = max(out.get(s, e), e)
    return out


def _node_clocks(model: GraphModel, base: Clock, events: Mapping[EventId, Clock], release: Release) -> dict[int, Clock]:
    """Each node's clock as it starts: the replay stream's at launch, joined with what each wait
    node above it is ordered after. An event wait: its event's latest record at the launch. A
    value wait: the flag writes that may release it (`FlagWrites.release`), seen from the wait
    node's own clock (what is ordered before that node hides the writes it overwrote)."""
    preds: dict[int, list[int]] = {n: [] for n in model.order}
    for a, b in model.edges:
        preds[b].append(a)
    into: dict[int, Clock] = {}
    after: dict[int, Clock] = {}  # what the nodes below it inherit from it
    for n in model.order:
        c = base
        for p in preds[n]:
            c = _join(c, after[p])
        into[n] = c
        node = model.by_id[n]
        if node.kind is NodeKind.WAIT and node.event is not None:
            c = _join(c, events.get(node.event))
        elif node.kind is NodeKind.VALUE_WAIT and len(node.flags) == 1 and node.value is not None:
            c = _join(c, release(node.flags[0], c, node.value))
        after[n] = c
    return into


def _check_one(model: GraphModel, op: Replay, w: _Walk, name: Callable[[StreamId], str]) -> Iterable[GraphFinding]:
    clocks = _node_clocks(model, dict(w.clocks.clock(op.stream)), w.events, w.release)
    for captured, span in zip(op.body, model.spans, strict=False):
        # Only a kernel is a reader: a load graph's copies, records and flag writes read no pool.
        if not isinstance(captured, Kernel) or not captured.touches_pools:
            continue
        sides = [(r, RaceKind.READ_AFTER_WRITE) for r in captured.reads]
        sides += [(x, RaceKind.WRITE_AFTER_WRITE) for x in captured.writes]
        for node_id in span:
            node = model.by_id[node_id]
            if not node.kind.work:
                continue
            c = clocks[node_id]
            for region, kind in sides:
                for copy in w.copies:
                    if copy.region.overlaps(region) and c.get(copy.stamp.stream, -1) < copy.stamp.epoch:
                        yield GraphFinding(kind, model.graph, node.id, node.name, captured.what, region,
                                           copy.region, name(copy.stamp.stream), name(op.stream), copy.event,
                                           _value_waits_above(model, node_id))


def _value_waits_above(model: GraphModel, node: int) -> tuple[FlagId, ...]:
    """The flags the value-wait nodes above `node` wait on (for a finding's sentence only)."""
    if not model.count(NodeKind.VALUE_WAIT):
        return ()
    above = model.ancestors[node]
    return tuple(sorted({f for n in model.nodes if n.id in above and n.kind is NodeKind.VALUE_WAIT for f in n.flags}))


def _replay_by_graph(w: _Walk, model: GraphModel, op: Replay, later: Sequence[Op]) -> None:
    """The replay's effect on what follows, node by node in topological order on its stream: wait
    nodes order the stream, record and value-write nodes record on it, and a load graph's copies
    (the nodes of a captured H2D copy) are copies on it. That the graph orders each record after
    the copies before it is `compare_record`'s to confirm."""
    sid = op.stream
    last_of: dict[int, int] = {}  # a captured copy's last node -> its index in the body
    for i, (captured, span) in enumerate(zip(op.body, model.spans, strict=False)):
        if isinstance(captured, Copy) and span:
            last_of[span[-1]] = i
    for n in model.order:
        node = model.by_id[n]
        if node.kind is NodeKind.WAIT and node.event is not None:
            w.clocks.wait(sid, w.events.get(node.event))
        elif node.kind is NodeKind.RECORD and node.event is not None:
            w.events[node.event] = w.clocks.record(sid)
        elif node.kind is NodeKind.VALUE_WAIT and len(node.flags) == 1 and node.value is not None:
            w.flag_wait(sid, node.flags[0], node.value)
        elif node.kind is NodeKind.VALUE_WRITE and node.value is not None:
            w.flag_write(sid, node.flags, node.value)
        at = last_of.get(n)
        if at is not None:
            copy = op.body[at]
            assert isinstance(copy, Copy)
            event = _load_event(op.body[at + 1:], later, sid)
            w.copies.append(_LoadCopy(w.clocks.stamp(sid), copy.dst, event))


def _replay_by_body(w: _Walk, op: Replay, later: Sequence[Op]) -> None:
    """A replay of a graph with no model: its op list's graph waits, records, flag waits and
    writes, and copies, as the analyser does."""
    sid = op.stream
    for i, inner in enumerate(op.body):
        if isinstance(inner, Wait) and inner.in_graph:
            w.clocks.wait(sid, w.events.get(inner.event))
        elif isinstance(inner, Record):
            w.events[inner.event] = w.clocks.record(sid)
        elif isinstance(inner, FlagWait) and inner.in_graph:
            w.flag_wait(sid, inner.flag, inner.value)
        elif isinstance(inner, FlagWrite):
            w.flag_write(sid, inner.flags, inner.value)
        elif isinstance(inner, Copy):
            event = _load_event(op.body[i + 1:], later, sid)
            w.copies.append(_LoadCopy(w.clocks.stamp(sid), inner.dst, event))


# ---------------------------------------------------------------- the record against the graph


_SYNC = (NodeKind.WAIT, NodeKind.RECORD, NodeKind.VALUE_WAIT, NodeKind.VALUE_WRITE, NodeKind.MEM_OP)


def compare_record(body: Sequence[Op], model: GraphModel) -> list[str]:
    """Where the op list recorded for a capture differs from the graph; empty when they match.

    Each captured op's nodes must be what it says: an event wait or record node on its event, a
    value-wait node on its flag and value, value-write nodes on its flags and value, device work
    for a kernel or a copy, and no synchronising node anywhere else. In a load graph (one that
    captured H2D copies) each record and flag write must also be ordered after every copy before
    it by the graph's edges, as the op list's order says. A stream memory operation the reader
    could not map to the harness's flags is a mismatch: the check cannot say what it orders.
    """
    out: list[str] = []
    g = f"graph {model.graph}"
    if len(model.spans) != len(body):
        return [f"{g}: the op list holds {len(body)} captured ops, the graph's capture marked {len(model.spans)}"]
    covered: set[int] = set()
    copies: list[tuple[int, frozenset[int]]] = []  # (op index, its nodes) of the H2D copies so far
    for i, (op, span) in enumerate(zip(body, model.spans, strict=True)):
        covered |= set(span)
        nodes = [model.by_id[n] for n in span]
        sync = [n for n in nodes if n.kind in _SYNC]
        work = any(n.kind.work for n in nodes)


        if isinstance(op, Wait):
            if [n.event for n in _only(sync, NodeKind.WAIT)] != [op.event]:
                out.append(f"{g}: op {i} waits on event {op.event}; the graph holds {_what(nodes)} there")
        elif isinstance(op, Record):
            if [n.event for n in _only(sync, NodeKind.RECORD)] != [op.event]:
                out.append(f"{g}: op {i} records event {op.event}; the graph holds {_what(nodes)} there")
        elif isinstance(op, FlagWait):
            if [(n.flags, n.value) for n in _only(sync, NodeKind.VALUE_WAIT)] != [((op.flag,), op.value)]:
                out.append(f"{g}: op {i} waits until flag {op.flag} reaches {op.value}; "
                           f"the graph holds {_what(nodes)} there")
        elif isinstance(op, FlagWrite):
            writes = _only(sync, NodeKind.VALUE_WRITE)
            flags = sorted(f for n in writes for f in n.flags)
            if not writes or flags != sorted(op.flags) or any(n.value != op.value for n in writes):
                out.append(f"{g}: op {i} writes {op.value} into flags {list(op.flags)}; "
                           f"the graph holds {_what(nodes)} there")
        elif isinstance(op, (Kernel, Copy, CopyToHost)):
            if sync or not work:
                what = (op.what or "kernel") if isinstance(op, Kernel) else type(op).__name__
                out.append(f"{g}: op {i} ({what}) is device work; the graph holds {_what(nodes)} there")
        elif isinstance(op, (HostSync, HostWait, Replay)):
            out.append(f"{g}: op {i} ({type(op).__name__}) cannot be captured")
        elif isinstance(op, Hold) and sync:
            out.append(f"{g}: op {i} holds on a gate; the graph holds {_what(nodes)} there")
        if isinstance(op, Copy):
            copies.append((i, frozenset(span)))
        elif isinstance(op, (Record, FlagWrite)):
            for n in sync:
                for j, copy in copies:
                    if not copy <= model.ancestors[n.id]:
                        out.append(f"{g}: op {i}'s {n.kind.value} node {n.id} is not ordered after copy op {j} "
                                   "by the graph's edges, as the op list's order says")
    for n in model.nodes:
        if n.kind is NodeKind.MEM_OP:
            out.append(f"{g}: node {n.id} is a stream memory operation the check cannot read ({n.name})")
        elif n.kind in (NodeKind.VALUE_WAIT, NodeKind.VALUE_WRITE) and not n.flags:
            out.append(f"{g}: node {n.id} ({n.name}) is on an address that is none of the harness's flags")
        elif n.id not in covered and n.kind in _SYNC:
            out.append(f"{g}: node {n.id} {_verb(n)}, which no captured op of the op list accounts for")
    return out


def _only(sync: Sequence[GraphNode], kind: NodeKind) -> list[GraphNode]:
    """The synchronising nodes, when all are of `kind`; else none (the comparison then fails)."""
    return list(sync) if all(n.kind is kind for n in sync) else []


def _what(nodes: Sequence[GraphNode]) -> str:
    if not nodes:
        return "no node"
    parts = [_one(n) for n in nodes[:4]]
    more = f" and {len(nodes) - 4} more" if len(nodes) > 4 else ""
    return ", ".join(parts) + more


def _verb(n: GraphNode) -> str:
    """What a synchronising node does, as a sentence's predicate."""
    if n.kind in (NodeKind.WAIT, NodeKind.RECORD):
        what = "waits on" if n.kind is NodeKind.WAIT else "records"
        return f"{what} " + (f"event {n.event}" if n.event is not None else "an event the harness did not make")
    flags = ",".join(str(f) for f in n.flags)
    if n.kind is NodeKind.VALUE_WAIT:
        return f"waits until flag {flags} reaches {n.value}"
    return f"writes {n.value} into flags {flags}"


def _one(n: GraphNode) -> str:
    if n.kind in (NodeKind.WAIT, NodeKind.RECORD):
        on = f"event {n.event}" if n.event is not None else "an event the harness did not make"
        return f"{n.kind.value} on {on}"
    if n.kind in (NodeKind.VALUE_WAIT, NodeKind.VALUE_WRITE):
        on = ",".join(str(f) for f in n.flags) or "an address that is no flag of the harness's"
        return f"{n.kind.value} of {n.value} on flag {on}"
    return n.kind.value


# ---------------------------------------------------------------- one scenario's graphs


@dataclass(frozen=True)
class GraphSummary:
    """One replayed graph, counted: for a table and for results.json."""

    graph: GraphId
    source: str
    nodes: int
    wait_nodes: int
    record_nodes: int
    work_nodes: int
    steps: tuple[tuple[str, int], ...]  # (pool-touching step, its work nodes), in capture order
    mismatches: tuple[str, ...] = ()
    value_wait_nodes: int = 0
    value_write_nodes: int = 0
    kinds: tuple[tuple[str, int], ...] = ()  # (node kind, how many), every kind the graph holds


@dataclass(frozen=True)
class GraphCheck:
    """The graph check of one traced replay: the graphs it replayed, the findings, and whether the
    op list matched each graph. `unavailable` says why no graph could be read (then nothing is checked)."""

    graphs: tuple[GraphSummary, ...] = ()
    findings: tuple[GraphFinding, ...] = ()
    unavailable: str | None = None

    @property
    def matched(self) -> bool:
        return not any(g.mismatches for g in self.graphs)

    @property
    def read_none(self) -> bool:
        """No graph could be read (`unavailable` says why): nothing was checked."""
        return self.unavailable is not None and not self.graphs

    @property
    def mismatches(self) -> list[str]:
        return [m for g in self.graphs for m in g.mismatches]

    def mismatch_line(self) -> str:
        """The scenario's error when the op list does not match a graph: one line."""
        found = self.mismatches
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        return f"the op list recorded for a capture does not match the graph the device holds: {found[0]}{more}"


def summarise(model: GraphModel, body: Sequence[Op]) -> GraphSummary:
    steps = tuple(
        (op.what, sum(model.by_id[n].kind.work for n in span))
        for op, span in zip(body, model.spans, strict=False)
        if isinstance(op, Kernel) and op.touches_pools
    )
    return GraphSummary(model.graph, model.source, len(model.nodes), model.count(NodeKind.WAIT),
                        model.count(NodeKind.RECORD), model.work_nodes, steps, tuple(compare_record(body, model)),
                        model.count(NodeKind.VALUE_WAIT), model.count(NodeKind.VALUE_WRITE),
                        tuple((k.value, model.count(k)) for k in NodeKind if model.count(k)))


def check_graphs(trace: Trace, source: GraphSource) -> GraphCheck:
    """The graph check of a traced replay: each replayed graph's summary and comparison, and the findings."""
    if source.unavailable is not None and not source.models:
        return GraphCheck(unavailable=source.unavailable)
    bodies = {op.graph: op.body for op in trace.ops if isinstance(op, Replay)}
    summaries = tuple(summarise(m, bodies[g]) for g, m in source.models.items() if g in bodies)
    return GraphCheck(summaries, tuple(check_replays(trace, source.models)), source.unavailable)
