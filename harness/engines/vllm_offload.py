"""vLLM's CPU offloading worker as the harness's write-back: the store-before-compute hazard through
vLLM's own handler code.

What runs as vLLM's code, on every release (`vllm/v1/kv_offload/worker/`):

- `CpuGpuOffloadingHandlers(gpu_block_size, cpu_block_size, num_cpu_blocks, gpu_caches,
  attn_backends)` (`cpu_gpu.py`): reads each KV cache's layout from its attention backend's
  `get_kv_cache_shape`, allocates the CPU tensors and builds both `SingleDirectionOffloadingHandler`s;
- `OffloadingWorker` (`worker.py`): `register_handler(GPULoadStoreSpec, CPULoadStoreSpec, ...)` and
  the reverse, then per request `transfer_async(job_id, (GPULoadStoreSpec(slots),
  CPULoadStoreSpec(rows)))`, which picks the handler, and `get_finished()`, the host's poll;
- `SingleDirectionOffloadingHandler.transfer_async`: the block mapping (`expand_block_ids`), the
  stream it takes from its pool or makes, the waits it enqueues (on the previous transfer's end
  event, and from 0.14.0 on, vllm-project/vllm#31341, `stream.wait_stream(torch.cuda.current_stream())`
  for a GPU-to-CPU store), its start and end events, the copies per KV tensor.

What the harness supplies, patched into the handler module (`cpu_gpu`) only while one of vLLM's
calls runs (construction, `transfer_async`, `get_finished`):

- `ops.swap_blocks` (compiled, `torch.ops._C_cache_ops`): each run of consecutive block pairs of
  the mapping is one harness copy (`dev.copy_to_host` for a store, with the device region it reads
  and the host rows it writes; `dev.copy_async` for a load), on the stream vLLM made current;
- `torch.cuda.Stream`, `torch.cuda.current_stream`, `torch.cuda.stream` and `torch.Event`: the
  harness device's streams and events (real CUDA ones on a GPU, the simulator's on the CPU), with
  `elapsed_time` answering 0 (the transfer statistics only);
- `torch.zeros` for the CPU tensors: views of the harness's host copy (`HostBackup`, re-laid as one
  `[2, layers, tokens, heads, head_dim]` buffer, so each layer's CPU tensor is vLLM's
  `[2, blocks, block, heads, head_dim]`), so what vLLM's copies write is what the probes observe;
- the device caches as vLLM sees them, and their layout's backend, as the pools register them
  with a connector (`harness.engines.vllm_pools`: `device_view`, `layout_backend`): each layer's
  tensor viewed as `[2, slots, 1, kv_heads, head_dim]` (a block of one slot), on the simulator
  typed as device memory (the handler's GPU-to-CPU test), with FlashAttention's cache shape.

The connector's scheduling is the harness's: the store of the batch's new tokens (one job per
request, GPU blocks the request's new slots, CPU blocks its rows in batch order) is submitted right
after the forward is enqueued, with the forward stream current, as `OffloadingConnectorWorker`
submits it on the compute stream (before #31341 from `wait_for_save` at the end of the step, after
it at the start of the next step: both on the compute stream, host-ordered after the forward).

`no_write_fence` (the teeth): the same calls, with `torch.cuda.current_stream()` as the handler sees
it answering a stream of its own that nothing runs on, so every wait vLLM enqueues on the compute
stream orders nothing (whatever release, without naming the fix).
"""

from __future__ import annotations

import contextlib
import itertools
from types import SimpleNamespace
from typing import Any

import torch

from harness.devices.base import Device, Stream, dtype_of
from harness.engines.vllm_pools import device_view, layout_backend
from harness.engines.vllm_stand_ins import (
    EngineStore,
    HostCopyTorch,
    StreamsOf,
    Where,
    host_view,
    patched,
    swap_blocks,
    swap_ends,
)
from harness.protocol.layout import Layout
from harness.protocol.pools import HybridPool
from harness.protocol.writeback import HostBackup
from harness.records.errors import EngineContractBroken
from harness.records.trace import Pool

CPU_GPU = "vllm.v1.kv_offload.worker.cpu_gpu"
WORKER = "vllm.v1.kv_offload.worker.worker"
MEDIUMS = "vllm.v1.kv_offload.mediums"
NEEDED = {
    CPU_GPU: ("CpuGpuOffloadingHandlers", "AttentionBackend", "ops", "torch"),
    WORKER: ("OffloadingWorker.register_handler", "OffloadingWorker.transfer_async",
             "OffloadingWorker.get_finished"),
    MEDIUMS: ("GPULoadStoreSpec", "CPULoadStoreSpec"),
}


