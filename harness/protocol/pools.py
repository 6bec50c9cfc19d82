"""Device and host pools, and where each request's tokens and state live in them.

Mirrors the engine's layout: a token-slot KV pool per attention layer (slot
allocation in whole pages, page 0 reserved as padding), a Mamba state pool per
Mamba layer (slot 0 reserved), and host pools in pinned memory that hold each
request's cached prefix KV and Mamba state for load-back.

The accessors are the engine's waiting points: KV `get_key_buffer` /
`get_value_buffer` and the hybrid pool's Mamba layer cache run the accessor
wait policy (the engine's: `LayerDoneCounter.wait_until(layer_id)`) before
handing out the buffer; see `harness.protocol.accessors`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from harness.protocol.accessors import AccessorPolicy, per_layer
from harness.devices.base import Device, dtype_of
from harness.protocol.loadback import LayerDoneCounter
from harness.records.scenario import ModelShape, Request, kv_slots_needed
from harness.records.trace import Pool, Region


@dataclass(frozen=True)
class RequestSlots:
    """Where one request lives: its KV token slots and its Mamba state slot."""

    index: int
    prefix: range  # KV slots of the cached prefix (loaded back)
    new: range  # KV slots of the new tokens (written by this prefill)
    mamba_slot: int
    host_offset: int  # first row of this request's prefix in the host KV pool
    tokens: range  # rows of this request's new tokens in the batch


@dataclass(frozen=True)
class Layout:
    shape: ModelShape
    requests: tuple[RequestSlots, ...]
    kv_slots: int
    mamba_slots: int

    @property
    def total_new(self) -> int:
        return self.requests[-1].tokens.stop

    @property
    def total_prefix(self) -> int:
        return sum(len(r.prefix) for r in self.requests)


class PageAllocator:
    """Page-granular allocation of KV token slots; page 0 is padding, never handed out."""

    def __init__(self, slots: int, page_size: int):
        if slots % page_size:
            raise ValueError(f"kv_slots {slots} is not a multiple of page_size {page_size}")
        self.page_size = page_size
        self._free = list(range(1, slots // page_size))

    def alloc(self, tokens: int) -> range:
        """Contiguous page-aligned slots for `tokens` tokens."""
        if tokens < 1:
            raise ValueError(f"cannot allocate {tokens} tokens")
        pages = math.ceil(tokens / self.page_size)
        for i in range(len(self._free) - pages + 1):
            run = self._free[i : i + pages]
            if run[-1] - run[0] == pages - 1:
                del self._free[i : i + pages]
                return range(run[0] * self.page_size, run[0] * self.page_size + tokens)
        raise MemoryError(f"no {pages} contiguous free pages for {tokens} tokens")

    def free(self, slots: range) -> None:
        first = slots.start // self.page_size
        pages = math.ceil(len(slots) / self.page_size)
        self._free = sorted(set(self._free) | set(range(first, first + pages)))


def plan_layout(shape: ModelShape, batch: tuple[Request, ...]) -> Layout:
    kv_slots = shape.kv_slots or kv_slots_needed(shape, batch)
    mamba_slots = shape.mamba_slots or len(batch) + 1
    alloc = PageAllocator(kv_slots, shape.page_size)
    reqs, host, tok = [], 0, 0
    for i, r in enumerate(batch):
        slots = alloc.alloc(r.prefix + r.new)
        reqs.append(
            RequestSlots(
                index=i,
                prefix=range(slots.start, slots.start + r.prefix),
                new=range(slots.start + r.prefix, slots.stop),
                mamba_slot=1 + i,  # slot 0 is reserved, as in the engine's Mamba pool
                host_offset=host,
                tokens=range(tok, tok + r.new),
            )
        )
        host += r.prefix
        tok += r.new
    return Layout(shape, tuple(reqs), kv_slots, mamba_slots)


class KVPool:
    """Device KV pool: K and V per attention layer, indexed [layer, slot, kv_head, dim]."""

    def __init__(self, dev: Device, layout: Layout):
        s = layout.shape
        n = max(len(s.attention_layers), 1)
        self.layer_index = {lid: i for i, lid in enumerate(s.attention_layers)}
        shape = (n, layout.kv_slots, s.kv_heads, s.head_dim)
        self.k = torch.zeros(shape, dtype=dtype_of(s.dtype), device=dev.torch_device)
        self.v = torch.zeros_like(self.k)
        self.counter: LayerDoneCounter | None = None  # set when accessor waits are on
        self.policy: AccessorPolicy = per_layer
        self.graph_events: list | None = None  # external per-layer events (layerwise_graph)

    def _wait(self, layer_id: int) -> None:
        if self.counter is not None:
            self.policy(self.counter, layer_id, "kv")
        if self.graph_events is not None:
            self.graph_events[layer_id].wait()  # captured into a graph as a wait node

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        self._wait(layer_id)
        return self.k[self.layer_index[layer_id]]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        self._wait(layer_id)
        return self.v[self.layer_index[layer_id]]


class MambaPool:
    """Device Mamba state pool: conv and SSM state per Mamba layer, slot 0 reserved.

    `layer_cache` here does not wait (like the engine's bare Mamba pool); the hybrid
    pool's accessor below is the one that waits.
    """

    def __init__(self, dev: Device, layout: Layout):
        s = layout.shape
        n = max(len(s.mamba_layers), 1)
        self.layer_index = {lid: i for i, lid in enumerate(s.mamba_layers)}
        dt = dtype_of(s.dtype)
        self.conv = torch.zeros((n, layout.mamba_slots, s.d_inner, s.conv - 1), dtype=dt, device=dev.torch_device)
        self.ssm = torch.zeros((n, layout.mamba_slots, s.d_inner, s.state), dtype=dt, device=dev.torch_device)

    def layer_cache(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        i = self.layer_index[layer_id]
        return self.conv[i], self.ssm[i]


class HybridPool:
    """What the model sees: KV accessors and the hybrid (waiting) Mamba accessor."""

    def __init__(self, kv: KVPool, mamba: MambaPool):
        self.kv = kv
        self.mamba = mamba
        self.counter: LayerDoneCounter | None = None
        self.policy: AccessorPolicy = per_layer
        self.graph_events: list | None = None

    def set_counter(self, counter: LayerDoneCounter | None, policy: AccessorPolicy = per_layer) -> None:
        """Give the accessors the counter of pending loads and the wait policy they run."""
        self.kv.counter = self.counter = counter
        self.kv.policy = self.policy = policy

    def set_graph_events(self, events: list | None) -> None:
        """Per-layer external events every accessor also waits on, in eager code and in capture.

        Waited on while a graph is captured, they become wait nodes of the graph: a replay
        then waits on each layer's event right before that layer reads, with no Python.
        """
        self.kv.graph_events = self.graph_events = events

    def mamba_layer_cache(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.counter is not None:
            self.policy(self.counter, layer_id, "mamba")
        if self.graph_events is not None:
            self.graph_events[layer_id].wait()
        return self.mamba.layer_cache(layer_id)


class HostPool:
    """Pinned host copies of each request's cached prefix KV and Mamba state."""

    def __init__(self, dev: Device, layout: Layout, seed: int):
        s = layout.shape
        dt = dtype_of(s.dtype)
        g = torch.Generator().manual_seed(seed + 7919)
        n_a, n_m, b = len(s.attention_layers), len(s.mamba_layers), len(layout.requests)

        def filled(shape):
            t = dev.empty_host(shape, dt)
            t.copy_(torch.randn(shape, generator=g).to(dt))
            return t

        self.k = filled((n_a, layout.total_prefix, s.kv_heads, s.head_dim))
        self.v = filled((n_a, layout.total_prefix, s.kv_heads, s.head_dim))
        self.conv = filled((n_m, b, s.d_inner, s.conv - 1))
        self.ssm = filled((n_m, b, s.d_inner, s.state))


def prefix_regions(layout: Layout, layer_id: int) -> list[Region]:
    """The pool regions layer `layer_id` loads back (and so the slots a read may find stale)."""
    s = layout.shape
    if s.layers[layer_id] == "A":
        return [
            Region(pool, layer_id, r.prefix.start, r.prefix.stop)
            for r in layout.requests
            for pool in (Pool.K, Pool.V)
            if len(r.prefix)
        ]
    first, last = layout.requests[0].mamba_slot, layout.requests[-1].mamba_slot
    return [Region(pool, layer_id, first, last + 1) for pool in (Pool.CONV, Pool.SSM)]
