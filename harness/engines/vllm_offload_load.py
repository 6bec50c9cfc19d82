"""vLLM's CPU-to-GPU offloading load as the batch's load op, through vLLM's own worker code: the
hazard `load_before_zeroing` (vllm-project/vllm#50696).

Models that zero freshly allocated KV blocks (vLLM's `needs_kv_cache_zeroing`, any model with
Mamba layers) enqueue the zeroing on the compute stream. Before #50696 the CPU offloading
handler's load (`SingleDirectionOffloadingHandler.transfer_async`, CPU to GPU) waited on the
compute stream only for GPU-to-CPU stores, so a load that landed first was wiped by the zeroing
behind it, and the request attended over zeros. From 0.28.0 every transfer starts with
`stream.wait_stream(current_platform.current_stream())`; 0.27.0 has the wait for stores only.

What runs as vLLM's code (`vllm/v1/kv_offload/cpu/gpu_worker.py`, 0.27.0 on):
`CPUOffloadingWorker(kv_caches, blocks_per_chunk=1, num_cpu_blocks)` (its CPU tensors, both
handlers, the copy function chosen at construction), `submit_load(job_id, CPULoadStoreSpec,
GPULoadStoreSpec)` (the descriptors, the stream from its pool or new, every wait it enqueues, its
start and end events, the batched copy) and `get_finished()`, the host's poll before each load op.

Its KV caches are the scenario's (the vLLM adapter's pools, `[2, slots, kv_heads, head_dim]` a
layer), as vLLM canonicalises FlashAttention's layout: each layer's K and V a
`CanonicalKVCacheTensor` of its own (a page a slot), one group referring to all of them. vLLM's CPU
tensors are filled once, at set-up, with the harness's seeded host data (a request's prefix at its
host rows), so ground truth is the harness's. One load op is one `submit_load` of every request's
prefix (host rows to prefix slots), with the forward stream current, as the connector's worker
submits it on the compute stream.

What the harness supplies, patched into the module only while one of vLLM's calls runs: the batched
copy (`ops.swap_blocks_batch`: each run of consecutive pages one `dev.copy_async`, found back from
the descriptors' byte pointers, the scenario's fault applied as the harness's own load op applies
it: the gate held before the first copy, the delay before each layer's copies, and each layer's
event of the op recorded after its copies), `current_platform.Stream`, `current_stream` and
`stream` (the harness device's streams), `torch.Event` (the device's events, `elapsed_time`
answering 0), `PIN_MEMORY` off and Triton off (the simulator has neither). The device caches are
typed as device memory on the simulator.

The forward is ordered after the load by the fence `vllm_offload_end` (the forward stream waits on
the end event vLLM recorded for the load: vLLM's scheduler runs the request once the load is
reported finished). Transfer `no_load_fence` is the teeth: `current_stream()` as the handler sees it
answers an idle stream of its own, so every wait vLLM enqueues on the compute stream orders nothing.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from harness.devices.base import Device, Event, Gate, Stream, dtype_of
from harness.engines.vllm_pools import DeviceMemory, VllmPools, plain
from harness.engines.vllm_stand_ins import PageRanges, StreamsOf, TorchOf, patched
from harness.faults.plan import FaultPlan
from harness.protocol.layout import Layout
from harness.protocol.pools import HostPool
from harness.protocol.schedules import LayerListener, LoadOp
from harness.protocol.writeback import TransferPolicy
from harness.records.errors import EngineContractBroken
from harness.records.trace import Pool, Region

GPU_WORKER = "vllm.v1.kv_offload.cpu.gpu_worker"
BASE = "vllm.v1.kv_offload.base"
COMMON = "vllm.v1.kv_offload.cpu.common"
NEEDED = {
    GPU_WORKER: ("CPUOffloadingWorker.submit_load", "CPUOffloadingWorker.get_finished", "ops", "torch",
                 "current_platform", "PIN_MEMORY", "HAS_TRITON"),
    BASE: ("CanonicalKVCacheTensor", "CanonicalKVCacheRef", "CanonicalKVCaches", "GPULoadStoreSpec"),
    COMMON: ("CPULoadStoreSpec",),
}


def available() -> bool:
    """Whether the installed vLLM has the worker this drives (0.27.0 on), found without importing
    `vllm.v1.kv_offload.cpu` (before 0.27.0 a module, whose import would bind vLLM's platform before
    the harness sets its own)."""
    try:
        package = importlib.util.find_spec(GPU_WORKER.rsplit(".", 1)[0])
    except ModuleNotFoundError:
        return False
    return package is not None and package.submodule_search_locations is not None and any(
        (Path(p) / "gpu_worker.py").is_file() for p in package.submodule_search_locations)


class VllmOffloadLoad:
    """vLLM's CPU offloading worker over the scenario's KV caches; `start` is one load op."""

    def __init__(self, engine: Any, dev: Device, layout: Layout, pools: VllmPools, host: HostPool,
                 policy: TransferPolicy):
        s = layout.shape
        self.dev, self.layout = dev, layout
        self.gw: Any = engine.module(GPU_WORKER)
        base, common = engine.module(BASE), engine.module(COMMON)
        self.platform = self.gw.current_platform
        self.counter = engine.counter(dev, s.num_layers)
        self.stream = dev.Stream("offload-load")  # the op's nominal stream: vLLM's handler makes its own
        self.streams: list[Stream] = []  # the streams vLLM's handler made
        self.idle = dev.Stream("offload-nowait")  # the compute stream as `no_load_fence` shows it
        self.last_stream: Stream | None = None  # the last stream vLLM's worker entered
        self.waits_on_compute = policy.load_fence
        self.copies = 0
        self.dtype = dtype_of(s.dtype)
        # vLLM's canonical tensors: each attention layer's K, then its V (pool, global layer id, slots).
        self.parts = [(p, lid, pools.kv.k[a] if p == Pool.K else pools.kv.v[a])
                      for a, lid in enumerate(s.attention_layers) for p in (Pool.K, Pool.V)]
        self.page = s.kv_heads * s.head_dim * self.dtype.itemsize
        tensors = [base.CanonicalKVCacheTensor(tensor=self._device_view(t), page_size_bytes=self.page)
                   for _, _, t in self.parts]
        refs = [[base.CanonicalKVCacheRef(tensor_idx=i, page_size_bytes=self.page) for i in range(len(self.parts))]]
        self._torch, self._ops = TorchOf(self), SimpleNamespace(swap_blocks_batch=self._swap_blocks_batch)
        with self._patched():
            self.worker = self.gw.CPUOffloadingWorker(base.CanonicalKVCaches(tensors=tensors, group_data_refs=refs),
                                                      1, max(layout.total_prefix, 1))
        self.handler = self.worker._load_handler
        self.cpu = list(self.handler.src_tensors)  # vLLM's CPU tensors, int8 [rows, page]
        for i, (p, lid, _) in enumerate(self.parts):  # the harness's seeded data, so ground truth matches
            a = pools.kv.layer_index[lid]
            data = (host.k if p == Pool.K else host.v)[a]
            self.cpu[i][: layout.total_prefix].copy_(data.reshape(layout.total_prefix, -1).view(torch.int8))
        self.gpu_spec, self.cpu_spec = base.GPULoadStoreSpec, common.CPULoadStoreSpec
        # byte ranges of every tensor vLLM's descriptors point into: (base, rows, part, on the device)
        self._ranges = PageRanges(self.page)
        for i, t in enumerate(self.cpu):
            self._ranges.add(t, t.shape[0], i, False)
        for i, (_, _, t) in enumerate(self.parts):
            self._ranges.add(t, t.shape[0], i, True)
        loaded = [r for r in layout.requests if len(r.prefix)]
        self.gpu_blocks = [slot for r in loaded for slot in r.prefix]
        self.cpu_blocks = [r.host_offset + i for r in loaded for i in range(len(r.prefix))]
        self.jobs = 0
        self.op: LoadOp | None = None
        self.end_event: Event | None = None  # the end event vLLM recorded for the last load op
        self._paused: set[int] = set()

    @staticmethod
    def _device_view(t: torch.Tensor) -> torch.Tensor:
        return t if t.is_cuda else t.as_subclass(DeviceMemory)

    def _patched(self) -> contextlib.AbstractContextManager:
        return patched(self.gw, {"torch": self._torch, "ops": self._ops, "PIN_MEMORY": False, "HAS_TRITON": False,
                                 "current_platform": StreamsOf(self, "offload-load", self.platform)})

    # ---- the copy primitive ------------------------------------------------------------------
    def _swap_blocks_batch(self, src: torch.Tensor, dst: torch.Tensor, sizes: torch.Tensor, *args: Any,
                           **kwargs: Any) -> None:
        """vLLM's batched copy: each run of consecutive pages one copy, the fault where a layer begins."""
        triples = zip(src.tolist(), dst.tolist(), sizes.tolist(), strict=True)
        ops = [(self._ranges.where(s), self._ranges.where(d), n) for s, d, n in triples]
        i = 0
        while i < len(ops):
            (sp, s0, s_dev), (dp, d0, d_dev), size = ops[i]
            if sp != dp or s_dev or not d_dev or size != self.page:
                raise EngineContractBroken(f"vLLM's load copies part {sp} to part {dp} ({size} bytes)")
            n = 1
            while (i + n < len(ops) and ops[i + n][0] == (sp, s0 + n, False)
                   and ops[i + n][1] == (dp, d0 + n, True)):
                n += 1
            pool, lid, t = self.parts[dp]
            self._begin(lid)
            dst = plain(t)[d0 : d0 + n]
            self.dev.copy_async(dst, self.cpu[sp][s0 : s0 + n].view(self.dtype).view(dst.shape),
                                Region(pool, lid, d0, d0 + n), Region(Pool.on_host("offload", pool), lid, s0, s0 + n))
            self.copies += 1
            i += n
            last = i == len(ops) or self.parts[ops[i][1][0]][1] != lid
            if last and self.op is not None:  # the layer's copies are enqueued: its event, on vLLM's stream
                self.op.event_set.complete(lid)
                for listener in self.op.listeners:
                    listener(lid)

    def _begin(self, layer: int) -> None:
        op = self.op
        if op is None:
            raise EngineContractBroken("vLLM's load copied outside a load op the harness started")
        op.hold()
        if layer not in self._paused:
            self._paused.add(layer)
            op.pause(layer)

    # ---- a load op ---------------------------------------------------------------------------
    def start(self, fault: FaultPlan, gate: Gate | None, listeners: Sequence[LayerListener]) -> LoadOp:
        """vLLM's load of the batch's prefixes, with the current (forward) stream as the compute stream."""
        op = LoadOp(self.dev, self.stream, None, [], fault, -1, self.layout, gate, listeners)
        op.index = self.counter.update_producer()
        op.attach_events(self.counter.events[op.index])
        op.start_event.record()  # on the scheduling stream, as the harness's own load op records it
        self.op, self._paused = op, set()
        spec_dst = self.gpu_spec(self.gpu_blocks, group_sizes=[len(self.gpu_blocks)], block_indices=[0])
        try:
            with self._patched():
                self.worker.get_finished()  # the host's poll: finished transfers give their streams back
                self.jobs += 1
                if not self.worker.submit_load(self.jobs, self.cpu_spec(self.cpu_blocks), spec_dst):
                    raise EngineContractBroken("vLLM's offloading worker refused a load")
        finally:
            self.op = None
        self.end_event = self.handler._transfers[-1].end_event
        return op


