"""SGLang's own load chain, filling the engine's device pools from its own host pool.

One load op is the engine's code end to end: `HiCacheController.load` (the allocator hands
out the slots, `move_indices` puts the host rows on the device without waiting),
`HiCacheController.start_loading` (producer slot, start event on the scheduling stream, the
L2 transfer engine's `submit_host_to_device` on its host-to-device stream), the engine's host
pool `MHATokenToKVPoolHost.load_to_device_per_layer` with the `kernel` I/O backend and the
`layer_first` layout (a server's defaults, `hicache_io_backend` / `hicache_mem_layout`), and
`on_layer_done` (the engine's `LayerLoadingEvent.complete`) after each layer
(`sglang/srt/managers/cache_controller.py`, `mem_cache/l2_transfer.py`, `mem_cache/pool_host/mha.py`).

Why the kernel backend: the `direct` backend's `move_indices` reads the device slots back to
the host (`device_indices.cpu()`), a host synchronisation before every load op's copies are
enqueued, which a server on its defaults never makes; it hands the copies the host's whole
enqueue time as a head start and hides the race the default path has.

Only the compiled copy kernel is the harness's: `transfer_kv_per_layer` (from
`sgl_kernel.kvcacheio`) and the JIT kernel the host pool prefers where it compiles
(`transfer_hicache_one_layer`, imported as `jit_transfer_hicache_one_layer`); both take the
rows as device index tensors. The stand-in never reads those tensors on the host (that
would be the very synchronisation the backend avoids): the harness knows which host rows and
device slots it passed to `HiCacheController.load`, plans the copies from them once (one
`copy_async` of the harness device per run of consecutive rows, so the op list and the
analyser see every copy) and checks the kernel's contract on the device: each call folds
`(indices != planned).any()` into a device flag on the copy's stream and copies it,
without waiting, into pinned host memory; `start` reads that host copy (no device call) and
a mismatch is `EngineContractBroken`; `verify` reads it after a synchronise. It applies the
scenario's fault as the harness's `LoadOp` does: the gate holds the stream before the op's
first copy, the delay comes before each layer's copies.

Stand-ins, only for what needs a server, each the smallest the code path reads:
- the token-to-KV allocator: `get_kvcache` (the engine's device pool), `alloc` (the slots
  the harness's layout placed the cached prefix in), `set_hicache_transfer_done_event`
  (noted, as nothing here frees slots);
- `tp_group`: one rank (no process group: `_create_sync_groups` then creates none);
- `load_cache_event`: a `threading.Event`.

The engine's host pool is built by its constructor's signature (0.5.20 takes the device
pool, later releases its `MHABufferInfo` and the device capacity and layer range) and
filled once, at set-up, with the harness's seeded host data, so ground truth is the same.
This is the attention-only model's chain; a model with Mamba layers loads through the
engine's hybrid chain (`harness.engines.sglang_hybrid_load`), which shares `ChainLoad`.
"""

from __future__ import annotations

import inspect
import threading
import weakref
from typing import Any

import torch

from harness.devices.base import Device
from harness.engines.sglang_pools import construct
from harness.protocol.layout import Layout, Pool
from harness.protocol.pools import HostPool
from harness.protocol.schedules import LoadOp
from harness.records.errors import EngineContractBroken
from harness.records.faults import FaultPlan
from harness.records.trace import Region

# A server's default I/O backend and host layout (`hicache_io_backend`, `hicache_mem_layout`).
IO_BACKEND, MEM_LAYOUT = "kernel", "layer_first"
# The compiled kernels the engine's host pool calls for them, by their names in its module:
# sgl_kernel's, and the JIT one it prefers where that compiles.
KERNEL, JIT_KERNEL = "transfer_kv_per_layer", "jit_transfer_hicache_one_layer"


class OneRank:
    """`tp_group` of a single-rank server: no process group (`_create_sync_groups` skips it)."""


