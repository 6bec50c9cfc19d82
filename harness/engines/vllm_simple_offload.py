"""vLLM's SimpleCPUOffloadConnector's worker as the write-back: the store-before-compute hazard
through its own store path (vllm-project/vllm#45704, fixed by #46278).

The connector (0.19.0 on) defers both its loads and its stores to `get_finished()`, after the model
has run, and launches them on a background thread as batched copies (`cuMemcpyBatchAsync`). Before
#46278 (in 0.24.0) the store had no cross-stream wait at all and its copies read the KV cache with
`srcAccessOrder=ANY` (the source may be read out of stream order); from 0.24.0 `get_finished` records
a compute-done event on the current (compute) stream, the copy thread makes the store stream wait on
it, and stores read with `srcAccessOrder=STREAM`.

What runs as vLLM's code (`vllm/v1/simple_kv_offload/`): `SimpleCPUOffloadWorker(vllm_config,
kv_cache_config, cpu_capacity_bytes)` and its `register_kv_caches` (the int8 block views of each
cache's storage, K and V apart; the CPU tensors; the load and store streams; the copy backend's
parameters, `build_params`, with each direction's `srcAccessOrder`), `bind_connector_metadata` and
`get_finished` (the compute-done event where the release has it, `DmaCopyBackend.launch_copy`), the
copy thread's own loop (`DmaCopyBackend._copy_loop`: the store stream's wait on the event, vLLM's
`copy_blocks`, which builds the batch's pointer arrays, and the event it records after them).

What the harness supplies, patched into vLLM's modules only while one of its calls runs:

- the compiled batched copy, `cuda_mem_ops._batch_memcpy_fn` (`cuMemcpyBatchAsync`): its pointer
  arrays read back to the caches' pools, layers and rows, each run of consecutive rows one harness copy
  (`dev.copy_to_host` for a store) with the regions it touches. `srcAccessOrder` is read from the
  call's attributes: STREAM copies on the stream vLLM passed; ANY copies on a side stream of their own
  that waits on nothing (the source may be read before the stream's earlier work, its waits included),
  and the stream vLLM passed then waits for them;
- `torch.cuda.Stream` (with `priority_range`), `current_stream`, `stream` and `torch.Event`: the
  harness device's streams and events, each stream given a handle (`cuda_stream`) the copy finds it by;
- the copy thread: `threading.Thread` in the copy backend's module starts nothing, and the harness
  runs vLLM's own loop on the host thread right after each `get_finished`, until the queue is empty
  (the order of the thread's enqueues against the host's is then fixed);
- the CPU tensors (`torch.zeros`): views of the probes' host copy (`HostBackup`, laid out as one
  `[2, layers, tokens, kv_heads, head_dim]` buffer), so what vLLM's copies write is what the harness
  compares; pinning off (the harness's host memory is its own);
- the device's platform calls (`set_device`, `is_rocm`): nothing, and False.

The connector's scheduling is the harness's: the store of the batch's new tokens is one store event
(`SimpleCPUOffloadMetadata`: GPU blocks the requests' new slots, CPU blocks their rows in batch order)
bound and launched through `get_finished` right after the forward is enqueued, with the forward stream
current, as the model runner calls `get_finished` after the model has run.

`no_write_fence` (the teeth): `torch.cuda.current_stream()` as the worker sees it answers an idle
stream of its own, so the compute-done event orders nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from harness.devices.base import Device, Stream, dtype_of
from harness.engines.engine import construct
from harness.engines.vllm_pools import plain
from harness.engines.vllm_stand_ins import EngineStore, HostCopyTorch, StreamsOf, host_view, patched
from harness.protocol.layout import Layout
from harness.protocol.pools import HybridPool
from harness.protocol.writeback import HostBackup
from harness.records.errors import EngineContractBroken
from harness.records.trace import Pool, Region

WORKER = "vllm.v1.simple_kv_offload.worker"
BACKEND = "vllm.v1.simple_kv_offload.copy_backend"
MEM_OPS = "vllm.v1.simple_kv_offload.cuda_mem_ops"
METADATA = "vllm.v1.simple_kv_offload.metadata"
NEEDED = {
    WORKER: ("SimpleCPUOffloadWorker.register_kv_caches", "SimpleCPUOffloadWorker.bind_connector_metadata",
             "SimpleCPUOffloadWorker.get_finished", "torch"),
    BACKEND: ("DmaCopyBackend._copy_loop", "threading", "torch", "current_platform"),
    MEM_OPS: ("copy_blocks", "build_params", "_CUmemcpyAttributes", "current_platform"),
    METADATA: ("SimpleCPUOffloadMetadata",),
}
# CUmemcpySrcAccessOrder (CUDA driver API): the source read in stream order, or possibly out of it.
SRC_ACCESS_ORDER_STREAM, SRC_ACCESS_ORDER_ANY = 1, 3
HOST = "backup"


class _Streams(StreamsOf):
    """`torch.cuda` as the worker reaches it; its `Stream` also answers `priority_range()`."""

    def __init__(self, owner: Any):
        super().__init__(owner, "simple-offload", torch.cuda)
        make = super().Stream

        class Streams:
            def __call__(self, *args: Any, **kwargs: Any) -> Stream:
                s = make()
                owner.handles[id(s)] = s
                s.cuda_stream = id(s)  # type: ignore[attr-defined]  # what vLLM's build_params reads
                return s

            @staticmethod
            def priority_range() -> tuple[int, int]:
                return 0, -1

        self.Stream = Streams()  # type: ignore[method-assign]


class _Platform:
    """The device calls vLLM's copy thread and copy make on its platform: none of them is needed."""

    def set_device(self, device: Any) -> None:
        return None

    def is_rocm(self) -> bool:
        return False


