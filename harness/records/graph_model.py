"""A captured graph by its own nodes and edges: the record the graph check reads (pure: no torch).

The op list (`harness.records.trace`) is the harness's record of what it captured; a
`GraphModel` is the graph the device will run: its nodes (kernels, copies, event waits and
records), its edges, and which nodes each captured op put there (`spans`, aligned with the
graph's op list). The CUDA device reads one from the driver (`harness.devices.cuda_graph`);
the simulator builds one from its op list (`chain_model`). The check of it is
`harness.checkers.graph`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from harness.records.trace import (
    Copy,
    CopyToHost,
    Delay,
    EventId,
    FlagId,
    FlagWait,
    FlagWrite,
    GraphId,
    Kernel,
    Op,
    Record,
    Wait,
)

__all__ = ["NodeKind", "GraphNode", "GraphModel", "GraphSource", "chain_model", "spans_from_frontiers"]


class NodeKind(str, enum.Enum):
    KERNEL = "kernel"
    MEMCPY = "memcpy"
    MEMSET = "memset"
    WAIT = "wait"  # an event wait node (an external event waited on under capture)
    RECORD = "record"  # an event record node
    VALUE_WAIT = "value-wait"  # a stream memory op: wait until a flag reaches a value (cuStreamWaitValue32, GEQ)
    VALUE_WRITE = "value-write"  # a stream memory op: write a value into flags (cuStreamWriteValue32)
    MEM_OP = "mem-op"  # a stream memory op the reader could not map (several kinds at once, a flush ...)
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
    name: str = ""  # what a simulated node stands for; a kernel read from the driver: "kernel" (see cuda_graph)
    event: EventId | None = None  # wait and record nodes: the harness's id of the event (None: not one of its own)
    # Value-wait and value-write nodes: the harness's ids of the flags (a wait: one; () where the
    # address is not one of the harness's flags) and the value waited for or written.
    flags: tuple[FlagId, ...] = ()
    value: int | None = None


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
    nodes = tuple(_node_of(i, op) for i, op in enumerate(body))
    edges = tuple((i, i + 1) for i in range(len(body) - 1))
    return GraphModel(graph, nodes, edges, tuple((i,) for i in range(len(body))), source)


def _node_of(i: int, op: Op) -> GraphNode:
    if isinstance(op, Kernel):
        return GraphNode(i, NodeKind.KERNEL, op.what or "kernel")
    if isinstance(op, Wait):
        return GraphNode(i, NodeKind.WAIT, f"wait e{op.event}", op.event)
    if isinstance(op, Record):
        return GraphNode(i, NodeKind.RECORD, f"record e{op.event}", op.event)
    if isinstance(op, FlagWait):
        return GraphNode(i, NodeKind.VALUE_WAIT, f"wait f{op.flag} >= {op.value}", flags=(op.flag,), value=op.value)
    if isinstance(op, FlagWrite):
        names = ",".join(f"f{f}" for f in op.flags)
        return GraphNode(i, NodeKind.VALUE_WRITE, f"write {names} = {op.value}", flags=op.flags, value=op.value)
    if isinstance(op, (Copy, CopyToHost)):
        return GraphNode(i, NodeKind.MEMCPY, "memcpy")
    if isinstance(op, Delay):
        return GraphNode(i, NodeKind.KERNEL, "delay")
    return GraphNode(i, NodeKind.OTHER, type(op).__name__.lower())


@dataclass
class GraphSource:
    """What a device gives the check: the graph models it could read, and why any could not."""

    models: dict[GraphId, GraphModel] = field(default_factory=dict)
    unavailable: str | None = None
