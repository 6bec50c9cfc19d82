"""Device and host pools, and the accessors that wait.

The accessors are the engine's waiting points: KV `get_key_buffer` /
`get_value_buffer`, the sparse-attention index's `get_index_buffer` and the hybrid pool's
Mamba layer cache run the accessor wait policies (the engine's: `LayerDoneCounter.wait_until(layer_id)`, see
`harness.protocol.accessors`) before handing out the buffer. The bare Mamba pool's
`layer_cache` does not wait, as the engine's does not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from harness.devices.base import Device, dtype_of
from harness.protocol.accessors import AccessorPolicy
from harness.protocol.counter import LoadCounter
from harness.protocol.layout import Layout
from harness.protocol.seeded import drawn_once
from harness.records.trace import Region

# The sparse-attention index keys' storage dtype, whatever the model's: QSA's own (its
# `--qsa-indexer-dtype auto` keeps the compressed keys in bf16).
INDEX_DTYPE = torch.bfloat16


def index_shape(layout: Layout, slots: int) -> tuple[int, int, int, int]:
    """The index keys of every attention layer over `slots` KV slots: [layers, compressed slots,
    1 index head, head_dim] (one compressed slot a run of `indexer` KV slots)."""
    s = layout.shape
    return (max(len(s.attention_layers), 1), slots // s.indexer if s.indexer else 0, 1, s.head_dim)


class _Waits:
    """The accessor wait policies in force, and the counter of pending loads they read."""

    def __init__(self) -> None:
        self.counter: LoadCounter | None = None
        self.policies: tuple[AccessorPolicy, ...] = ()

    def __call__(self, layer_id: int, pool: str) -> None:
        if self.counter is None:
            if self.policies:  # a wait with no counter to wait through would be silently skipped
                raise RuntimeError("accessor waits were added before the pools were given a load counter")
            return
        for policy in self.policies:
            policy(self.counter, layer_id, pool)


class LayerTensors:
    """One tensor per layer, indexed as one stacked tensor is: `[i, ...]` is layer i's
    tensor indexed by the rest, `[:, ...]` every layer's (what `fill_` then fills).

    An engine's KV pool allocates each layer apart (`harness.engines.sglang_pools`).
    """

    def __init__(self, tensors: Sequence[torch.Tensor]):
        self.tensors = list(tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    def __iter__(self):
        return iter(self.tensors)

    def __getitem__(self, key: Any) -> Any:
        first, rest = (key[0], key[1:]) if isinstance(key, tuple) else (key, ())
        if isinstance(first, int):
            return self.tensors[first][rest] if rest else self.tensors[first]
        return _EachLayer([t[rest] if rest else t for t in self.tensors[first]])


class _EachLayer(list):
    """The same index of several layers' tensors: `fill_` fills each."""

    def fill_(self, value: Any) -> _EachLayer:
        for t in self:
            t.fill_(value)
        return self


class KVPool:
    """Device KV pool: K and V per attention layer, indexed [layer, slot, kv_head, dim]; with a
    sparse-attention index, its keys per attention layer too, [layer, compressed slot, 1, dim]."""

    def __init__(self, dev: Device, layout: Layout, waits: _Waits):
        s = layout.shape
        n = max(len(s.attention_layers), 1)
        self.layer_index = {lid: i for i, lid in enumerate(s.attention_layers)}
        shape = (n, layout.kv_slots, s.kv_heads, s.head_dim)
        # an engine's pool holds one tensor per layer (LayerTensors), indexed alike
        self.k: torch.Tensor | LayerTensors = torch.zeros(shape, dtype=dtype_of(s.dtype), device=dev.torch_device)
        self.v: torch.Tensor | LayerTensors = torch.zeros(shape, dtype=dtype_of(s.dtype), device=dev.torch_device)
        self.idx: torch.Tensor | LayerTensors = torch.zeros(index_shape(layout, layout.kv_slots), dtype=INDEX_DTYPE,
                                                            device=dev.torch_device)
        self._waits = waits

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        self._waits(layer_id, "kv")
        return self.k[self.layer_index[layer_id]]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        self._waits(layer_id, "kv")
        return self.v[self.layer_index[layer_id]]

    def get_index_buffer(self, layer_id: int) -> torch.Tensor:
        """The layer's sparse-attention index keys (read before its KV, as an indexer is)."""
        self._waits(layer_id, "index")
        return self.idx[self.layer_index[layer_id]]