class Allocator:
    """The token-to-KV allocator the controller reads: the device pool, and the layout's prefix slots."""

    def __init__(self, kv_pool: Any, slots: torch.Tensor):
        self.kv_pool, self.slots = kv_pool, slots
        self.transfer_done: dict[Any, Any] = {}

    def get_kvcache(self) -> Any:
        return self.kv_pool

    def alloc(self, need_size: int) -> torch.Tensor:
        if need_size != len(self.slots):
            raise EngineContractBroken(f"the engine asked for {need_size} slots; the layout placed {len(self.slots)}")
        return self.slots.clone()

    def set_hicache_transfer_done_event(self, key: Any, event: Any) -> None:
        self.transfer_done[key] = event


def _runs(src: list[int], dst: list[int]) -> list[tuple[int, int, int]]:
    """(src start, dst start, length) of each run where both index lists step by one."""
    runs: list[tuple[int, int, int]] = []
    for s, d in zip(src, dst, strict=True):
        if runs and runs[-1][0] + runs[-1][2] == s and runs[-1][1] + runs[-1][2] == d:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((s, d, 1))
    return runs


def release_with(owner: object, *host_pools: Any) -> None:
    """The engine's `destroy` of each host pool when `owner` goes, before the pools' memory is freed.

    The engine pins a host pool's buffers with `cudaHostRegister` and unregisters them only in
    `destroy` (a server's shutdown). A buffer freed while registered leaves its range registered
    with the driver, and the next host pool allocated over that range fails to register (the
    engine's error path then raises `TypeError` from `cudaGetErrorString(int)`, hiding the code).
    The callback holds the pools, so their buffers outlive the unregistration."""
    weakref.finalize(owner, _destroy, [p for p in host_pools if p is not None])


def _destroy(host_pools: list[Any]) -> None:
    for pool in host_pools:
        destroy = getattr(pool, "destroy", None)
        if destroy is not None:
            destroy()


class ChainLoad:
    """What every engine load chain shares: one load op through the controller (`start`), and
    the fault applied where the harness's copy kernel begins each layer.

    A subclass sets `controller`, `counter`, `stream`, `host_indices` and `_dst` (each device
    layer tensor's data pointer -> (pool, global layer id)) and implements the kernel(s)."""

    dev: Device
    layout: Layout
    host: HostPool
    controller: Any
    counter: Any
    stream: Any
    host_indices: torch.Tensor
    _dst: dict[int, tuple[str, int]]
    op: LoadOp | None = None
    copies = 0

    def _load_args(self) -> dict[str, Any]:
        """What `controller.load` takes beyond the KV host rows (the side pools' transfers)."""
        return {}

    def start(self, fault: FaultPlan, gate: Any, listeners: Any) -> LoadOp:
        """One load op through the engine's own chain (on the scheduling stream)."""
        self.op = op = LoadOp(self.dev, self.stream, None, [], fault, -1, self.layout, gate, listeners)
        self._paused: set[int] = set()
        try:
            if self.controller.load(self.host_indices, **self._load_args()) is None:
                raise EngineContractBroken(f"{type(self.controller).__name__}.load got no device slots")
            op.index = self.controller.start_loading()
        finally:
            self.op = None
        if op.index < 0:
            raise EngineContractBroken(f"{type(self.controller).__name__}.start_loading started no load op")
        op.events = self.counter.events[op.index]
        self.controller.ack_load_queue.clear()  # the scheduler's ack poll: the testbed's free-slot wait
        return op

    def _begin(self, kernel: str, layer: int) -> LoadOp:
        """The fault where a layer's copies begin: the gate before the op's first copy, the delay
        once before each layer's first copy (a layer may take several kernel calls)."""
        op = self.op
        if op is None:
            raise EngineContractBroken(f"{kernel} ran outside a load op the harness started")
        op.hold()
        if layer not in self._paused:
            self._paused.add(layer)
            op.pause(layer)
        return op

    def _where(self, kernel: str, dst: torch.Tensor) -> tuple[str, int]:
        found = self._dst.get(dst.data_ptr())
        if found is None:
            raise EngineContractBroken(f"{kernel} was asked to copy into a buffer that is not one of the engine's "
                                       "device pools' layers")
        return found

    def _layer(self, kernel: str, dst_layers: list[torch.Tensor]) -> tuple[list[str], int]:
        """The pools and the one global layer a kernel call writes."""
        where = [self._where(kernel, d) for d in dst_layers]
        layers = {layer for _, layer in where}
        if len(layers) != 1:
            raise EngineContractBroken(f"{kernel} was asked to copy into layers {sorted(layers)} at once")
        return [pool for pool, _ in where], layers.pop()


