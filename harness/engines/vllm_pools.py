"""vLLM's KV caches as the harness's model reads them, each attention layer run inside vLLM's own
`unified_attention`.

The caches are what vLLM hands a connector (`register_kv_caches`): one tensor per attention layer,
K and V stacked (`[2, slots, kv_heads, head_dim]`, a block of one slot), named as vLLM names the
layers (`model.layers.{i}.self_attn.attn`). The harness's K and V views index them.

Each attention layer of the forward is one call of vLLM's own `unified_attention(query, key, value,
layer_name)` inside vLLM's own `set_forward_context`: its `maybe_transfer_kv_layer` decorator calls
the connector's `wait_for_layer_load(layer_name)`, then the function body reads the forward context
(`get_attention_context`: the layer's metadata, the layer, its KV cache) and calls the layer's
`impl.forward`, which is the harness's attention step (accessors, then the kernel's launch), then the
decorator calls `save_kv_layer(layer_name, kv_cache, attn_metadata)`. Stand-ins, the smallest that
code path reads: the attention layer, an instance of vLLM's own `Attention` class made without its
`__init__` (which builds a backend from a model's config), holding `kv_cache`, `impl` and its
backend (so `get_layers_from_vllm_config`, through which a connector finds each layer's backend,
finds it), registered in the config's `static_forward_context` as `Attention.__init__` registers
itself, and per-layer attention metadata (the new tokens' slots); query, key and value are the
harness's static buffers, which the harness's kernel reads itself.

The layers' backend (`layout_backend`) is a subclass of vLLM's own `AttentionBackend` whose
`get_kv_cache_shape` is FlashAttention's, `(2, num_blocks, block_size, num_kv_heads, head_size)`
(vLLM's FlashAttention backend itself reads a VllmConfig for its stride order, which the base
class leaves to the identity). The caches a connector is handed (`registered`) are in that shape,
as vLLM's model runner registers them: each layer's tensor viewed as `[2, slots, 1, kv_heads,
head_dim]` (a block of one slot) and, on the simulator, typed as device memory (`is_cuda`, which
vLLM's offloading handlers test for the copy's direction).

While the accessor policy is the engine's own (`per_layer`) the connector's `wait_for_layer_load` is
the only wait; any other policy (`none`, a plugin, a fence's own added wait) runs on the harness's
side with vLLM's hooks off (the kernel called bare, as vLLM calls it with no connector), so the
connector cannot mask a mutant. With no connector configured (no VllmConfig bound: the offloading
worker's own load, `harness.engines.vllm_offload_load`), the kernel runs bare, as vLLM runs it with no
KV transfer group. A model with Mamba layers is refused: vLLM's connector hooks wrap attention layers
only.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import torch

from harness.devices.base import Device, dtype_of
from harness.protocol.accessors import AccessorPolicy, per_layer
from harness.protocol.counter import LoadCounter
from harness.protocol.layout import Layout
from harness.protocol.pools import HybridPool, LayerTensors
from harness.records.errors import EngineContractBroken

# vLLM's modules this one calls (`harness.engines.vllm.NEEDED` checks them); `engine` is the loaded
# adapter (`harness.engines.vllm.Vllm`), passed in: this module does not import it.
FORWARD = "vllm.forward_context"
ATTENTION = "vllm.model_executor.layers.attention.attention"


def layer_name(layer_id: int) -> str:
    return f"model.layers.{layer_id}.self_attn.attn"


class _Impl:
    """The attention backend's `impl`: its forward is the harness's attention step."""

    def __init__(self) -> None:
        self.body: Callable[[], None] | None = None
        self.calls = 0

    def forward(self, layer: Any, query: Any, key: Any, value: Any, kv_cache: Any, attn_metadata: Any,
                **kwargs: Any) -> Any:
        if self.body is None:
            raise EngineContractBroken("vLLM called an attention layer's forward outside the harness's step")
        self.calls += 1
        self.body()
        return query


class DeviceMemory(torch.Tensor):
    """The simulator's device memory as vLLM tests it (`tensor.is_cuda`)."""

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True


def plain(t: torch.Tensor) -> torch.Tensor:
    """The tensor itself, not typed as device memory (the copies' payload)."""
    return t.as_subclass(torch.Tensor) if isinstance(t, DeviceMemory) else t


def device_view(cache: torch.Tensor) -> torch.Tensor:
    """A layer's `[2, slots, kv_heads, head_dim]` cache as `[2, blocks, 1, kv_heads, head_dim]` (vLLM's
    K/V-split layout, a block of one slot), typed as device memory on the simulator."""
    view = cache.unsqueeze(2)
    return view if view.is_cuda else view.as_subclass(DeviceMemory)


_backends: dict[type, type] = {}


def layout_backend(engine: Any) -> type:
    """The caches' attention backend: vLLM's `AttentionBackend` with FlashAttention's cache shape
    (one class per release's base class)."""
    base = engine.module(ATTENTION).AttentionBackend
    if base not in _backends:
        def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
                               *args: Any, **kwargs: Any) -> tuple[int, ...]:
            return (2, num_blocks, block_size, num_kv_heads, head_size)

        _backends[base] = type("HarnessKVLayout", (base,), {"get_kv_cache_shape": staticmethod(get_kv_cache_shape)})
    return _backends[base]


