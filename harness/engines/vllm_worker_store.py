"""The OffloadingConnector's store from 0.27.0, through vLLM's own `CPUOffloadingWorker.submit_store`
(`vllm/v1/kv_offload/cpu/gpu_worker.py`), as the write-back: the store-before-compute hazard where
`kv_offload/worker/cpu_gpu.py` (`harness.engines.vllm_offload`) is gone.

What runs as vLLM's code: `CPUOffloadingWorker(kv_caches, blocks_per_chunk=1, num_cpu_blocks)` (its CPU
tensors, both handlers), `submit_store(job_id, GPULoadStoreSpec, CPULoadStoreSpec)` (the descriptors, the
stream from its pool or new, every wait it enqueues: the compute stream, then the previous transfer's
end event; its start and end events; the batched copy and the source access order it asks for) and
`get_finished()`, the host's poll before each store.

What the harness supplies, patched into the module only while vLLM's calls run: the batched copy
(`ops.swap_blocks_batch`: each run of consecutive pages one `dev.copy_to_host`, found back from the
descriptors' byte pointers; where vLLM asks for the source to be read out of stream order
(`is_src_access_order_any`), on a side stream that waits on nothing, the stream vLLM entered then
waiting for it), `current_platform.Stream`, `current_stream` and `stream`, `torch.Event`
(`elapsed_time` 0), `PIN_MEMORY` and Triton off, and the CPU tensors (`torch.zeros`): views of the
probes' host copy, a layer's K or V as vLLM's int8 `[rows, page]`. The caches are the scenario's, each
layer's K and V a `CanonicalKVCacheTensor` as in `harness.engines.vllm_offload_load`.

The store is submitted right after the forward is enqueued, with the forward stream current, as the
connector's worker submits it on the compute stream. `no_write_fence` (the teeth): the compute stream
as the handler sees it is an idle stream of its own.
"""

from __future__ import annotations

import contextlib
import itertools
from types import SimpleNamespace
from typing import Any

import torch

from harness.devices.base import Device, Stream, dtype_of
from harness.engines.vllm_offload_load import BASE, COMMON, GPU_WORKER
from harness.engines.vllm_pools import DeviceMemory, plain
from harness.engines.vllm_stand_ins import EngineStore, HostCopyTorch, PageRanges, StreamsOf, host_view, patched
from harness.protocol.layout import Layout
from harness.protocol.pools import HybridPool
from harness.protocol.writeback import HostBackup
from harness.records.errors import EngineContractBroken
from harness.records.trace import Pool, Region

HOST = "backup"
NEEDED = {
    GPU_WORKER: ("CPUOffloadingWorker.submit_store", "CPUOffloadingWorker.get_finished", "ops", "torch",
                 "current_platform", "PIN_MEMORY", "HAS_TRITON"),
    BASE: ("CanonicalKVCacheTensor", "CanonicalKVCacheRef", "CanonicalKVCaches", "GPULoadStoreSpec"),
    COMMON: ("CPULoadStoreSpec",),
}


