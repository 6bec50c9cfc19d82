"""A captured graph by its own nodes and edges, and a check of it (pure logic: no torch, no device).

The op list (`harness.records.trace`) is the harness's record of what it captured; a
`GraphModel` is the graph the device will run: its nodes (kernels, copies, event waits and
records), its edges, and which nodes each captured op put there (`spans`, aligned with the
graph's op list). The CUDA device reads one from the driver (`harness.devices.cuda_graph`);
the simulator builds one from its op list (`chain_model`), so everything here runs on the
CPU as well.

Two checks, neither needs a replay:

- `check_replays`: every node of a pool-touching step that reads or writes a region a load op
  wrote must be ordered after that copy: by an event wait node inside the graph that reaches
  it through edges, on an event whose record covers the copy, or by a wait enqueued on the
  replay stream before the replay. Findings (`GraphFinding`) name the node, the region and
  the missing edge, in the analyser's race kinds (`harness.records.analysis`).
- `compare_record`: the op list must match the graph: a wait node for each captured wait, on
  the same event; a record node for each captured record; work nodes for each kernel; no
  wait or record node the op list does not hold. A mismatch means the analyser's picture is
  wrong, so it is an error, never trusted.

Happens-before is the analyser's vector clocks (`harness.records.clocks`): the replay's
nodes start from the replay stream's clock at the launch, and a node also carries the clock
of every event a wait node among its ancestors waits on (its latest record at the launch).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from harness.records.analysis import RaceKind
from harness.records.clocks import Clock, Stamp, StreamClocks
from harness.records.trace import (
    Copy,
    CopyToHost,
    Delay,
    EventId,
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

__all__ = [
    "NodeKind", "GraphNode", "GraphModel", "GraphFinding", "GraphCheck", "GraphSummary", "GraphSource",
    "chain_model", "spans_from_frontiers", "check_replays", "compare_record", "check_graphs",
]


class NodeKind(str, enum.Enum):
    KERNEL = "kernel"
    MEMCPY = "memcpy"
    MEMSET = "memset"
    WAIT = "wait"  # an event wait node (an external event waited on under capture)
    RECORD = "record"  # an event record node
    EMPTY = "empty"
    OTHER = "other"  # host, child graph, memory nodes, stream memory operations ...

    @property
    def work(self) -> bool:
        """Device work that can touch a pool (what a step's accesses run as)."""
        return self in (NodeKind.KERNEL, NodeKind.MEMCPY, NodeKind.MEMSET)


@dataclass(frozen=True)
class GraphNode:
    id: int  # unique within its graph
    kind: NodeKind
    name: str = ""  # a kernel's function name; what a simulated node stands for
    event: EventId | None = None  # wait and record nodes: the harness's id of the event (None: not one of its own)


@dataclass(frozen=True)
class GraphModel:
    """One captured graph: nodes, edges (from, to: `to` runs after `from`), and `spans[i]`, the
    nodes the graph's i-th captured op added (in topological order)."""

    graph: GraphId
    nodes: tuple[GraphNode, ...]
    edges: tuple[tuple[int, int], ...]
    spans: tuple[tuple[int, ...], ...]
    source: str = "sim"  # who read it: "cuda" (the driver's graph) or "sim" (built from the op list)

    @cached_property
    def by_id(self) -> dict[int, GraphNode]:
        return {n.id: n for n in self.nodes}

    @cached_property
    def order(self) -> tuple[int, ...]:
        """Node ids in a topological order (ValueError on a cycle)."""
        return _topological([n.id for n in self.nodes], self.edges)

    @cached_property
    def ancestors(self) -> dict[int, frozenset[int]]:
        """Each node's ancestors (not itself): everything an edge path orders before it."""
        return _ancestors(self.order, self.edges)

    def count(self, kind: NodeKind) -> int:
        return sum(n.kind is kind for n in self.nodes)

    @property
    def work_nodes(self) -> int:
        return sum(n.kind.work for n in self.nodes)


def _topological(ids: Sequence[int], edges: Iterable[tuple[int, int]]) -> tuple[int, ...]:
    preds: dict[int, int] = dict.fromkeys(ids, 0)
    succs: dict[int, list[int]] = {i: [] for i in ids}
    for a, b in edges:
        if a not in preds or b not in preds:
            raise ValueError(f"edge {a}->{b} names a node the graph does not hold")
        succs[a].append(b)
        preds[b] += 1
    ready = [i for i in ids if preds[i] == 0]
    out: list[int] = []
    while ready:
        n = ready.pop(0)
        out.append(n)
        for m in succs[n]:
            preds[m] -= 1
            if preds[m] == 0:
                ready.append(m)
    if len(out) != len(ids):
        raise ValueError("the graph has a cycle")
    return tuple(out)


def _ancestors(order: Sequence[int], edges: Iterable[tuple[int, int]]) -> dict[int, frozenset[int]]:
    preds: dict[int, list[int]] = {i: [] for i in order}
    for a, b in edges:
        preds[b].append(a)
    anc: dict[int, frozenset[int]] = {}
    for n in order:  # parents first
        s: set[int] = set()
        for p in preds[n]:
            s.add(p)
            s |= anc[p]
        anc[n] = frozenset(s)
    return anc


def spans_from_frontiers(
    ids: Sequence[int], edges: Sequence[tuple[int, int]], frontiers: Sequence[Sequence[int]]
) -> tuple[tuple[int, ...], ...]:
    """The nodes each captured op added, from the capture's frontier before each op and at the end.

    The frontier (`cudaStreamGetCaptureInfo`'s dependency set) is the set of nodes the next
    captured work will depend on; everything captured so far on that stream is it or one of its
    ancestors. So op i added the nodes at or above frontier i+1 that are not at or above
    frontier i. This needs neither the driver's node order nor kernel names, and survives
    several kernels per op (a torch op launches one or many; a copy may become a memcpy node).
    `frontiers` has one entry more than there are ops.
    """
    order = _topological(ids, edges)
    rank = {n: i for i, n in enumerate(order)}
    preds: dict[int, list[int]] = {i: [] for i in order}
    for a, b in edges:
        preds[b].append(a)
    # Walk up from each frontier, stopping at what earlier frontiers covered: each node once.
    covered: set[int] = set()
    spans: list[tuple[int, ...]] = []
    for i, front in enumerate(frontiers):
        new: set[int] = set()
        stack = list(front)
        while stack:
            n = stack.pop()
            if n in covered or n in new:
                continue
            new.add(n)
            stack.extend(preds[n])
        covered |= new
        if i:
            spans.append(tuple(sorted(new, key=rank.__getitem__)))
    return tuple(spans)


def chain_model(graph: GraphId, body: Sequence[Op], source: str = "sim") -> GraphModel:
    """The graph a single-stream capture of `body` makes: one node per op, each after the one before.

    What the simulator's graphs are (it captures on one stream, as the harness's runners do);
    a test builds a graph by hand from it and then breaks it.
    """
    nodes = tuple(GraphNode(i, *_node_of(op)) for i, op in enumerate(body))
    edges = tuple((i, i + 1) for i in range(len(body) - 1))
    return GraphModel(graph, nodes, edges, tuple((i,) for i in range(len(body))), source)


def _node_of(op: Op) -> tuple[NodeKind, str, EventId | None]:
    if isinstance(op, Kernel):
        return NodeKind.KERNEL, op.what or "kernel", None
    if isinstance(op, Wait):
        return NodeKind.WAIT, f"wait e{op.event}", op.event
    if isinstance(op, Record):
        return NodeKind.RECORD, f"record e{op.event}", op.event
    if isinstance(op, (Copy, CopyToHost)):
        return NodeKind.MEMCPY, "memcpy", None
    if isinstance(op, Delay):
        return NodeKind.KERNEL, "delay", None
    return NodeKind.OTHER, type(op).__name__.lower(), None


# ---------------------------------------------------------------- the check


@dataclass(frozen=True)
class GraphFinding:
    """A node of a graph that reads or writes a loaded region with nothing ordering it after the copy."""

    kind: RaceKind  # read-after-write (the node reads) or write-after-write (it writes)
    graph: GraphId
    node: int
    kernel: str  # the node's kernel name (the driver's), or what a simulated node stands for
    step: str  # the captured op it belongs to (the model's step)
    access_region: Region
    copy_region: Region
    copy_stream: str
    replay_stream: str
    event: EventId | None  # the load event: the first recorded on the copy's stream after it (None: none)

    def describe(self) -> str:
        verb = "writes" if self.kind is RaceKind.WRITE_AFTER_WRITE else "reads"
        who = f"graph {self.graph} node {self.node} ({self.kernel}, step {self.step or '?'})"
        copy = f"the H2D copy on {self.copy_stream} that writes {self.copy_region}"
        if self.event is None:
            missing = f"no event is recorded after that copy on {self.copy_stream}"
        else:
            missing = (f"no wait node on event {self.event} (recorded after that copy) reaches it, and "
                       f"{self.replay_stream} waited on no such event before the replay")
        return f"{who} {verb} {self.access_region}, but nothing orders it after {copy}: {missing}"


@dataclass(frozen=True)
class _LoadCopy:
    stamp: Stamp
    region: Region
    at: int  # its index in the trace's ops


def check_replays(trace: Trace, models: Mapping[GraphId, GraphModel]) -> list[GraphFinding]:
    """Findings for every replay in `trace` of a graph in `models` (others are not checked here).

    Deduplicated by (graph, step, copy region, kind), in the order first found.
    """
    clocks = StreamClocks()
    events: dict[EventId, Clock] = {}
    copies: list[_LoadCopy] = []
    findings: list[GraphFinding] = []
    seen: set[tuple] = set()

    def name(sid: StreamId) -> str:
        return trace.stream_names.get(sid, f"stream{sid}")

    def load_event(copy: _LoadCopy) -> EventId | None:
        for op in trace.ops[copy.at + 1:]:
            if isinstance(op, Record) and op.stream == copy.stamp.stream:
                return op.event
        return None

    for at, op in enumerate(trace.ops):
        if isinstance(op, Record):
            events[op.event] = clocks.record(op.stream)
        elif isinstance(op, Wait):
            clocks.wait(op.stream, events.get(op.event))
        elif isinstance(op, HostSync):
            clocks.host_sync()
        elif isinstance(op, HostWait):
            clocks.host_wait(events.get(op.event))
        elif isinstance(op, Copy):
            copies.append(_LoadCopy(clocks.stamp(op.stream), op.dst, at))
        elif isinstance(op, Replay):
            model = models.get(op.graph)
            if model is None:
                _replay_by_body(clocks, events, op)
                continue
            for f in _check_one(model, op, clocks.clock(op.stream), events, copies, name, load_event):
                key = (f.graph, f.step, f.copy_region, f.kind)
                if key not in seen:
                    seen.add(key)
                    findings.append(f)
            _replay_by_graph(clocks, events, model, op)
        # Kernels, D2H copies, host writes, delays and holds order nothing here.
    return findings


def _node_clocks(model: GraphModel, base: Clock, events: Mapping[EventId, Clock]) -> dict[int, Clock]:
    """Each node's clock: the replay stream's at launch, joined with the events its ancestor waits wait on."""
    # The wait nodes above each node, parents first (a graph holds few of them, so the sets stay small).
    above: dict[int, frozenset[int]] = {}
    preds: dict[int, list[int]] = {n: [] for n in model.order}
    for a, b in model.edges:
        preds[b].append(a)
    out: dict[int, Clock] = {}
    for n in model.order:
        waits: set[int] = set()
        for p in preds[n]:
            waits |= above[p]
            node = model.by_id[p]
            if node.kind is NodeKind.WAIT and node.event is not None:
                waits.add(node.event)
        above[n] = frozenset(waits)
        c = dict(base)
        for event in waits:
            for s, e in events.get(event, {}).items():
                c[s] = max(c.get(s, e), e)
        out[n] = c
    return out


def _check_one(model, op: Replay, base: Clock, events, copies, name, load_event) -> Iterable[GraphFinding]:
    clocks = _node_clocks(model, base, events)
    for captured, span in zip(op.body, model.spans, strict=False):
        if not isinstance(captured, Kernel) or not captured.touches_pools:
            continue
        sides = [(r, RaceKind.READ_AFTER_WRITE) for r in captured.reads]
        sides += [(w, RaceKind.WRITE_AFTER_WRITE) for w in captured.writes]
        for node_id in span:
            node = model.by_id[node_id]
            if not node.kind.work:
                continue
            c = clocks[node_id]
            for region, kind in sides:
                for copy in copies:
                    if copy.region.overlaps(region) and c.get(copy.stamp.stream, -1) < copy.stamp.epoch:
                        yield GraphFinding(kind, model.graph, node.id, node.name, captured.what, region,
                                           copy.region, name(copy.stamp.stream), name(op.stream),
                                           load_event(copy))


def _replay_by_graph(clocks: StreamClocks, events: dict[EventId, Clock], model: GraphModel, op: Replay) -> None:
    """After a replay its stream is ordered after every event its wait nodes waited on; its record
    nodes record on it (in topological order)."""
    for n in model.order:
        node = model.by_id[n]
        if node.kind is NodeKind.WAIT and node.event is not None:
            clocks.wait(op.stream, events.get(node.event))
        elif node.kind is NodeKind.RECORD and node.event is not None:
            events[node.event] = clocks.record(op.stream)


def _replay_by_body(clocks: StreamClocks, events: dict[EventId, Clock], op: Replay) -> None:
    """A replay of a graph with no model: its op list's graph waits and records, as the analyser does."""
    for inner in op.body:
        if isinstance(inner, Wait) and inner.in_graph:
            clocks.wait(op.stream, events.get(inner.event))
        elif isinstance(inner, Record):
            events[inner.event] = clocks.record(op.stream)


# ---------------------------------------------------------------- the record against the graph


def compare_record(body: Sequence[Op], model: GraphModel) -> list[str]:
    """Where the op list recorded for a capture differs from the graph; empty when they match."""
    out: list[str] = []
    g = f"graph {model.graph}"
    if len(model.spans) != len(body):
        return [f"{g}: the op list holds {len(body)} captured ops, the graph's capture marked {len(model.spans)}"]
    covered: set[int] = set()
    for i, (op, span) in enumerate(zip(body, model.spans, strict=True)):
        covered |= set(span)
        nodes = [model.by_id[n] for n in span]
        waits = [n for n in nodes if n.kind is NodeKind.WAIT]
        records = [n for n in nodes if n.kind is NodeKind.RECORD]
        if isinstance(op, Wait):
            if [n.event for n in waits] != [op.event] or records:
                out.append(f"{g}: op {i} waits on event {op.event}; the graph holds {_what(nodes)} there")
        elif isinstance(op, Record):
            if [n.event for n in records] != [op.event] or waits:
                out.append(f"{g}: op {i} records event {op.event}; the graph holds {_what(nodes)} there")
        elif isinstance(op, Kernel):
            if waits or records or not any(n.kind.work for n in nodes):
                out.append(f"{g}: op {i} ({op.what or 'kernel'}) is device work; the graph holds {_what(nodes)} there")
        elif isinstance(op, (HostSync, HostWait, Replay)):
            out.append(f"{g}: op {i} ({type(op).__name__}) cannot be captured")
        elif isinstance(op, Hold) and (waits or records):
            out.append(f"{g}: op {i} holds on a gate; the graph holds {_what(nodes)} there")
    for n in model.nodes:
        if n.id not in covered and n.kind in (NodeKind.WAIT, NodeKind.RECORD):
            what = "waits on" if n.kind is NodeKind.WAIT else "records"
            ev = f"event {n.event}" if n.event is not None else "an event the harness did not make"
            out.append(f"{g}: node {n.id} {what} {ev}, which no captured op of the op list accounts for")
    return out


def _what(nodes: Sequence[GraphNode]) -> str:
    if not nodes:
        return "no node"
    parts = [f"{n.kind.value}" + (f" on event {n.event}" if n.event is not None else "") for n in nodes[:4]]
    more = f" and {len(nodes) - 4} more" if len(nodes) > 4 else ""
    return ", ".join(parts) + more


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
    def mismatches(self) -> list[str]:
        return [m for g in self.graphs for m in g.mismatches]

    def mismatch_line(self) -> str:
        """The scenario's error when the op list does not match a graph: one line."""
        found = self.mismatches
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        return f"the op list recorded for a capture does not match the graph the device holds: {found[0]}{more}"


@dataclass
class GraphSource:
    """What a device gives the check: the graph models it could read, and why any could not."""

    models: dict[GraphId, GraphModel] = field(default_factory=dict)
    unavailable: str | None = None


def summarise(model: GraphModel, body: Sequence[Op]) -> GraphSummary:
    steps = tuple(
        (op.what, sum(model.by_id[n].kind.work for n in span))
        for op, span in zip(body, model.spans, strict=False)
        if isinstance(op, Kernel) and op.touches_pools
    )
    return GraphSummary(model.graph, model.source, len(model.nodes), model.count(NodeKind.WAIT),
                        model.count(NodeKind.RECORD), model.work_nodes, steps, tuple(compare_record(body, model)))


def check_graphs(trace: Trace, source: GraphSource) -> GraphCheck:
    """The graph check of a traced replay: each replayed graph's summary and comparison, and the findings."""
    if source.unavailable is not None and not source.models:
        return GraphCheck(unavailable=source.unavailable)
    bodies = {op.graph: op.body for op in trace.ops if isinstance(op, Replay)}
    summaries = tuple(summarise(m, bodies[g]) for g, m in source.models.items() if g in bodies)
    return GraphCheck(summaries, tuple(check_replays(trace, source.models)), source.unavailable)