def attention_layer(engine: Any, cache: torch.Tensor) -> Any:
    """What vLLM's forward context holds for an attention layer: an instance of vLLM's `Attention`
    holding its KV cache per virtual engine, its backend's `impl` and the backend."""
    cls = engine.module(ATTENTION).Attention
    layer = cls.__new__(cls)
    torch.nn.Module.__init__(layer)  # the module's own state; the rest of Attention.__init__ needs a model
    layer.kv_cache = [cache]
    layer.impl = _Impl()
    layer.attn_backend = layout_backend(engine)
    return layer


class VllmPools(HybridPool):
    def __init__(self, engine: Any, dev: Device, layout: Layout):
        s = layout.shape
        if s.mamba_layers:
            raise EngineContractBroken(f"vLLM's connector hooks wrap attention layers only; model {s.layers!r} has "
                                       "Mamba layers")
        super().__init__(dev, layout)
        self.engine = engine
        dt = dtype_of(s.dtype)
        self.names = {lid: layer_name(lid) for lid in s.attention_layers}
        self.caches = {self.names[lid]: torch.zeros((2, layout.kv_slots, s.kv_heads, s.head_dim), dtype=dt,
                                                    device=dev.torch_device) for lid in s.attention_layers}
        caches = [self.caches[self.names[lid]] for lid in s.attention_layers]
        self.kv.k = LayerTensors([c[0] for c in caches])
        self.kv.v = LayerTensors([c[1] for c in caches])
        # vLLM's attention layers, made once a connector's VllmConfig is bound (`bind`): vLLM's
        # Attention class is the connector contract's, which the offloading worker's parts do not need.
        self.layers: dict[str, Any] = {}
        # What a connector is handed (`register_kv_caches`): each cache in the backend's shape.
        self.registered = {name: device_view(cache) for name, cache in self.caches.items()}
        slots = torch.tensor([slot for r in layout.requests for slot in r.new], dtype=torch.long)
        self.slot_mapping = {name: slots for name in self.names.values()}
        self.attn_metadata = {name: SimpleNamespace(slot_mapping=slots, num_actual_tokens=len(slots))
                              for name in self.names.values()}
        self._policies: tuple[AccessorPolicy, ...] = ()
        self.hooks = True  # vLLM's attention entry point (its connector hooks) in force
        self.config: Any = None  # the VllmConfig the connector was made from (VllmLoad.configure)
        empty = torch.empty(0, dtype=dt, device=dev.torch_device)
        self._qkv = (empty, empty, empty)

    # ---- set by the loader -----------------------------------------------------------------
    def bind(self, config: Any) -> None:
        """The VllmConfig of this scenario's connector: its forward context holds the layers."""
        self.config = config
        if not self.layers:
            self.layers = {name: attention_layer(self.engine, cache) for name, cache in self.caches.items()}
        config.compilation_config.static_forward_context.update(self.layers)

    def forward_context(self) -> Any:
        """vLLM's own `set_forward_context` for the batch: the layers' metadata, the config."""
        if self.config is None:
            raise EngineContractBroken("the attention ran before the connector's VllmConfig was made")
        fc = self.engine.module(FORWARD)
        # The layers' slot mapping, where the release's set_forward_context takes one (0.16.0 on;
        # 0.13.0 and 0.14.0 read the slots from the metadata alone).
        if "slot_mapping" in inspect.signature(fc.set_forward_context).parameters:
            return fc.set_forward_context(self.attn_metadata, self.config, slot_mapping=self.slot_mapping)
        return fc.set_forward_context(self.attn_metadata, self.config)

    # ---- the accessor policies ---------------------------------------------------------------
    def set_waits(self, counter: LoadCounter, policies: Sequence[AccessorPolicy]) -> None:
        self._waits.counter = counter
        self._policies = tuple(policies)
        self._apply()

    def add_wait(self, policy: AccessorPolicy) -> None:
        self._policies += (policy,)
        self._apply()

    def _apply(self) -> None:
        """The engine's own policy is the connector's wait; every other runs on the harness's side."""
        self.hooks = per_layer in self._policies
        self._waits.policies = tuple(p for p in self._policies if p is not per_layer)

    # ---- one attention layer ---------------------------------------------------------------
    def attention(self, layer_id: int, body: Callable[[], None]) -> None:
        # No connector configured (the offloading worker's scenarios: no VllmConfig is bound): the kernel
        # bare, as vLLM calls it with no KV transfer group.
        if not self.hooks or self.config is None:
            body()
            return
        name = self.names[layer_id]
        impl = self.layers[name].impl
        impl.body = body
        calls = impl.calls
        unified_attention = self.engine.module(ATTENTION).unified_attention
        try:
            with self.forward_context():
                unified_attention(*self._qkv, name)
        finally:
            impl.body = None
        if impl.calls != calls + 1:
            raise EngineContractBroken(f"vLLM's unified_attention ran layer {name}'s kernel "
                                       f"{impl.calls - calls} times, not once")