class MambaPool:
    """Device Mamba state pool: conv and SSM state per Mamba layer, slot 0 reserved."""

    def __init__(self, dev: Device, layout: Layout):
        s = layout.shape
        n = max(len(s.mamba_layers), 1)
        self.layer_index = {lid: i for i, lid in enumerate(s.mamba_layers)}
        dt = dtype_of(s.dtype)
        self.conv = torch.zeros((n, layout.mamba_slots, s.d_inner, s.conv - 1), dtype=dt, device=dev.torch_device)
        self.ssm = torch.zeros((n, layout.mamba_slots, s.d_inner, s.state), dtype=dt, device=dev.torch_device)

    def layer_cache(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """No wait here, as in the engine's bare Mamba pool."""
        i = self.layer_index[layer_id]
        return self.conv[i], self.ssm[i]


class HybridPool:
    """What the model sees: KV accessors and the hybrid (waiting) Mamba accessor."""

    # Whether the pools have a deferred Mamba copy-on-write of their own (`copy_on_write`):
    # an engine's pools may (`harness.engines.sglang_pools`); the harness's have none.
    engine_copies_on_write = False

    def __init__(self, dev: Device, layout: Layout):
        self._waits = _Waits()
        self.kv = KVPool(dev, layout, self._waits)
        self.mamba = MambaPool(dev, layout)

    def set_waits(self, counter: LoadCounter, policies: Sequence[AccessorPolicy]) -> None:
        """The counter of pending loads, and the wait policies every accessor runs, in order."""
        self._waits.counter = counter
        self._waits.policies = tuple(policies)

    def add_wait(self, policy: AccessorPolicy) -> None:
        """One more policy after those in force (a fence strategy's own, from its set-up)."""
        self._waits.policies += (policy,)

    def mamba_layer_cache(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        self._waits(layer_id, "mamba")
        return self.mamba.layer_cache(layer_id)

    def copy_on_write(self, dev: Device, src: torch.Tensor, dst: torch.Tensor, reads: Sequence[Region],
                      writes: Sequence[Region], wait_layer: int | None = None) -> None:
        """The pools' own deferred Mamba copy-on-write of slots `src` into `dst`, every Mamba layer
        at once, on the current stream, with whatever wait it enqueues first (`wait_layer`: that
        wait bound to this layer's load event instead). Only where `engine_copies_on_write`."""
        raise NotImplementedError("the harness's pools have no copy-on-write of their own")

    def attention(self, layer_id: int, body: Callable[[], None]) -> None:
        """One attention layer's pool reads and kernel (`body`, on the host: its accessors, then its
        launch). The harness's pools call it; an engine's may run it inside the engine's own
        attention entry point (`harness.engines.vllm_pools`: vLLM's, its connector hooks around it)."""
        body()


@drawn_once
def _draw_host(shapes: tuple[tuple[tuple[int, ...], torch.dtype], ...], seed: int) -> tuple[torch.Tensor, ...]:
    """A host pool's data: standard normal draws of these shapes and dtypes, in order, from one generator."""
    g = torch.Generator().manual_seed(seed + 7919)
    return tuple(torch.randn(shape, generator=g).to(dtype) for shape, dtype in shapes)


class HostPool:
    """Pinned host copies of each request's cached prefix KV and Mamba state (and, with a
    sparse-attention index, its keys: one row a compressed slot of each prefix, request after request).

    `name` names its memory in the op list (`Pool.on_host(name, pool)` regions), so that a
    write the host makes to it can be told apart from writes to another host buffer.
    """

    def __init__(self, dev: Device, layout: Layout, seed: int, name: str = "host"):
        self.name = name
        s = layout.shape
        dt = dtype_of(s.dtype)
        n_a, n_m, b = len(s.attention_layers), len(s.mamba_layers), len(layout.requests)
        kv = (n_a, layout.total_prefix, s.kv_heads, s.head_dim)
        # Drawn in this order; the index last, so a model without one gets the same data as before it had one.
        shapes = ((kv, dt), (kv, dt), ((n_m, b, s.d_inner, s.conv - 1), dt), ((n_m, b, s.d_inner, s.state), dt),
                  (index_shape(layout, layout.total_prefix), INDEX_DTYPE))
        drawn = _draw_host(shapes, seed)

        def filled(data: torch.Tensor) -> torch.Tensor:
            t = dev.empty_host(tuple(data.shape), data.dtype)  # its own: a hazard or write-back may write it
            t.copy_(data)
            return t

        self.k, self.v, self.conv, self.ssm, self.idx = (filled(d) for d in drawn)
