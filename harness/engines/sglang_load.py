"""SGLang's own load chain, filling the engine's device pools from its own host pool.

One load op is the engine's code end to end: `HiCacheController.load` (the allocator hands
out the slots), `HiCacheController.start_loading` (producer slot, start event on the
scheduling stream, the L2 transfer engine's `submit_host_to_device` on its host-to-device
stream), the engine's host pool `MHATokenToKVPoolHost.load_to_device_per_layer` with the
`direct` I/O backend, and `on_layer_done` (the engine's `LayerLoadingEvent.complete`)
after each layer (`sglang/srt/managers/cache_controller.py`, `mem_cache/l2_transfer.py`,
`mem_cache/pool_host/mha.py`).

Only the compiled copy kernel is the harness's: `transfer_kv_direct` (from `sgl_kernel`),
written with the harness device's `copy_async` so the op list and the analyser see every
copy with the device region it writes and the host rows it reads. It applies the
scenario's fault as the harness's `LoadOp` does: the gate holds the stream before the
op's first copy, the delay comes before each layer's copies.

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
from collections.abc import Callable
from typing import Any

import torch

from harness.devices.base import Device
from harness.engines.sglang_pools import construct
from harness.faults.plan import FaultPlan
from harness.protocol.layout import Layout, Pool
from harness.protocol.pools import HostPool
from harness.protocol.schedules import LoadOp
from harness.records.errors import EngineContractBroken
from harness.records.trace import Region

# A kernel call's copies: the layer it writes, then (destination, source, region written, host rows read).
Plan = tuple[int, list[tuple[torch.Tensor, torch.Tensor, Region, Region]]]

# The copy kernel the engine's host pool calls for the `direct` backend and `layer_first` layout.
KERNEL = "transfer_kv_direct"


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


def _runs(src: torch.Tensor | list[int], dst: torch.Tensor | list[int]) -> list[tuple[int, int, int]]:
    """(src start, dst start, length) of each run where both index lists step by one.

    Vectorised, as the compiled kernel walks raw index arrays: a Python loop over 8,192 rows per
    layer would hold the host for milliseconds the real kernel never spends, long enough for the
    copies to land before the replay is enqueued, and so hide a race the engine has."""
    src, dst = torch.as_tensor(src, dtype=torch.int64), torch.as_tensor(dst, dtype=torch.int64)
    n = src.numel()
    if n == 0:
        return []
    breaks = (((src[1:] - src[:-1]) != 1) | ((dst[1:] - dst[:-1]) != 1)).nonzero().flatten() + 1
    starts = torch.cat([breaks.new_zeros(1), breaks])
    lengths = torch.cat([breaks, breaks.new_full((1,), n)]) - starts
    return list(zip(src[starts].tolist(), dst[starts].tolist(), lengths.tolist(), strict=True))


def _call_each(calls: list[Callable[[], Any]]) -> None:
    for call in calls:
        call()


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
    _plans: dict[tuple, Plan]

    def _planned(self, src_layers: list[torch.Tensor], dst_layers: list[torch.Tensor], src_indices: torch.Tensor,
                 dst_indices: torch.Tensor, *args: int, build: Callable[[torch.Tensor, torch.Tensor], Plan]) -> Plan:
        """A kernel call's copies, built once: the engine makes the same call every load op, and
        building its views and regions again each time would cost the host time the compiled kernel
        does not spend. The indices are read on the host, as the kernel reads them (`.cpu()`)."""
        src, dst = src_indices.cpu(), dst_indices.cpu()
        key = (*args, *(t.data_ptr() for t in (*src_layers, *dst_layers)),
               src.numpy().tobytes(), dst.numpy().tobytes())
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = build(src, dst)
        return plan

    def _issue(self, kernel: str, plan: Plan, *, batched: bool = False) -> None:
        """A planned kernel call: the fault where its layer begins, then its copies on the current
        stream, one call each or (`batched`, as a kernel that issues `cudaMemcpyBatchAsync`) one batch."""
        layer, copies = plan
        self._begin(kernel, layer)
        if batched:
            self.dev.copy_batch_async(copies)
        else:
            for d, s, region, source in copies:
                self.dev.copy_async(d, s, region, source)
        self.copies += len(copies)

    def _install_kernel(self, module: Any, name: str, method: Callable[..., None]) -> None:
        """Put this chain's copy kernel where the engine's host pool module calls it, by a weak
        reference: the module outlives the chain, and must not keep it (and its pinned pools) alive."""
        ref = weakref.WeakMethod(method)

        def kernel(*args: Any, **kwargs: Any) -> None:
            bound = ref()
            if bound is None:
                raise EngineContractBroken(f"{name} was called after the load chain that supplies it was dropped")
            bound(*args, **kwargs)

        setattr(module, name, kernel)

    def _release_on_drop(self, *host_pools: Any) -> None:
        """Unregister the engine's pinned host pools (their own `destroy`) once this chain is dropped.

        The engine pins a host pool with `cudaHostRegister` on memory torch allocated; freed without
        `destroy`, the range stays registered, and the next pool placed on the same memory fails to
        register (which the engine then reports through a TypeError of its own error path)."""
        releases = [pool.destroy for pool in host_pools if pool is not None and hasattr(pool, "destroy")]
        weakref.finalize(self, _call_each, releases)

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
        op.attach_events(self.counter.events[op.index])
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
        self._install_kernel(host_mod, KERNEL, self.transfer_kv_direct)  # the compiled kernel is the harness's
        loaded = [r for r in layout.requests if len(r.prefix)]
        host_rows = [r.host_offset + i for r in loaded for i in range(len(r.prefix))]
        slots = [r.prefix.start + i for r in loaded for i in range(len(r.prefix))]
        self.host_indices = torch.tensor(host_rows, dtype=torch.int64)
        self.host_pool = self._host_pool(host_mod.MHATokenToKVPoolHost, kv_pool, layout, dev)
        for a in range(len(self.attention)):  # the harness's seeded data, so ground truth matches
            self.host_pool.k_buffer[a, : layout.total_prefix].copy_(host.k[a])
            self.host_pool.v_buffer[a, : layout.total_prefix].copy_(host.v[a])
        device = getattr(kv_pool, "device", "cpu")
        self.allocator = Allocator(kv_pool, torch.tensor(slots, dtype=torch.int64, device=device))
        self.controller = construct(
            controller_mod.HiCacheController, token_to_kv_pool_allocator=self.allocator,
            mem_pool_host=self.host_pool, page_size=s.page_size, tp_group=OneRank(),
            load_cache_event=threading.Event(), io_backend="direct", write_policy="write_through")
        self.counter = self.controller.layer_done_counter
        self.stream = self.controller.l2_transfer_engine.host_to_device_stream
        mha = getattr(kv_pool, "full_kv_pool", kv_pool)
        self._dst = {t.data_ptr(): (Pool.K, self.attention[a]) for a, t in enumerate(mha.k_buffer)}
        self._dst |= {t.data_ptr(): (Pool.V, self.attention[a]) for a, t in enumerate(mha.v_buffer)}
        self.op = None
        self.copies = 0
        self._plans = {}
        self._release_on_drop(self.host_pool)

    @staticmethod
    def _host_pool(cls: Any, kv_pool: Any, layout: Layout, dev: Device, mem_layout: str = "layer_first") -> Any:
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

    def transfer_kv_direct(self, src_layers: list[torch.Tensor], dst_layers: list[torch.Tensor],
                           src_indices: torch.Tensor, dst_indices: torch.Tensor, page_size: int) -> None:
        """The compiled kernel's contract: copy rows `src_indices` of each source layer into rows
        `dst_indices` of its destination, one copy per run of consecutive rows, on the current
        stream; with the fault applied."""
        self._issue(KERNEL, self._planned(src_layers, dst_layers, src_indices, dst_indices, page_size,
                                          build=lambda src, dst: self._plan(src_layers, dst_layers, src, dst)))

    def _plan(self, src_layers: list[torch.Tensor], dst_layers: list[torch.Tensor], src: torch.Tensor,
              dst: torch.Tensor) -> Plan:
        pools, layer = self._layer(KERNEL, dst_layers)
        copies = [(d_t[d0:d0 + n], s_t[s0:s0 + n], Region(pool, layer, d0, d0 + n),
                   Region(Pool.on_host(self.host.name, pool), layer, s0, s0 + n))
                  for s_t, d_t, pool in zip(src_layers, dst_layers, pools, strict=True)
                  for s0, d0, n in _runs(src, dst)]
        return layer, copies
