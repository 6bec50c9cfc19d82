"""SGLang's own load chain for a model with Mamba layers: KV and Mamba state both come back
through the engine's code.

One load op is the engine's hybrid chain end to end (`sglang/srt/mem_cache/hybrid_cache/`,
`mem_cache/pool_host/`, `mem_cache/l2_transfer.py`):

- `HybridCacheController.load(kv host rows, extra_pools=[PoolTransfer(MAMBA, ...)])`: the
  allocator hands out the KV slots; the Mamba transfer carries its device slots already
  (`_resolve_device_transfers` leaves a resolved transfer as it is);
- `start_loading` (the base controller's): producer slot, start event, `_l2_load_transfers`
  (one `L2Transfer` per pool entry, each with its entry's layer mapper) and the L2 transfer
  engine's `submit_host_to_device`, which walks the global layers and calls each pool's
  `load_to_device_per_layer` with that pool's own layer index, then `on_layer_done(layer)`;
- the host pools, grouped as the engine's assembler groups them (`HostPoolGroup` of the
  entries its `build_pool_entry` builds): `MHATokenToKVPoolHost` as the KV anchor and
  `MambaPoolHost` for the conv and temporal (SSM) state, both in the `page_first_direct`
  layout (the Mamba host pool takes only page-first layouts and a server has one layout
  for both) with the `direct` I/O backend;
- with a sparse-attention index (the engine's QSA pool), the index's host pool where the
  release's assembler has one (`QSAIndexerPoolHost`, `mem_cache/pool_host/qsa.py`, a page-row
  mirror of the compressed keys, one row a KV page): its entry takes the KV entry's layer
  mapping, and each load op carries it as the KV sidecar the radix cache adds
  (`PoolTransfer(INDEXER, indices_from_pool=KV)`: the KV rows, resolved by `load`). A release
  whose assembler has none builds no entry, so its load op never restores the index.

Only the compiled copy kernel is the harness's: `transfer_kv_per_layer_direct_pf_lf` (from
`sgl_kernel`), which every host pool calls for that layout and backend: page `i` of layer
`layer_id` of each page-first host buffer into the device rows of that page, one copy per
page, as the kernel's reference does (the index's host pool calls it a KV page at a time, one
byte row each). It applies the scenario's fault as the harness's
`LoadOp` does (the gate before the op's first copy, the delay before each layer's first).

The controller, host pools and pool entries are built by their signatures (0.5.20 takes
the device pool and `transfer_layer_num`; later releases a `MambaStateBufferInfo`, the
device capacity and `transfer_layer_id_max`), never by release. The host pools are filled
once, at set-up, with the harness's seeded host data, so ground truth is the same; the
engine's host rows are the harness's (KV: each request's prefix at its host offset, in
whole pages; Mamba: one row per request, in order).
"""

from __future__ import annotations

import inspect
import sys
import threading
from dataclasses import dataclass
from typing import Any

import torch

from harness.devices.base import Device
from harness.engines.sglang_load import Allocator, ChainLoad, EngineLoad, OneRank, Plan
from harness.engines.sglang_pools import construct
from harness.protocol.layout import Layout, Pool
from harness.protocol.pools import HostPool
from harness.records.errors import EngineContractBroken
from harness.records.trace import Region

# The copy kernel both host pools call for the page_first_direct layout and the direct backend.
KERNEL = "transfer_kv_per_layer_direct_pf_lf"
MEM_LAYOUT = "page_first_direct"


@dataclass(frozen=True)
class Modules:
    """The release's modules the hybrid chain uses (the adapter has checked their names)."""

    controller: Any  # managers/cache_controller: LayerDoneCounter, device_module
    transfer: Any  # mem_cache/l2_transfer: L2TransferEngine, device_module
    host_mha: Any  # mem_cache/pool_host/mha: MHATokenToKVPoolHost
    host_mamba: Any  # mem_cache/pool_host/mamba: MambaPoolHost
    hybrid: Any  # mem_cache/hybrid_cache/hybrid_cache_controller: HybridCacheController
    assembler: Any  # mem_cache/hybrid_cache/hybrid_pool_assembler: build_pool_entry
    host_group: Any  # mem_cache/pool_host: HostPoolGroup
    storage: Any  # mem_cache/hicache_storage: PoolTransfer, PoolName


