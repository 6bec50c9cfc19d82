"""SGLang's own device pools, as the harness's model, load-back and hazards reach them.

The pools are the engine's objects, built on the harness's device with no server
arguments (`sglang/srt/mem_cache/memory_pool.py`):

- an attention-only model: `MHATokenToKVPool`;
- a model with Mamba layers: `HybridReqToTokenPool`, which builds the engine's `MambaPool`,
  and `HybridLinearKVPool` over it, whose full-attention layers are an `MHATokenToKVPool`;
  with a sparse-attention index (`indexer`), `QSATokenToKVPool` in its place
  (`mem_cache/qsa_kv_pool.py`: the same hybrid pool, plus the QSA indexer's compressed keys
  of each attention layer, one row a compress-ratio of KV slots).

Their tensors are the pools' memory: the harness's copy plan, hazards and probes index the
engine's per-layer K/V buffers and its stacked conv / temporal state, and the harness's
accessors are the engine's (`get_key_buffer`, `get_value_buffer`, the QSA pool's
`get_qsa_compressed_k_buffer`, `HybridReqToTokenPool.mamba2_layer_cache`), so every accessor
wait is the engine's own `layer_transfer_counter.wait_until(layer_id - start_layer)`, where
the release has one (the QSA index's accessor waits from 0.5.22; before it, none).

The counter is registered on the pools as `HiCacheController` registers it
(`register_layer_transfer_counter`) while the accessor policy in force is the engine's own
(`per_layer`); any other policy (a mutant such as `none` or `kv_only`, a plugin, a fence's
own added wait) runs on the harness's side of the accessor, the engine pools' own waits
then off, so a mutant is not masked by the engine's wait.

Constructors are called with what their signature (`inspect.signature`) asks for, from
what the harness knows; one that needs something more is an EngineContractBroken naming it.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import torch

from harness.devices.base import Device, dtype_of
from harness.engines.engine import construct
from harness.protocol.accessors import AccessorPolicy, per_layer
from harness.protocol.counter import LoadCounter
from harness.protocol.layout import Layout
from harness.protocol.pools import INDEX_DTYPE, HybridPool, KVPool, LayerTensors, MambaPool, _Waits
from harness.records.errors import EngineContractBroken
from harness.records.trace import Region

MEMORY = "sglang.srt.mem_cache.memory_pool"
MAMBA = "sglang.srt.configs.mamba_utils"
# The QSA pool, imported only for a model with a sparse-attention index (the adapter needs it nowhere else).
QSA = "sglang.srt.mem_cache.qsa_kv_pool"


class EngineKV(KVPool):
    """The harness's KV pool interface over the engine's KV pool: its buffers and accessors."""

    def __init__(self, engine_pool: Any, layer_ids: Sequence[int], waits: _Waits):
        self.engine = engine_pool
        self.layer_index = {lid: i for i, lid in enumerate(layer_ids)}
        mha = getattr(engine_pool, "full_kv_pool", engine_pool)  # the hybrid pool's full-attention layers
        self.k = LayerTensors(mha.k_buffer)
        self.v = LayerTensors(mha.v_buffer)
        # The QSA pool's compressed index keys, [compressed slot, 1, head_dim] a layer (none elsewhere).
        self.idx = LayerTensors(getattr(engine_pool, "qsa_compressed_k_buffer_pool", ()))
        self._waits = waits

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        self._waits(layer_id, "kv")
        return self.engine.get_key_buffer(layer_id)

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        self._waits(layer_id, "kv")
        return self.engine.get_value_buffer(layer_id)

    def get_index_buffer(self, layer_id: int) -> torch.Tensor:
        self._waits(layer_id, "index")
        return self.engine.get_qsa_compressed_k_buffer(layer_id)


class EngineMamba(MambaPool):
    """The engine's MambaPool: conv and temporal (SSM) state stacked per Mamba layer."""

    def __init__(self, req_pool: Any):
        self.req_pool = req_pool
        self.engine = req_pool.mamba_pool
        self.layer_index = dict(req_pool.mamba_map)  # global layer id -> the pool's layer index
        (self.conv,) = self.engine.mamba_cache.conv  # one conv state shape: the harness's [d_inner, conv-1]
        self.ssm = self.engine.mamba_cache.temporal

    def layer_cache(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The bare pool's accessor: no wait, as in the engine."""
        return _pair(self.engine.mamba2_layer_cache(self.layer_index[layer_id]))


def _pair(state: Any) -> tuple[torch.Tensor, torch.Tensor]:
    (conv,) = state.conv
    return conv, state.temporal


class EnginePools(HybridPool):
    """The engine's pools behind the harness's pool interface (`kv`, `mamba`, the hybrid
    Mamba accessor, the accessor wait policies)."""

    def __init__(self, modules: dict[str, Any], dev: Device, layout: Layout):
        self._waits = _Waits()
        self._policies: tuple[AccessorPolicy, ...] = ()
        self._counter: Any = None
        s = layout.shape
        mp = modules[MEMORY]
        dt = dtype_of(s.dtype)
        device = str(dev.torch_device)
        page = s.page_size
        attention, mamba = list(s.attention_layers), list(s.mamba_layers)
        kv_args = dict(size=layout.kv_slots - page, page_size=page, dtype=dt, head_num=s.kv_heads,
                       head_dim=s.head_dim, device=device, enable_memory_saver=False)
        self.req_pool: Any = None
        if mamba:
            self.req_pool = construct(
                mp.HybridReqToTokenPool, size=len(layout.requests), mamba_size=layout.mamba_slots - 1,
                mamba_spec_state_size=0, max_context_len=layout.kv_slots, device=device,
                enable_memory_saver=False, cache_params=_cache_params(modules[MAMBA], layout, dt),
                mamba_layer_ids=mamba, enable_mamba_extra_buffer=False)
            kv_cls = _qsa_pool_class() if s.indexer else mp.HybridLinearKVPool
            # The QSA pool's own settings: one index head of head_dim, the model's ratio, a token
            # top-k of one group (what it selects is not modelled), bf16 keys (QSA's default).
            qsa_args = dict(qsa_index_kv_heads=1, qsa_index_head_dim=s.head_dim, qsa_compress_ratio=s.indexer,
                            qsa_token_topk=s.indexer, num_request_slots=len(layout.requests) + 1,
                            qsa_indexer_dtype=INDEX_DTYPE) if s.indexer else {}
            self.kv_pool: Any = construct(kv_cls, full_attention_layer_ids=attention,
                                          mamba_pool=self.req_pool.mamba_pool, **kv_args, **qsa_args)
            self.mamba: MambaPool = EngineMamba(self.req_pool)
        else:
            if s.indexer:
                raise EngineContractBroken("the engine's sparse-attention index lives in its QSA pool, a hybrid pool: "
                                           "a model with an indexer needs Mamba layers (an M in layers)")
            self.kv_pool = construct(mp.MHATokenToKVPool, layer_num=len(attention), **kv_args)
            self.mamba = MambaPool(dev, layout)  # no Mamba layer reads it
        self.kv: KVPool = EngineKV(self.kv_pool, attention, self._waits)
        self.engine_copies_on_write = self.req_pool is not None

    @property
    def engine_kv_pool(self) -> Any:
        """What the engine's model runner holds as `token_to_kv_pool`."""
        return self.kv_pool

    def set_waits(self, counter: LoadCounter, policies: Sequence[AccessorPolicy]) -> None:
        self._counter, self._policies = counter, tuple(policies)
        self._apply()

    def add_wait(self, policy: AccessorPolicy) -> None:
        self._policies += (policy,)
        self._apply()

    def _apply(self) -> None:
        """The engine's own policy is its pools' counter; every other one runs on the harness's side."""
        own = per_layer in self._policies
        registered = self._counter if own else None
        self.kv_pool.register_layer_transfer_counter(registered)
        if self.req_pool is not None:
            self.req_pool.register_layer_transfer_counter(registered)
        self._waits.counter = self._counter
        self._waits.policies = tuple(p for p in self._policies if p is not per_layer)

    def copy_on_write(self, dev: Device, src: torch.Tensor, dst: torch.Tensor, reads: Sequence[Region],
                      writes: Sequence[Region], wait_layer: int | None = None) -> None:
        """The engine's deferred Mamba copy-on-write: `HybridReqToTokenPool.copy_mamba_state(src,
        dst)`, which `ModelRunner._maybe_execute_deferred_mamba_cow_and_clear` calls on the forward
        stream for a pool without int8 checkpoints (the only kind HiCache takes), the slot ids
        translated by the pool's own `translate_mamba_indices`.

        The engine's code enqueues its wait (through the pool's registered `layer_transfer_counter`)
        and calls `MambaPool.copy_from`; that copy, the engine's own, runs as one kernel on the
        current stream that reads `reads` and writes `writes` (on the simulator at its virtual start,
        as a kernel runs). With `wait_layer`, the counter's wait during the call is bound to that
        layer's event instead of the one the engine asks for (transfer `cow_layer_wait`)."""
        req_pool = self.req_pool
        if req_pool is None:
            raise EngineContractBroken("the engine's copy-on-write needs its hybrid pools (a model with Mamba layers)")
        mamba_pool = req_pool.mamba_pool
        copies = []

        def copy_from(src_indices: torch.Tensor, dst_indices: torch.Tensor) -> None:
            copies.append(1)
            dev.launch(lambda: type(mamba_pool).copy_from(mamba_pool, src_indices, dst_indices), reads=reads,
                       writes=writes, what="the engine's deferred Mamba copy-on-write (MambaPool.copy_from)")

        counter = req_pool.layer_transfer_counter
        rebind = wait_layer is not None and counter is not None
        mamba_pool.copy_from = copy_from
        if wait_layer is not None and counter is not None:
            index = wait_layer - getattr(req_pool, "start_layer", 0)  # the counter's index, as the engine's
            counter.wait_until = lambda threshold: type(counter).wait_until(counter, index)
        try:
            req_pool.copy_mamba_state(req_pool.translate_mamba_indices(src), req_pool.translate_mamba_indices(dst))
        finally:
            del mamba_pool.copy_from  # the class's own method again
            if rebind:
                del counter.wait_until
        if len(copies) != 1:
            raise EngineContractBroken(f"the engine's copy_mamba_state copied {len(copies)} times, not once")

    def mamba_layer_cache(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The hybrid pool's waiting Mamba accessor: the engine's `mamba2_layer_cache`."""
        self._waits(layer_id, "mamba")
        return _pair(self.req_pool.mamba2_layer_cache(layer_id))


def _qsa_pool_class() -> Any:
    """The release's `QSATokenToKVPool`; an error naming it where the release has none."""
    try:
        return importlib.import_module(QSA).QSATokenToKVPool
    except (ImportError, AttributeError) as e:
        raise EngineContractBroken(f"a model with an indexer needs the engine's QSA pool ({QSA}.QSATokenToKVPool), "
                                   f"which this release lacks: {e}") from None


def _cache_params(mamba_utils: Any, layout: Layout, dt: torch.dtype) -> Any:
    """The engine's Mamba2 cache parameters for the harness's state: conv [d_inner, conv-1],
    temporal [d_inner, state], both in the model's dtype."""
    s = layout.shape
    shape = construct(mamba_utils.Mamba2StateShape, conv=[(s.d_inner, s.conv - 1)], temporal=(s.d_inner, s.state),
                      intermediate_size=s.d_inner, conv_dim=s.d_inner, ssm_state_size=s.state, num_heads=1,
                      head_dim=s.d_inner, state_size=s.state, conv_kernel=s.conv)
    dtype = construct(mamba_utils.Mamba2StateDType, conv=dt, temporal=dt)
    return construct(mamba_utils.Mamba2CacheParams, shape=shape, layers=list(s.mamba_layers), dtype=dtype)