class VllmOffload(EngineStore):
    """The write-back of one scenario through vLLM's offloading worker (see the module's text)."""

    def __init__(self, engine: Any, dev: Device, layout: Layout, pool: HybridPool, forward: Stream,
                 host: HostBackup):
        s = layout.shape
        if s.mamba_layers:
            raise EngineContractBroken("vLLM's offloading worker moves attention KV only; the model has Mamba layers")
        names = getattr(pool, "names", None)
        caches = getattr(pool, "caches", None)
        if names is None or caches is None:
            raise EngineContractBroken("vLLM's offloading worker copies vLLM's KV caches (the vLLM adapter's pools)")
        # The host copy as one buffer, each layer's K/V pair a view vLLM's CPU tensor can be.
        n_a, t = len(s.attention_layers), layout.total_new
        buf = dev.empty_host((2, n_a, t, s.kv_heads, s.head_dim), dtype_of(s.dtype))
        buf.zero_()
        host.k, host.v = buf[0], buf[1]
        super().__init__(dev, layout, pool, forward, host)
        self.engine, self.layout, self.buf = engine, layout, buf
        self.cpu_gpu = engine.module(CPU_GPU)
        self.streams: list[Stream] = []  # the streams vLLM's handlers made
        self.idle = dev.Stream("offload-nowait")  # the compute stream as `no_write_fence` shows it
        self.waits_on_compute = True
        self.last_stream: Stream | None = None
        self._host_views = iter([buf[:, a].unsqueeze(2) for a in range(n_a)])
        self._torch = HostCopyTorch(self, StreamsOf(self, "offload", torch.cuda))
        self._ops = SimpleNamespace(swap_blocks=self._swap_blocks)
        # Where each tensor vLLM hands swap_blocks lives: (pool, layer, on the device).
        self._where: Where = {}
        for lid in s.attention_layers:
            cache = caches[names[lid]]
            for i, p in enumerate((Pool.K, Pool.V)):
                self._where[cache[i].data_ptr()] = (p, lid, True)
                self._where[buf[i, pool.kv.layer_index[lid]].data_ptr()] = (p, lid, False)
        backend = layout_backend(engine)
        gpu_caches = {names[lid]: device_view(caches[names[lid]]) for lid in s.attention_layers}
        with self._patched():
            self.handlers = self.cpu_gpu.CpuGpuOffloadingHandlers(
                gpu_block_size=1, cpu_block_size=1, num_cpu_blocks=t, gpu_caches=gpu_caches,
                attn_backends={name: backend for name in gpu_caches})
        worker, mediums = engine.module(WORKER), engine.module(MEDIUMS)
        self.worker = worker.OffloadingWorker()
        self.gpu_spec, self.cpu_spec = mediums.GPULoadStoreSpec, mediums.CPULoadStoreSpec
        self.worker.register_handler(self.gpu_spec, self.cpu_spec, self.handlers.gpu_to_cpu_handler)
        self.worker.register_handler(self.cpu_spec, self.gpu_spec, self.handlers.cpu_to_gpu_handler)
        self.jobs = itertools.count()
        self.copies = 0

    def next_host_tensor(self, shape: tuple[int, ...]) -> torch.Tensor:
        return host_view(self._host_views, shape, "vLLM's offloading handlers")

    def _patched(self) -> contextlib.AbstractContextManager:
        return patched(self.cpu_gpu, {"torch": self._torch, "ops": self._ops})

    # ---- the copy primitive ------------------------------------------------------------------
    def _swap_blocks(self, src: torch.Tensor, dst: torch.Tensor, *args: Any) -> None:
        """`ops.swap_blocks(src, dst, [block_size_in_bytes,] block_mapping)`."""
        pool, layer, to_host = swap_ends(self._where, src, dst)
        self.copies += swap_blocks(self.dev, src, dst, args[-1].tolist(), pool, layer, to_host, self.host.name)

    # ---- the write-back ----------------------------------------------------------------------
    def _store(self) -> Stream:
        """Each request's store through vLLM's worker, one transfer a request."""
        with self._patched():
            self.worker.get_finished()  # the host's poll: finished transfers give their streams back
            self.last_stream = None
            for r in self.layout.requests:
                spec = (self.gpu_spec(list(r.new)), self.cpu_spec(list(r.tokens)))
                if not self.worker.transfer_async(next(self.jobs), spec):
                    raise EngineContractBroken("vLLM's offloading worker refused a store")
        if self.last_stream is None:
            raise EngineContractBroken("vLLM's offloading handler enqueued its store on no stream of its own")
        return self.last_stream  # the last transfer's end event is recorded there