class HybridLoad(ChainLoad):
    """The engine's `HybridCacheController` over its KV and Mamba pools; `start` is one load op."""

    def __init__(self, mods: Modules, dev: Device, layout: Layout, pools: Any, host: HostPool,
                 device_module: Any):
        """`pools`: the engine's device pools (`EnginePools`: `engine_kv_pool`, `req_pool`)."""
        self.dev, self.layout, self.host = dev, layout, host
        s = layout.shape
        page = s.page_size
        for mod in (mods.controller, mods.transfer):
            mod.device_module = device_module  # the engine's streams and events on this device
        for mod in (mods.host_mha, mods.host_mamba):
            self._install_kernel(mod, KERNEL, self.transfer_kv_per_layer_direct_pf_lf)  # the harness's kernel
        # The KV rows the prefixes' pages load (none without an attention layer: no KV to load).
        loaded = [r for r in layout.requests if len(r.prefix)] if s.attention_layers else []
        for r in loaded:
            if len(r.prefix) % page or r.host_offset % page:
                raise EngineContractBroken(
                    f"the engine's page-first host pool loads whole pages of {page} tokens; a cached prefix of "
                    f"{len(r.prefix)} tokens is not")
        kv_pool, req_pool = pools.engine_kv_pool, pools.req_pool
        full, mamba_pool = kv_pool.full_kv_pool, req_pool.mamba_pool
        self.attention, self.mamba = list(s.attention_layers), list(s.mamba_layers)
        n = s.num_layers

        # A model with no attention layer has no KV host pool: the engine's host allocator cannot map
        # the zero-byte pool it would be, and its entry would copy nothing (the controller adds the
        # anchor's transfer only for KV rows), so the group holds the Mamba entry alone.
        self.kv_host = (EngineLoad._host_pool(mods.host_mha.MHATokenToKVPoolHost, full, layout, dev, MEM_LAYOUT)
                        if self.attention else None)
        self.mamba_host = _mamba_host_pool(mods.host_mamba.MambaPoolHost, mamba_pool, dev)
        # The index's host pool, where the model has an index and the release's assembler builds one.
        index_cls = getattr(mods.assembler, "QSAIndexerPoolHost", None) if s.indexer else None
        self.index_host = construct(index_cls, device_pool=kv_pool, anchor_host=self.kv_host) if index_cls else None
        if self.index_host is not None:  # its kernel, where its per-layer load looks it up
            self._install_kernel(_defining_module(self.index_host, "load_to_device_per_layer"), KERNEL,
                                 self.transfer_kv_per_layer_direct_pf_lf)
        self._fill(host)

        storage = mods.storage
        entry = mods.assembler.build_pool_entry
        depth = dict(transfer_layer_num=n, transfer_layer_id_max=n)  # global layer ids 0..n-1
        entries = [] if self.kv_host is None else [
            construct(entry, name=storage.PoolName.KV, host_pool=self.kv_host, device_pool=full,
                      layer_mapping=dict(kv_pool.full_attention_layer_id_mapping), is_anchor=True, **depth)]
        entries.append(construct(entry, name=storage.PoolName.MAMBA, host_pool=self.mamba_host,
                                 device_pool=mamba_pool, layer_mapping=dict(req_pool.mamba_map), **depth))
        if self.index_host is not None:  # as build_hybrid_mamba_stack adds it: the KV entry's layer mapping
            entries.append(construct(entry, name=storage.PoolName.INDEXER, host_pool=self.index_host,
                                     device_pool=kv_pool, layer_mapping=dict(kv_pool.full_attention_layer_id_mapping),
                                     **depth))
        self.group = mods.host_group.HostPoolGroup(entries)
        slots = [r.prefix.start + i for r in loaded for i in range(len(r.prefix))]
        host_rows = [r.host_offset + i for r in loaded for i in range(len(r.prefix))]
        self.host_indices = torch.tensor(host_rows, dtype=torch.int64)
        device = getattr(full, "device", "cpu")
        self.allocator = Allocator(kv_pool, torch.tensor(slots, dtype=torch.int64, device=device))
        rows = layout.mamba_rows
        self._mamba_host_rows = torch.arange(len(layout.requests), dtype=torch.int64)
        self._mamba_slots = torch.arange(rows.start, rows.stop, dtype=torch.int64, device=device)
        self._transfer = storage.PoolTransfer
        self._mamba_name = storage.PoolName.MAMBA
        self._index_name, self._kv_name = storage.PoolName.INDEXER, storage.PoolName.KV
        self.controller = construct(
            mods.hybrid.HybridCacheController, token_to_kv_pool_allocator=self.allocator,
            mem_pool_host=self.group, page_size=page, tp_group=OneRank(), load_cache_event=threading.Event(),
            io_backend="direct", write_policy="write_through", **depth)
        self.counter = self.controller.layer_done_counter
        if self.counter.num_layers != n:
            raise EngineContractBroken(f"the engine's counter has {self.counter.num_layers} layers; the model {n}")
        self.stream = self.controller.l2_transfer_engine.host_to_device_stream
        cache = mamba_pool.mamba_cache
        (conv,) = cache.conv
        self._dst = {t.data_ptr(): (Pool.K, self.attention[a]) for a, t in enumerate(full.k_buffer)}
        self._dst |= {t.data_ptr(): (Pool.V, self.attention[a]) for a, t in enumerate(full.v_buffer)}
        self._dst |= {conv[m].data_ptr(): (Pool.CONV, lid) for m, lid in _local(req_pool.mamba_map)}
        self._dst |= {cache.temporal[m].data_ptr(): (Pool.SSM, lid) for m, lid in _local(req_pool.mamba_map)}
        # The index's device rows are whole KV pages: a row holds page_size // indexer compressed slots.
        self._unit = {Pool.IDX: page // s.indexer} if s.indexer else {}
        if self.index_host is not None:
            self._dst |= {t.data_ptr(): (Pool.IDX, self.attention[a])
                          for a, t in enumerate(self.index_host.device_buffers)}
        self._plans = {}
        self._release_on_drop(self.kv_host, self.mamba_host, self.index_host)

    def _fill(self, host: HostPool) -> None:
        """The harness's seeded host data into the engine's page-first host pools."""
        page = self.layout.shape.page_size
        pages = self.layout.total_prefix // page
        kv = self.kv_host
        for a in range(len(self.attention)):
            if kv is not None:
                for src, dst in ((host.k[a], kv.k_buffer), (host.v[a], kv.v_buffer)):
                    dst[:pages, a].copy_(src[: pages * page].reshape(pages, page, *src.shape[1:]))
        index = self.index_host
        if index is not None:  # page p of layer a: the compressed slots of KV page p, as bytes
            rows = page // self.layout.shape.indexer
            for a in range(len(self.attention)):
                keys = host.idx[a, : pages * rows].contiguous().view(torch.uint8).reshape(pages, -1)
                index.kv_buffer[:pages, a, 0].copy_(keys)
        b = len(self.layout.requests)
        (conv,) = self.mamba_host.conv_buffer
        for m in range(len(self.mamba)):
            conv[:b, m, 0].copy_(host.conv[m])
            self.mamba_host.temporal_buffer[:b, m, 0].copy_(host.ssm[m])

    def _load_args(self) -> dict[str, Any]:
        """The Mamba state's transfer, resolved (host rows and device slots), and the index's KV
        sidecar where there is an index entry: fresh ones per load op (`load` fills them in)."""
        pools = [self._transfer(name=self._mamba_name, host_indices=self._mamba_host_rows.clone(),
                                device_indices=self._mamba_slots.clone())]
        if self.index_host is not None:
            pools.append(self._transfer(name=self._index_name, indices_from_pool=self._kv_name))
        return {"extra_pools": pools}

    def transfer_kv_per_layer_direct_pf_lf(self, src_ptrs: list[torch.Tensor], dst_ptrs: list[torch.Tensor],
                                           src_indices: torch.Tensor, dst_indices: torch.Tensor, layer_id: int,
                                           page_size: int) -> None:
        """The compiled kernel's contract: for each page of `src_indices`, page `src // page_size`
        of layer `layer_id` of each page-first source into the device rows `dst_indices` of that
        page, on the current stream; with the fault applied."""
        self._issue(KERNEL, self._planned(
            src_ptrs, dst_ptrs, src_indices, dst_indices, layer_id, page_size,
            build=lambda src, dst: self._plan(src_ptrs, dst_ptrs, src.tolist(), dst.tolist(), layer_id, page_size)),
            batched=True)  # the compiled kernel's pages go in one cudaMemcpyBatchAsync (CUDA 12.8+)

    def _plan(self, src_ptrs: list[torch.Tensor], dst_ptrs: list[torch.Tensor], src: list[int], dst: list[int],
              layer_id: int, page_size: int) -> Plan:
        if len(src) != len(dst) or len(src) % page_size:
            raise EngineContractBroken(f"{KERNEL} got {len(src)} host and {len(dst)} device rows for pages of "
                                       f"{page_size}")
        pools, layer = self._layer(KERNEL, dst_ptrs)
        copies = []
        for i in range(0, len(src), page_size):
            s0, d0 = src[i], dst[i]
            if dst[i:i + page_size] != list(range(d0, d0 + page_size)) or s0 % page_size:
                raise EngineContractBroken(f"{KERNEL} was asked for a page that is not whole on both sides")
            for s_t, d_t, pool in zip(src_ptrs, dst_ptrs, pools, strict=True):
                n = self._unit.get(pool, 1)  # the pool's slots a row holds (the index's: a page of them)
                copies.append((d_t[d0:d0 + page_size], s_t[s0 // page_size, layer_id],
                               Region(pool, layer, d0 * n, (d0 + page_size) * n),
                               Region(Pool.on_host(self.host.name, pool), layer, s0 * n, (s0 + page_size) * n)))
        return layer, copies


def _defining_module(obj: Any, method: str) -> Any:
    """The module of the class in `obj`'s hierarchy that defines `method` (where its globals live)."""
    owner = next(c for c in type(obj).__mro__ if method in vars(c))
    return sys.modules[owner.__module__]


def _local(mamba_map: dict[int, int]) -> list[tuple[int, int]]:
    """(the pool's layer index, global layer id) of each Mamba layer."""
    return [(m, lid) for lid, m in mamba_map.items()]


def _mamba_host_pool(cls: Any, mamba_pool: Any, dev: Device) -> Any:
    """The engine's Mamba host pool for its device pool, by its constructor's signature (0.5.20
    takes the device pool; later releases the pool's `MambaStateBufferInfo` and its capacity)."""
    known: dict[str, Any] = dict(device_pool=mamba_pool, host_to_device_ratio=2.0, host_size=0,
                                 pin_memory=dev.torch_device.type == "cuda", device="cpu", layout=MEM_LAYOUT)
    params = inspect.signature(cls).parameters
    if "buffer_info" in params:
        (info,) = mamba_pool.get_device_pool_infos()
        known["buffer_info"] = info.buffer_info
    if "device_capacity" in params:
        capacity = getattr(mamba_pool, "host_capacity_tokens", None)
        known["device_capacity"] = int(mamba_pool.size if capacity is None else capacity)
    return construct(cls, **known)