class EngineLoad(ChainLoad):
    """The engine's `HiCacheController` over the engine's pools; `start` is one load op."""

    def __init__(self, controller_mod: Any, transfer_mod: Any, host_mod: Any, dev: Device, layout: Layout,
                 kv_pool: Any, host: HostPool, device_module: Any):
        """`controller_mod`, `transfer_mod`, `host_mod`: the release's cache controller, L2 transfer
        and MHA host-pool modules (the adapter has checked their names)."""
        self.dev, self.layout, self.host = dev, layout, host
        s = layout.shape
        self.attention = list(s.attention_layers)
        controller_mod.device_module = device_module
        transfer_mod.device_module = device_module  # the engine's streams and events on the harness device
        setattr(host_mod, KERNEL, self.transfer_kv_per_layer)  # the compiled kernels are the harness's
        setattr(host_mod, JIT_KERNEL, self.transfer_hicache_one_layer)
        loaded = [r for r in layout.requests if len(r.prefix)]
        host_rows = [r.host_offset + i for r in loaded for i in range(len(r.prefix))]
        slots = [r.prefix.start + i for r in loaded for i in range(len(r.prefix))]
        self.host_indices = torch.tensor(host_rows, dtype=torch.int64)
        self.runs = _runs(host_rows, slots)  # the copies, planned on the host from what load is given
        self.host_pool = self._host_pool(host_mod.MHATokenToKVPoolHost, kv_pool, layout, dev)
        release_with(self, self.host_pool)
        for a in range(len(self.attention)):  # the harness's seeded data, so ground truth matches
            self.host_pool.k_buffer[a, : layout.total_prefix].copy_(host.k[a])
            self.host_pool.v_buffer[a, : layout.total_prefix].copy_(host.v[a])
        device = getattr(kv_pool, "device", "cpu")
        self.allocator = Allocator(kv_pool, torch.tensor(slots, dtype=torch.int64, device=device))
        self.contract = DeviceContract(self.host_indices.to(device), self.allocator.slots.clone(),
                                       pinned=dev.torch_device.type == "cuda")
        self.controller = construct(
            controller_mod.HiCacheController, token_to_kv_pool_allocator=self.allocator,
            mem_pool_host=self.host_pool, page_size=s.page_size, tp_group=OneRank(),
            load_cache_event=threading.Event(), io_backend=IO_BACKEND, write_policy="write_through")
        self.counter = self.controller.layer_done_counter
        self.stream = self.controller.l2_transfer_engine.host_to_device_stream
        mha = getattr(kv_pool, "full_kv_pool", kv_pool)
        self._dst = {t.data_ptr(): (Pool.K, self.attention[a]) for a, t in enumerate(mha.k_buffer)}
        self._dst |= {t.data_ptr(): (Pool.V, self.attention[a]) for a, t in enumerate(mha.v_buffer)}
        self.op = None
        self.copies = 0

    @staticmethod
    def _host_pool(cls: Any, kv_pool: Any, layout: Layout, dev: Device, mem_layout: str = MEM_LAYOUT) -> Any:
        """The engine's host pool for the device pool, by its constructor's signature."""
        capacity = int(kv_pool.size)
        ratio = max(2.0, (layout.total_prefix + 2 * layout.shape.page_size) / capacity + 1)
        known: dict[str, Any] = dict(
            device_pool=kv_pool, host_to_device_ratio=ratio, host_size=0, page_size=layout.shape.page_size,
            layout=mem_layout, pin_memory=dev.torch_device.type == "cuda", device="cpu",
            device_capacity_tokens=capacity, start_layer=0, end_layer=int(kv_pool.layer_num) - 1)
        if "buffer_info" in inspect.signature(cls).parameters:
            (info,) = kv_pool.get_device_pool_infos()
            known["buffer_info"] = info.buffer_info
        return construct(cls, **known)

    def start(self, fault: FaultPlan, gate: Any, listeners: Any) -> LoadOp:
        self.contract.check(f"{KERNEL} (or {JIT_KERNEL})")  # the earlier ops' calls, as far as they ran
        return super().start(fault, gate, listeners)

    def verify(self) -> None:
        """Every kernel call so far kept the contract (call after a synchronise)."""
        self.contract.check(f"{KERNEL} (or {JIT_KERNEL})")

    def transfer_kv_per_layer(self, src_k: torch.Tensor, dst_k: torch.Tensor, src_v: torch.Tensor,
                              dst_v: torch.Tensor, src_indices: torch.Tensor, dst_indices: torch.Tensor,
                              item_size: int) -> None:
        """sgl_kernel's kernel: rows `src_indices` of the host layers into rows `dst_indices` of the
        device layers, on the current stream (`item_size`: a row's bytes, the views carry it)."""
        self._copy_layer(KERNEL, ((src_k, dst_k), (src_v, dst_v)), src_indices, dst_indices)

    def transfer_hicache_one_layer(self, *, k_cache_dst: torch.Tensor, v_cache_dst: torch.Tensor,
                                   k_cache_src: torch.Tensor, v_cache_src: torch.Tensor,
                                   indices_dst: torch.Tensor, indices_src: torch.Tensor, **tuning: Any) -> None:
        """The JIT kernel: the same copy (`page_size`, `element_dim` and the like only tune it)."""
        self._copy_layer(JIT_KERNEL, ((k_cache_src, k_cache_dst), (v_cache_src, v_cache_dst)),
                         indices_src, indices_dst)

    def _copy_layer(self, kernel: str, pairs: tuple[tuple[torch.Tensor, torch.Tensor], ...],
                    src_indices: torch.Tensor, dst_indices: torch.Tensor) -> None:
        """One layer's copies, planned from the rows the harness passed to `load`, with the fault
        applied; the index tensors are only compared on the device, never read on the host."""
        pools, layer = self._layer(kernel, [d for _, d in pairs])
        self._begin(kernel, layer)
        self.contract.fold(kernel, src_indices, dst_indices)
        for (s_t, d_t), pool in zip(pairs, pools, strict=True):
            for s0, d0, n in self.runs:
                self.dev.copy_async(d_t[d0:d0 + n], s_t[s0:s0 + n], Region(pool, layer, d0, d0 + n),
                                    Region(Pool.on_host(self.host.name, pool), layer, s0, s0 + n))
                self.copies += 1
        self.contract.publish()


