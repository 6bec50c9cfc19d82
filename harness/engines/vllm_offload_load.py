"""vLLM's CPU-to-GPU offloading load after a pending zeroing of its destination blocks, through
vLLM's own worker code (vllm-project/vllm#50696).

Models that zero freshly allocated KV blocks (vLLM's `needs_kv_cache_zeroing`, any model with
Mamba layers) enqueue the zeroing on the compute stream. Before #50696 the CPU offloading
handler's load (`SingleDirectionOffloadingHandler.transfer_async`, CPU to GPU) waited on the
compute stream only for GPU-to-CPU stores, so a load that landed first was wiped by the zeroing
behind it, and the request attended over zeros. From 0.28.0 every transfer starts with
`stream.wait_stream(current_platform.current_stream())`; 0.27.0 has the wait for stores only.

What runs as vLLM's code (`vllm/v1/kv_offload/cpu/gpu_worker.py`, 0.27.0 on):
`CPUOffloadingWorker(kv_caches, blocks_per_chunk, num_cpu_blocks)` (its CPU tensors, both
handlers, the copy function chosen at construction), `submit_load(job_id, CPULoadStoreSpec,
GPULoadStoreSpec)` (the descriptors, the stream from its pool or new, every wait it enqueues, its
start and end events, the batched copy) and `get_finished()`.

What the harness supplies, patched into the module only while one of vLLM's calls runs: the batched
copy (`ops.swap_blocks_batch`: each run of consecutive pages one `dev.copy_async`, found back from
the descriptors' byte pointers), `current_platform.Stream`, `current_stream` and `stream` (the
harness device's streams), `torch.Event` (the device's events, `elapsed_time` answering 0), and
`PIN_MEMORY` off (the simulator has no pinned memory). The device caches are the harness's tensors,
typed as device memory on the simulator.

The replay (`zero_then_load`), on the forward stream: the fault (a gate held, or a delay), the
zeroing of the destination blocks (one launched kernel writing them: the stand-in for the engine's
block zeroing), vLLM's load submitted with the forward stream current, the forward's wait on the
load's end event (the scheduler sees the load finished before it schedules the request), and the
forward's read of the blocks. Ground truth is the data the load copies. `waits_on_compute=False`
(the teeth): `current_stream()` as the handler sees it answers an idle stream of its own, so every
wait vLLM enqueues on the compute stream orders nothing.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from harness.checkers.happens_before import Finding, find_races
from harness.devices.base import Device, Event, Stream
from harness.engines.vllm_offload import StreamsOf
from harness.engines.vllm_pools import DeviceMemory, plain
from harness.records.errors import EngineContractBroken
from harness.records.trace import Pool, Region

GPU_WORKER = "vllm.v1.kv_offload.cpu.gpu_worker"
BASE = "vllm.v1.kv_offload.base"
COMMON = "vllm.v1.kv_offload.cpu.common"


def available() -> bool:
    """Whether the installed vLLM has the worker this drives (0.27.0 on)."""
    try:
        return importlib.util.find_spec(GPU_WORKER) is not None
    except ModuleNotFoundError:
        return False


@dataclass(frozen=True)
class LoadVerdict:
    stale_blocks: int  # destination blocks whose data the forward read is not the loaded data
    findings: list[Finding]
    copies: int  # harness copies vLLM's batched copy became

    @property
    def race(self) -> bool:
        return self.stale_blocks > 0 or bool(self.findings)


class _Torch:
    def __init__(self, load: VllmOffloadLoad):
        self._o = load

    def Event(self, *args: Any, **kwargs: Any) -> Event:  # noqa: N802 - torch.Event
        e = self._o.dev.Event()
        e.elapsed_time = lambda other: 0.0  # type: ignore[attr-defined]  # the statistics only
        return e

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


class VllmOffloadLoad:
    """vLLM's CPU offloading worker over `layers` device caches of `blocks` pages each."""

    def __init__(self, dev: Device, layers: int = 2, blocks: int = 8, page: int = 64):
        self.dev, self.layers, self.blocks, self.page = dev, layers, blocks, page
        self.gw: Any = importlib.import_module(GPU_WORKER)
        base, common = importlib.import_module(BASE), importlib.import_module(COMMON)
        self.platform = self.gw.current_platform
        self.streams: list[Stream] = []
        self.idle = dev.Stream("offload-nowait")
        self.last_stream: Stream | None = None  # the last stream vLLM's worker entered
        self.waits_on_compute = True
        self.copies = 0
        device = dev.torch_device
        self.caches = [torch.zeros((blocks, page), dtype=torch.float32, device=device) for _ in range(layers)]
        page_bytes = page * 4
        tensors = [base.CanonicalKVCacheTensor(tensor=self._device_view(c), page_size_bytes=page_bytes)
                   for c in self.caches]
        refs = [[base.CanonicalKVCacheRef(tensor_idx=i, page_size_bytes=page_bytes) for i in range(layers)]]
        self._torch, self._ops = _Torch(self), SimpleNamespace(swap_blocks_batch=self._swap_blocks_batch)
        with self._patched():
            self.worker = self.gw.CPUOffloadingWorker(base.CanonicalKVCaches(tensors=tensors, group_data_refs=refs),
                                                      1, blocks)
        self.handler = self.worker._load_handler
        self.host = [t.view(torch.float32) for t in self.handler.src_tensors]
        self.gpu_spec, self.cpu_spec = base.GPULoadStoreSpec, common.CPULoadStoreSpec
        # byte ranges of every tensor vLLM's descriptors point into: (base, row bytes, rows, layer, on the device)
        self._ranges = [(t.data_ptr(), page_bytes, blocks, i, False) for i, t in enumerate(self.handler.src_tensors)]
        self._ranges += [(c.data_ptr(), page_bytes, blocks, i, True) for i, c in enumerate(self.caches)]
        self.jobs = 0

    @staticmethod
    def _device_view(cache: torch.Tensor) -> torch.Tensor:
        return cache if cache.is_cuda else cache.as_subclass(DeviceMemory)

    @contextlib.contextmanager
    def _patched(self) -> Iterator[None]:
        m = self.gw
        saved = m.torch, m.ops, m.current_platform, m.PIN_MEMORY, m.HAS_TRITON
        m.torch, m.ops, m.current_platform, m.PIN_MEMORY, m.HAS_TRITON = (
            self._torch, self._ops, StreamsOf(self, "offload-load", self.platform), False, False)
        try:
            yield
        finally:
            m.torch, m.ops, m.current_platform, m.PIN_MEMORY, m.HAS_TRITON = saved

    def _where(self, ptr: int) -> tuple[int, int, bool]:
        for base, row, rows, layer, on_dev in self._ranges:
            if base <= ptr < base + row * rows:
                if (ptr - base) % row:
                    raise EngineContractBroken("vLLM's copy descriptor points inside a page")
                return layer, (ptr - base) // row, on_dev
        raise EngineContractBroken("vLLM's copy descriptor points into memory the harness did not register")

    def _swap_blocks_batch(self, src: torch.Tensor, dst: torch.Tensor, sizes: torch.Tensor, *args: Any,
                           **kwargs: Any) -> None:
        triples = zip(src.tolist(), dst.tolist(), sizes.tolist(), strict=True)
        ops = [(self._where(s), self._where(d), n) for s, d, n in triples]
        i = 0
        while i < len(ops):
            (sl, s0, s_dev), (dl, d0, d_dev), size = ops[i]
            if sl != dl or s_dev or not d_dev or size != self.page * 4:
                raise EngineContractBroken(f"vLLM's load copies layer {sl} to layer {dl} ({size} bytes)")
            n = 1
            while (i + n < len(ops) and ops[i + n][0] == (sl, s0 + n, False)
                   and ops[i + n][1] == (dl, d0 + n, True)):
                n += 1
            cache = plain(self.caches[dl])
            self.dev.copy_async(cache[d0 : d0 + n], self.host[sl][s0 : s0 + n], Region(Pool.K, dl, d0, d0 + n),
                                Region(Pool.on_host("offload", Pool.K), sl, s0, s0 + n))
            self.copies += 1
            i += n

    def submit_load(self, gpu_blocks: list[int], cpu_blocks: list[int]) -> Event:
        """vLLM's load of `cpu_blocks` into `gpu_blocks`, with the current stream as the compute
        stream; the end event vLLM recorded."""
        spec_dst = self.gpu_spec(gpu_blocks, group_sizes=[len(gpu_blocks)], block_indices=[0])
        with self._patched():
            self.worker.get_finished()
            self.jobs += 1
            if not self.worker.submit_load(self.jobs, self.cpu_spec(cpu_blocks), spec_dst):
                raise EngineContractBroken("vLLM's offloading worker refused a load")
        end: Event = self.handler._transfers[-1].end_event
        return end


