"""`GraphReader.read` on fake cuda-bindings: the calls it makes and how it turns their answers
into a `GraphModel` (the real bindings run only on a GPU, in tests/gpu/test_gpu_graph.py)."""

# ruff: noqa: N803, N815  (the fakes keep the CUDA API's own names)
from __future__ import annotations

import enum
from types import SimpleNamespace

import pytest

from harness.devices import cuda_graph
from harness.devices.cuda_graph import GraphReader
from harness.records.graph_model import NodeKind

OK = 0


class RtKind(enum.Enum):
    cudaGraphNodeTypeKernel = 0
    cudaGraphNodeTypeMemcpy = 1
    cudaGraphNodeTypeMemset = 2
    cudaGraphNodeTypeWaitEvent = 6
    cudaGraphNodeTypeEventRecord = 7
    cudaGraphNodeTypeEmpty = 5


class CuKind(enum.Enum):
    CU_GRAPH_NODE_TYPE_KERNEL = 0
    CU_GRAPH_NODE_TYPE_BATCH_MEM_OP = 12


def _no_name(*_args):
    raise AssertionError("the reader asked the driver for a kernel's function name")


def fake_bindings(kinds: dict[int, RtKind], edges: list[tuple[int, int]], events: dict[int, int]):
    """Node handles are ints; `kinds` their runtime kinds, `events` a wait/record node's event handle.
    The calls that name a kernel's function raise: on an H200 a thousand of them segfaulted."""
    handles = list(kinds)

    def get_nodes(graph, numNodes):
        return (OK, handles[:numNodes] if numNodes else [], len(handles))

    def get_edges(graph, numEdges):
        froms, tos = [a for a, _ in edges], [b for _, b in edges]
        if not numEdges:
            return (OK, [], [], [], len(edges))
        return (OK, froms, tos, [None] * len(edges), len(edges))

    rt = SimpleNamespace(
        cudaGraphNodeType=RtKind,
        cudaStreamGetCaptureInfo=lambda stream: (OK,),
        cudaGraphGetNodes=get_nodes,
        cudaGraphGetEdges=get_edges,
        cudaGraphNodeGetType=lambda h: (OK, kinds[int(h)]),
        cudaGraphEventWaitNodeGetEvent=lambda h: (OK, events[int(h)]),
        cudaGraphEventRecordNodeGetEvent=lambda h: (OK, events[int(h)]),
    )
    cu = SimpleNamespace(
        CUgraphNode=lambda init_value: init_value,
        CUgraphNodeType=CuKind,
        cuGraphNodeGetType=lambda node: (OK, CuKind.CU_GRAPH_NODE_TYPE_KERNEL),
        cuGraphKernelNodeGetParams=_no_name,
        cuFuncGetName=_no_name,
        cuKernelGetName=_no_name,
    )
    return rt, cu


@pytest.fixture
def reader(monkeypatch):
    def make(kinds, edges, events):
        monkeypatch.setattr(cuda_graph, "_bindings", lambda: fake_bindings(kinds, edges, events))
        return GraphReader()
    return make


def test_a_graph_is_read_as_its_nodes_kinds_events_and_edges_without_naming_kernels(reader):
    # wait(e=0xe1) -> kernel -> kernel -> record(e=0xe1); the harness knows event 0xe1 as its id 7.
    kinds = {100: RtKind.cudaGraphNodeTypeWaitEvent, 101: RtKind.cudaGraphNodeTypeKernel,
             102: RtKind.cudaGraphNodeTypeKernel, 103: RtKind.cudaGraphNodeTypeEventRecord}
    edges = [(100, 101), (101, 102), (102, 103)]
    model = reader(kinds, edges, {100: 0xE1, 103: 0xE1}).read(1, 5, [[], [100], [102], [103]], {0xE1: 7})
    assert [n.kind for n in model.nodes] == [NodeKind.WAIT, NodeKind.KERNEL, NodeKind.KERNEL, NodeKind.RECORD]
    assert [n.name for n in model.nodes if n.kind is NodeKind.KERNEL] == ["kernel", "kernel"]
    assert [n.event for n in model.nodes] == [7, None, None, 7]
    assert model.edges == ((0, 1), (1, 2), (2, 3))
    assert model.spans == ((0,), (1, 2), (3,))
    assert model.graph == 5 and model.source == "cuda"


def test_an_edge_to_a_node_the_graph_does_not_list_is_left_out(reader):
    kinds = {1: RtKind.cudaGraphNodeTypeKernel, 2: RtKind.cudaGraphNodeTypeKernel}
    model = reader(kinds, [(1, 2), (2, 99)], {}).read(1, 0, [[], [2]], {})
    assert model.edges == ((0, 1),)


def test_a_failing_call_is_graph_unavailable_naming_it(reader, monkeypatch):
    from harness.records.errors import GraphUnavailable

    r = reader({1: RtKind.cudaGraphNodeTypeKernel}, [], {})
    monkeypatch.setattr(r.rt, "cudaGraphGetNodes", lambda graph, numNodes: (700, [], 0))
    with pytest.raises(GraphUnavailable, match="cudaGraphGetNodes failed: 700"):
        r.read(1, 0, [[]], {})