class DeviceContract:
    """The kernel's index tensors checked against the planned ones on the device.

    `fold` compares them on the current stream (the copy's) into a device flag; `publish`
    copies the flag into host memory without waiting; `check` reads that host copy, which
    holds every call the device has run so far (all of them after a synchronise)."""

    def __init__(self, src: torch.Tensor, dst: torch.Tensor, pinned: bool):
        self.src, self.dst = src, dst
        self.broken = torch.zeros((), dtype=torch.bool, device=src.device)
        self.seen = torch.zeros((), dtype=torch.bool, pin_memory=pinned)

    def fold(self, kernel: str, src: torch.Tensor, dst: torch.Tensor) -> None:
        # Shapes and devices are the tensors' metadata on the host: checked at once, no sync.
        for name, got, want in (("host", src, self.src), ("device", dst, self.dst)):
            if got.shape != want.shape or got.device != want.device:
                raise EngineContractBroken(
                    f"{kernel} was given {name} rows of shape {tuple(got.shape)} on {got.device}; the load "
                    f"passed {tuple(want.shape)} on {want.device}")
        self.broken |= (src != self.src).any() | (dst != self.dst).any()

    def publish(self) -> None:
        self.seen.copy_(self.broken, non_blocking=True)

    def check(self, kernel: str) -> None:
        if bool(self.seen):
            raise EngineContractBroken(f"{kernel} was given rows other than the ones the load passed to "
                                       "HiCacheController.load")