def end_fence(ctx: Any) -> None:
    """The forward stream waits on the end event vLLM recorded for the batch's load (vLLM's
    scheduler runs the request once its load is reported finished)."""
    load = current()
    if load.end_event is None:
        raise EngineContractBroken("fence vllm_offload_end ran with no vLLM offloading load pending")
    load.end_event.wait(ctx.forward)


_current: VllmOffloadLoad | None = None


def current() -> VllmOffloadLoad:
    if _current is None:
        raise EngineContractBroken("fence vllm_offload_end runs with vLLM's offloading load (hazard "
                                   "load_before_zeroing, engine = \"vllm\")")
    return _current


def make(engine: Any, dev: Device, layout: Layout, pools: Any, host: HostPool, policy: TransferPolicy
         ) -> VllmOffloadLoad:
    """This scenario's offloading load (the fence's way to it: one scenario runs at a time)."""
    global _current
    if not isinstance(pools, VllmPools):
        raise EngineContractBroken(f"vLLM's offloading worker loads into vLLM's KV caches, not {type(pools).__name__}")
    if layout.shape.mamba_layers:
        raise EngineContractBroken("vLLM's offloading load here moves attention KV only; the model has Mamba layers")
    _current = VllmOffloadLoad(engine, dev, layout, pools, host, policy)
    return _current
