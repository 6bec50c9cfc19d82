"""Read a captured CUDA graph by its own nodes and edges, through cuda-bindings' runtime API.

One path on every torch that can keep a graph (`torch.cuda.CUDAGraph(keep_graph=True)`):
`raw_cuda_graph()` and cuda-bindings. torch's own `CUDAGraph.get_graph_data()` (2.13 and later)
makes the same calls but does not say which event a wait or record node is on, which is what
the check needs, and it needs a 13.1 driver for its tools ids; so it is not used.

- `frontier(stream)`: the capture's dependency set now (`cudaStreamGetCaptureInfo`), as node
  handles. The device takes it before every captured op and once at the end, and
  `harness.records.graph_model.spans_from_frontiers` turns those into the nodes of each op.
- `read(...)`: nodes (`cudaGraphGetNodes`, `cudaGraphNodeGetType`), events of wait and record
  nodes (`cudaGraphEventWaitNodeGetEvent`, `cudaGraphEventRecordNodeGetEvent`), and edges
  (`cudaGraphGetEdges`), into a `harness.records.graph_model.GraphModel`.
- kernel nodes are named "kernel", not by their function: on an H200 (driver 580.159.04,
  cuda-bindings 13.3.1) the driver's `cuFuncGetName` named some (the index-copy kernels of every
  finding of a `make gpu-test`) but answered CUDA_ERROR_INVALID_HANDLE for others (an in-place
  add's), and a thousand such failing calls segfaulted the process, through cuda-bindings and
  through ctypes alike. The check needs a node's kind and its edges, never its name; a finding
  loses only the kernel's name, until a way to ask that cannot fail so is checked on a GPU.
- stream memory operations (`cuStreamWaitValue32` / `cuStreamWriteValue32` captured: a batch
  mem-op node, which only the driver's API knows): `cuGraphBatchMemOpNodeGetParams` gives its
  operations; a single GEQ wait or 32-bit writes of one value, on addresses that are the
  harness's flags (`flags`: device address -> flag id), become value-wait / value-write nodes.
  Anything else (another operation, several kinds at once, an address that is no flag of the
  harness's) is read as what it is, and `compare_record` reports it: never a silent pass.

The bindings' return tuples changed between CUDA 12 and 13 (an edge-data list was added), so
results are read by what they hold (the first list, the last count), not by position.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from typing import Any

from harness.records.errors import GraphUnavailable
from harness.records.graph_model import GraphModel, GraphNode, NodeKind, spans_from_frontiers


def _bindings() -> tuple[Any, Any]:
    try:
        from cuda.bindings import driver, runtime
    except ImportError:
        try:
            from cuda import cuda as driver  # cuda-python before 12.6
            from cuda import cudart as runtime
        except ImportError as e:
            raise GraphUnavailable("cuda.bindings is not importable (pip install cuda-bindings)") from e
    return runtime, driver


class GraphReader:
    def __init__(self) -> None:
        self.rt, self.cu = _bindings()
        rt = self.rt
        t = rt.cudaGraphNodeType
        self.kinds = {
            t.cudaGraphNodeTypeKernel: NodeKind.KERNEL,
            t.cudaGraphNodeTypeMemcpy: NodeKind.MEMCPY,
            t.cudaGraphNodeTypeMemset: NodeKind.MEMSET,
            t.cudaGraphNodeTypeWaitEvent: NodeKind.WAIT,
            t.cudaGraphNodeTypeEventRecord: NodeKind.RECORD,
            t.cudaGraphNodeTypeEmpty: NodeKind.EMPTY,
        }
        # CUDA 12's bindings name the full query _v2/_v3; 13's plain name is it.
        self._capture_info = (getattr(rt, "cudaStreamGetCaptureInfo_v3", None)
                              or getattr(rt, "cudaStreamGetCaptureInfo_v2", None) or rt.cudaStreamGetCaptureInfo)

    def _ok(self, result: Any, call: str) -> tuple:
        out = result if isinstance(result, tuple) else (result,)
        if int(out[0]) != 0:  # cudaSuccess
            raise GraphUnavailable(f"{call} failed: {out[0]}")
        return out[1:]

    def frontier(self, stream: int) -> tuple[int, ...]:
        """The handles of the nodes the next work captured on `stream` will depend on."""
        out = self._ok(self._capture_info(stream), "cudaStreamGetCaptureInfo")
        deps = next((x for x in out if isinstance(x, list)), None)
        if deps is None:
            raise GraphUnavailable("cudaStreamGetCaptureInfo returned no dependency set (cuda-bindings too old)")
        return tuple(int(d) for d in deps)

    def read(self, graph: int, graph_id: int, frontiers: Sequence[Sequence[int]],
             events: Mapping[int, int], source: str = "cuda", flags: Mapping[int, int] | None = None) -> GraphModel:
        """The graph `graph` (a cudaGraph_t) as a model; `frontiers` (handles, one more than the
        captured ops) give its spans; `events` maps a CUDA event handle to the harness's id, and
        `flags` a flag's device address to the harness's id."""
        rt = self.rt
        num = int(self._ok(rt.cudaGraphGetNodes(graph, numNodes=0), "cudaGraphGetNodes")[-1])
        handles = []
        if num:
            out = self._ok(rt.cudaGraphGetNodes(graph, numNodes=num), "cudaGraphGetNodes")
            handles = list(next(x for x in out if isinstance(x, list)))[:num]
        index = {int(h): i for i, h in enumerate(handles)}
        nodes = tuple(self._node(i, h, events, flags or {}) for i, h in enumerate(handles))
        edges = self._edges(graph, index)
        spans = spans_from_frontiers([n.id for n in nodes], edges,
                                     [[index[h] for h in f if h in index] for f in frontiers])
        return GraphModel(graph_id, nodes, edges, spans, source)

    def _node(self, i: int, handle: Any, events: Mapping[int, int], flags: Mapping[int, int]) -> GraphNode:
        rt, cu = self.rt, self.cu
        # The driver's type first: the runtime's enum has no batch mem-op node.
        node = cu.CUgraphNode(init_value=int(handle))
        (driver_kind,) = self._ok(cu.cuGraphNodeGetType(node), "cuGraphNodeGetType")
        if driver_kind == cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_BATCH_MEM_OP:
            return self._mem_op(i, node, flags)
        (raw_kind,) = self._ok(rt.cudaGraphNodeGetType(handle), "cudaGraphNodeGetType")
        kind = self.kinds.get(raw_kind, NodeKind.OTHER)
        if kind in (NodeKind.WAIT, NodeKind.RECORD):
            get = rt.cudaGraphEventWaitNodeGetEvent if kind is NodeKind.WAIT else rt.cudaGraphEventRecordNodeGetEvent
            (event,) = self._ok(get(handle), "cudaGraph*NodeGetEvent")
            raw = int(event)
            return GraphNode(i, kind, f"{kind.value} 0x{raw:x}", events.get(raw))
        return GraphNode(i, kind, kind.value if kind is not NodeKind.OTHER else str(raw_kind))

    def _mem_op(self, i: int, node: Any, flags: Mapping[int, int]) -> GraphNode:
        """A batch mem-op node as a value wait or write on the harness's flags, or MEM_OP saying why not."""
        cu = self.cu
        (params,) = self._ok(cu.cuGraphBatchMemOpNodeGetParams(node), "cuGraphBatchMemOpNodeGetParams")
        try:
            ops = [decode_mem_op(cu, p) for p in param_array(cu, params)]
        except (AttributeError, TypeError, ValueError) as e:  # bindings that decode it otherwise
            return GraphNode(i, NodeKind.MEM_OP, f"batch mem-op node the bindings could not decode: {e}")
        return mem_op_node(i, ops, flags)

    def _edges(self, graph: int, index: Mapping[int, int]) -> tuple[tuple[int, int], ...]:
        rt = self.rt
        num = int(self._ok(rt.cudaGraphGetEdges(graph, numEdges=0), "cudaGraphGetEdges")[-1])
        if not num:
            return ()
        out = self._ok(rt.cudaGraphGetEdges(graph, numEdges=num), "cudaGraphGetEdges")
        lists = [x for x in out if isinstance(x, list)]
        froms, tos = lists[0][:num], lists[1][:num]
        return tuple((index[int(a)], index[int(b)]) for a, b in zip(froms, tos, strict=True)
                     if int(a) in index and int(b) in index)