def zero_then_load(dev: Device, fault: str = "gate", waits_on_compute: bool = True, delay_us: float = 1000.0,
                   layers: int = 2, blocks: int = 8) -> LoadVerdict:
    """One replay of the hazard (see the module's text); `fault` is "gate", "delay" or "none"."""
    o = VllmOffloadLoad(dev, layers, blocks)
    o.waits_on_compute = waits_on_compute
    gpu_blocks = list(range(2, blocks))  # freshly allocated, zeroed by the compute stream
    cpu_blocks = list(range(len(gpu_blocks)))
    truth = []
    for i, h in enumerate(o.host):
        h.copy_(torch.arange(h.numel(), dtype=torch.float32).view_as(h) + 1000.0 * (i + 1))
        truth.append(h[cpu_blocks].clone())
    regions = [Region(Pool.K, lid, gpu_blocks[0], gpu_blocks[-1] + 1) for lid in range(layers)]
    seen = [torch.empty_like(t) for t in truth]
    forward = dev.Stream("forward")
    gate = dev.gate(5.0) if fault == "gate" else None
    caches = [plain(c) for c in o.caches]
    rows = slice(gpu_blocks[0], gpu_blocks[-1] + 1)

    def zero() -> None:
        for c in caches:
            c[rows].zero_()

    def read() -> None:
        for s, c in zip(seen, caches, strict=True):
            s.copy_(c[rows])

    with dev.tracing() as trace:
        with dev.stream(forward):
            if gate is not None:
                gate.hold()
            elif fault == "delay":
                dev.delay(delay_us)
            dev.launch(zero, writes=regions, what="zero the freshly allocated blocks")
            end = o.submit_load(gpu_blocks, cpu_blocks)
            end.wait(forward)  # the request is scheduled once the load has finished
            dev.launch(read, reads=regions, what="forward reads the loaded KV")
        if gate is not None:
            dev.host_wait(end, 0.05)  # the load lands first where nothing orders it after the zeroing
            gate.release()
        dev.synchronize()
    stale = sum(int((s != t).any(dim=1).sum()) for s, t in zip(seen, truth, strict=True))
    return LoadVerdict(stale, [f for f in find_races(trace) if f.copy_region.pool == Pool.K], o.copies)