class VllmWorkerStore(EngineStore):
    """The write-back of one scenario through `CPUOffloadingWorker.submit_store` (the module's text)."""

    def __init__(self, engine: Any, dev: Device, layout: Layout, pool: HybridPool, forward: Stream,
                 host: HostBackup):
        s = layout.shape
        if s.mamba_layers:
            raise EngineContractBroken("vLLM's offloading worker here moves attention KV only; the model has Mamba "
                                       "layers")
        if getattr(pool, "names", None) is None:
            raise EngineContractBroken("vLLM's offloading worker copies vLLM's KV caches (the vLLM adapter's pools)")
        n_a, t = len(s.attention_layers), layout.total_new
        dt = dtype_of(s.dtype)
        buf = dev.empty_host((2, n_a, t, s.kv_heads, s.head_dim), dt)
        buf.zero_()
        host.k, host.v = buf[0], buf[1]
        super().__init__(dev, layout, pool, forward, host)
        self.layout, self.dtype = layout, dt
        self.gw: Any = engine.module(GPU_WORKER)
        base, common = engine.module(BASE), engine.module(COMMON)
        self.platform = self.gw.current_platform
        self.streams: list[Stream] = []
        self.idle = dev.Stream("offload-store-nowait")  # the compute stream as `no_write_fence` shows it
        self.any_order = dev.Stream("offload-store-any")  # where a source read out of stream order runs
        self.waits_on_compute = True
        self.last_stream: Stream | None = None
        self.copies = 0
        self.page = s.kv_heads * s.head_dim * dt.itemsize
        # vLLM's canonical tensors: each attention layer's K, then its V (pool, global layer id, slots, host rows).
        self.parts = [(p, lid, pool.kv.k[a] if p == Pool.K else pool.kv.v[a], buf[i, a])
                      for a, lid in enumerate(s.attention_layers) for i, p in enumerate((Pool.K, Pool.V))]
        self._host_views = iter([h.view(torch.int8).view(t, -1) for _, _, _, h in self.parts])
        tensors = [base.CanonicalKVCacheTensor(tensor=d if d.is_cuda else d.as_subclass(DeviceMemory),
                                               page_size_bytes=self.page) for _, _, d, _ in self.parts]
        refs = [[base.CanonicalKVCacheRef(tensor_idx=i, page_size_bytes=self.page) for i in range(len(self.parts))]]
        self._ranges = PageRanges(self.page)
        for i, (_, _, d, h) in enumerate(self.parts):
            self._ranges.add(d, d.shape[0], i, True)
            self._ranges.add(h, t, i, False)
        self._torch = HostCopyTorch(self)
        self._ops = SimpleNamespace(swap_blocks_batch=self._swap_blocks_batch)
        with self._patched():
            self.worker = self.gw.CPUOffloadingWorker(base.CanonicalKVCaches(tensors=tensors, group_data_refs=refs),
                                                      1, t)
        self.gpu_spec, self.cpu_spec = base.GPULoadStoreSpec, common.CPULoadStoreSpec
        self.jobs = itertools.count(1)

    def next_host_tensor(self, shape: tuple[int, ...]) -> torch.Tensor:
        return host_view(self._host_views, shape, "vLLM's offloading worker")

    def _patched(self) -> contextlib.AbstractContextManager:
        return patched(self.gw, {"torch": self._torch, "ops": self._ops, "PIN_MEMORY": False, "HAS_TRITON": False,
                                 "current_platform": StreamsOf(self, "offload-store", self.platform)})

    def _swap_blocks_batch(self, src: torch.Tensor, dst: torch.Tensor, sizes: torch.Tensor, *args: Any,
                           is_src_access_order_any: bool = False, **kwargs: Any) -> None:
        """vLLM's batched copy of a store: each run of consecutive pages one copy to the host."""
        ops = [(self._ranges.where(s), self._ranges.where(d), n)
               for s, d, n in zip(src.tolist(), dst.tolist(), sizes.tolist(), strict=True)]
        issued = self.dev.current_stream()
        with self.dev.stream(self.any_order if is_src_access_order_any else issued):
            i = 0
            while i < len(ops):
                (sp, s0, s_dev), (dp, d0, d_dev), size = ops[i]
                if sp != dp or not s_dev or d_dev or size != self.page:
                    raise EngineContractBroken(f"vLLM's store copies part {sp} to part {dp} ({size} bytes)")
                n = 1
                while (i + n < len(ops) and ops[i + n][0] == (sp, s0 + n, True)
                       and ops[i + n][1] == (dp, d0 + n, False)):
                    n += 1
                pool, lid, d, h = self.parts[sp]
                self.dev.copy_to_host(h[d0 : d0 + n], plain(d)[s0 : s0 + n], Region(pool, lid, s0, s0 + n),
                                      Region(Pool.on_host(HOST, pool), lid, d0, d0 + n))
                self.copies += 1
                i += n
            if is_src_access_order_any:
                done = self.dev.Event()
                done.record()
        if is_src_access_order_any:
            issued.wait_event(done)

    def _store(self) -> Stream:
        """The batch's store through vLLM's worker, one job."""
        gpu, cpu = self.batch_blocks()
        with self._patched():
            self.worker.get_finished()  # the host's poll: finished transfers give their streams back
            self.last_stream = None
            spec = self.gpu_spec(gpu, group_sizes=[len(gpu)], block_indices=[0])
            if not self.worker.submit_store(next(self.jobs), spec, self.cpu_spec(cpu)):
                raise EngineContractBroken("vLLM's offloading worker refused a store")
        if self.last_stream is None:
            raise EngineContractBroken("vLLM's offloading worker enqueued its store on no stream of its own")
        return self.last_stream  # the store's end event is recorded there