# One stream memory operation: (operation, device address, value, flags), the driver's enums as names.
MemOp = tuple[str, int, int, str]


class _BatchMemOpNodeParams(ctypes.Structure):
    """The C layout of `CUDA_BATCH_MEM_OP_NODE_PARAMS` (`cuda.h`), to find its operations' array."""

    _fields_ = [("ctx", ctypes.c_void_p), ("count", ctypes.c_uint), ("paramArray", ctypes.c_void_p),
                ("flags", ctypes.c_uint)]


# sizeof(CUstreamBatchMemOpParams): a union padded to six 64-bit words (`cuuint64_t pad[6]`).
MEM_OP_PARAMS_BYTES = 48


def param_array(cu: Any, params: Any) -> list[Any]:
    """The operations of a batch mem-op node's parameters.

    cuda-bindings lists `paramArray` only for a struct whose array was set from Python; for the one
    `cuGraphBatchMemOpNodeGetParams` fills in, the list is empty whatever `count` says (seen with
    13.3.1 on an H200: every captured value wait read as an empty batch). So the array is found
    through the struct's own memory (`getPtr`, the C layout) and each element wrapped in place."""
    count = int(params.count)
    listed = list(params.paramArray)
    if len(listed) == count:
        return listed
    array = _BatchMemOpNodeParams.from_address(int(params.getPtr())).paramArray
    if not array:
        raise ValueError(f"a batch of {count} operations with no array")
    return [cu.CUstreamBatchMemOpParams(_ptr=array + k * MEM_OP_PARAMS_BYTES) for k in range(count)]