class VllmSimpleOffload(EngineStore):
    """The write-back of one scenario through SimpleCPUOffloadConnector's worker (the module's text)."""

    WHAT = "SimpleCPUOffloadConnector's store"

    def __init__(self, engine: Any, dev: Device, layout: Layout, pool: HybridPool, forward: Stream,
                 host: HostBackup, kv_cache_config: Any):
        s = layout.shape
        if s.mamba_layers:
            raise EngineContractBroken("SimpleCPUOffloadConnector's worker here moves attention KV only; the model has "
                                       "Mamba layers")
        names, caches = getattr(pool, "names", None), getattr(pool, "caches", None)
        registered = getattr(pool, "registered", None)
        if names is None or caches is None or registered is None:
            raise EngineContractBroken("SimpleCPUOffloadConnector's worker copies vLLM's KV caches (the vLLM adapter's "
                                       "pools)")
        n_a, t = len(s.attention_layers), layout.total_new
        dt = dtype_of(s.dtype)
        buf = dev.empty_host((2, n_a, t, s.kv_heads, s.head_dim), dt)
        buf.zero_()
        host.k, host.v = buf[0], buf[1]
        super().__init__(dev, layout, pool, forward, host)
        self.engine, self.layout, self.buf = engine, layout, buf
        self.streams: list[Stream] = []  # the streams vLLM's worker made
        self.handles: dict[int, Stream] = {}
        self.idle = dev.Stream("simple-offload-nowait")  # the compute stream as `no_write_fence` shows it
        self.any_order = dev.Stream("simple-offload-any")  # where a copy whose source is read out of order runs
        self.waits_on_compute = True
        self.last_stream: Stream | None = None
        self.copies = 0
        self.orders: set[int] = set()  # the srcAccessOrder of every store copy made
        self.page = s.kv_heads * s.head_dim * dt.itemsize
        # vLLM's CPU tensors, in the order it allocates them: each layer's K, then its V (int8 [rows, page]).
        self._host_views = iter([buf[i, a].view(torch.int8).view(t, -1) for a in range(n_a) for i in range(2)])
        # The byte ranges vLLM's pointers fall in: (base, rows, pool, global layer id, on the device, rows' tensor).
        self._ranges: list[tuple[int, int, str, int, bool, torch.Tensor]] = []
        for a, lid in enumerate(s.attention_layers):
            for i, p in enumerate((Pool.K, Pool.V)):
                cache = caches[names[lid]][i]
                self._ranges.append((cache.data_ptr(), cache.shape[0], p, lid, True, cache))
                self._ranges.append((buf[i, a].data_ptr(), t, p, lid, False, buf[i, a]))
        self.worker_mod, self.backend_mod = engine.module(WORKER), engine.module(BACKEND)
        self.mem_ops, self.metadata = engine.module(MEM_OPS), engine.module(METADATA)
        self._torch, self._platform = HostCopyTorch(self, _Streams(self)), _Platform()
        self._threading = SimpleNamespace(Thread=self._thread)
        self._loop: tuple[Any, tuple[Any, ...]] | None = None  # the copy thread vLLM started: its loop and arguments
        bpb = 2 * self.page  # K and V of a layer, a block of one slot
        with self._patched():
            self.worker = construct(self.worker_mod.SimpleCPUOffloadWorker, vllm_config=None,
                                    kv_cache_config=kv_cache_config, cpu_capacity_bytes=t * bpb * n_a)
            self.worker.register_kv_caches({names[lid]: registered[names[lid]] for lid in s.attention_layers})
        if self._loop is None:
            raise EngineContractBroken("SimpleCPUOffloadConnector's copy backend started no copy thread")
        self.events: Iterator[int] = itertools.count()

    # ---- what the harness supplies -------------------------------------------------------------
    def next_host_tensor(self, shape: tuple[int, ...]) -> torch.Tensor:
        return host_view(self._host_views, shape, "SimpleCPUOffloadConnector's worker")

    def _thread(self, target: Any, args: tuple[Any, ...] = (), **kwargs: Any) -> Any:
        """`threading.Thread(target=DmaCopyBackend._copy_loop, args=(queue, ...))`: kept, not started."""
        self._loop = (target, tuple(args))
        return SimpleNamespace(start=lambda: None, join=lambda *a, **k: None, is_alive=lambda: False)

    def _drain(self) -> None:
        """vLLM's copy loop on the host thread, until the queue it was given is empty."""
        assert self._loop is not None
        target, args = self._loop
        args[0].put(None)  # the loop's own end-of-work item
        target(*args)

    @contextlib.contextmanager
    def _patched(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            # PIN_MEMORY from 0.24.0 on, is_pin_memory_available before: each release has one of them.
            stack.enter_context(patched(self.worker_mod, {"torch": self._torch, "PIN_MEMORY": False,
                                                          "is_pin_memory_available": lambda: False},
                                        where_present=True))
            stack.enter_context(patched(self.backend_mod, {"torch": self._torch, "threading": self._threading,
                                                           "current_platform": self._platform}, where_present=True))
            stack.enter_context(patched(self.mem_ops, {"current_platform": self._platform,
                                                       "_batch_memcpy_fn": self._batch_memcpy}, where_present=True))
            yield

    def _where(self, ptr: int) -> tuple[str, int, int, bool, torch.Tensor]:
        for base, rows, p, lid, on_dev, t in self._ranges:
            if base <= ptr < base + rows * self.page:
                if (ptr - base) % self.page:
                    raise EngineContractBroken("a pointer of vLLM's batched copy points inside a block")
                return p, lid, (ptr - base) // self.page, on_dev, t
        raise EngineContractBroken("a pointer of vLLM's batched copy points into memory the harness did not register")

    def _batch_memcpy(self, dsts: int, srcs: int, sizes: int, count: int, attrs: int, attrs_idx: Any,
                      num_attrs: int, fail_idx: Any, stream: int) -> int:
        """`cuMemcpyBatchAsync(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, failIdx, stream)`."""
        dst = np.ctypeslib.as_array((ctypes.c_uint64 * count).from_address(dsts)).tolist()
        src = np.ctypeslib.as_array((ctypes.c_uint64 * count).from_address(srcs)).tolist()
        size = np.ctypeslib.as_array((ctypes.c_uint64 * count).from_address(sizes)).tolist()
        order = self.mem_ops._CUmemcpyAttributes.from_address(attrs).srcAccessOrder if num_attrs else \
            SRC_ACCESS_ORDER_ANY
        issued = self.handles.get(stream)
        if issued is None:
            raise EngineContractBroken("vLLM's batched copy was issued on a stream the harness did not make")
        ops = [(self._where(s), self._where(d), n) for s, d, n in zip(src, dst, size, strict=True)]
        out_of_order = order != SRC_ACCESS_ORDER_STREAM
        with self.dev.stream(self.any_order if out_of_order else issued):
            i = 0
            while i < len(ops):
                (sp, slid, s0, s_dev, st), (dp, dlid, d0, d_dev, dtn), n = ops[i]
                if (sp, slid) != (dp, dlid) or not s_dev or d_dev or n != self.page:
                    raise EngineContractBroken(f"vLLM's store copies {sp} L{slid} to {dp} L{dlid} ({n} bytes)")
                k = 1
                while (i + k < len(ops) and ops[i + k][0][:4] == (sp, slid, s0 + k, True)
                       and ops[i + k][1][:4] == (dp, dlid, d0 + k, False)):
                    k += 1
                self.dev.copy_to_host(dtn[d0 : d0 + k], plain(st)[s0 : s0 + k], Region(sp, slid, s0, s0 + k),
                                      Region(Pool.on_host(HOST, sp), slid, d0, d0 + k))
                self.copies += 1
                self.orders.add(order)
                i += k
            if out_of_order:
                done = self.dev.Event()
                done.record()
        if out_of_order:
            issued.wait_event(done)  # the batch completes in its stream's order
        return 0

    # ---- the write-back ----------------------------------------------------------------------
    def _store(self) -> Stream:
        """The batch's store through the worker's `get_finished`."""
        gpu, cpu = self.batch_blocks()
        meta = self.metadata.SimpleCPUOffloadMetadata(store_event=next(self.events), store_gpu_blocks=gpu,
                                                      store_cpu_blocks=cpu)
        copies = self.copies
        with self._patched():
            self.worker.bind_connector_metadata(meta)
            self.worker.get_finished(set())
            self._drain()
            self.worker.clear_connector_metadata()
        if self.copies == copies:
            raise EngineContractBroken("SimpleCPUOffloadConnector's worker stored nothing of the batch's new tokens")
        return self.worker.store_stream  # after the store's own event, on its stream