def decode_mem_op(cu: Any, p: Any) -> MemOp:
    """One `CUstreamBatchMemOpParams` as plain values."""
    t = cu.CUstreamBatchMemOpType
    op = p.operation
    if op == t.CU_STREAM_MEM_OP_WAIT_VALUE_32:
        v, bits = p.waitValue, int(p.waitValue.flags)
        # The low bits are the comparison; FLUSH (1 << 30) may be or-ed in.
        mode = cu.CUstreamWaitValue_flags(bits & 0x3).name + ("|FLUSH" if bits & (1 << 30) else "")
        return op.name, int(v.address), int(v.value), mode
    if op == t.CU_STREAM_MEM_OP_WRITE_VALUE_32:
        v = p.writeValue
        return op.name, int(v.address), int(v.value), cu.CUstreamWriteValue_flags(int(v.flags)).name
    return getattr(op, "name", str(op)), 0, 0, ""


def mem_op_node(i: int, ops: Sequence[MemOp], flags: Mapping[int, int]) -> GraphNode:
    """A batch mem-op node from its operations (pure: tested on the CPU).

    One 32-bit GEQ wait -> VALUE_WAIT on its flag; 32-bit writes of one value -> VALUE_WRITE on
    their flags. An address that is none of the harness's flags keeps the kind with no flag id
    (so `compare_record` names it); anything else is MEM_OP, named by its operations.
    """
    kinds = {o[0] for o in ops}
    name = "; ".join(f"{o[0]} 0x{o[1]:x} {o[2]} {o[3]}".strip() for o in ops) or "empty batch"
    if len(ops) == 1 and kinds == {"CU_STREAM_MEM_OP_WAIT_VALUE_32"} and ops[0][3] == "CU_STREAM_WAIT_VALUE_GEQ":
        _, address, value, _ = ops[0]
        flag = flags.get(address)
        return GraphNode(i, NodeKind.VALUE_WAIT, name, flags=(flag,) if flag is not None else (), value=value)
    # A write with no memory barrier may be seen before the copies ahead of it: it orders nothing we can name.
    if (ops and kinds == {"CU_STREAM_MEM_OP_WRITE_VALUE_32"} and len({o[2] for o in ops}) == 1
            and all(o[3] == "CU_STREAM_WRITE_VALUE_DEFAULT" for o in ops)):
        ids = [flags.get(o[1]) for o in ops]
        known = tuple(f for f in ids if f is not None)
        return GraphNode(i, NodeKind.VALUE_WRITE, name, flags=known if len(known) == len(ids) else (),
                         value=ops[0][2])
    return GraphNode(i, NodeKind.MEM_OP, name)
