"""Where each request's tokens and state live in the pools (pure: no device, no torch).

Mirrors the engine's layout: a token-slot KV pool per attention layer (slot
allocation in whole pages, page 0 reserved as padding), a Mamba state pool per
Mamba layer (slot 0 reserved), and host pools that hold each request's cached
prefix and state, request after request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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

    @property
    def mamba_rows(self) -> slice:
        """The Mamba pool slots of the batch (contiguous: one per request, in order)."""
        return slice(self.requests[0].mamba_slot, self.requests[-1].mamba_slot + 1)


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


def prefix_regions(layout: Layout, layer_id: int) -> list[Region]:
    """The pool regions layer `layer_id` loads back (and so the slots a read may find stale): an
    attention layer's K and V of each request (in that order, a request after another), then, with
    a sparse-attention index, each request's index rows."""
    s = layout.shape
    if s.layers[layer_id] == "A":
        loaded = [r for r in layout.requests if len(r.prefix)]
        kv = [Region(pool, layer_id, r.prefix.start, r.prefix.stop) for r in loaded for pool in (Pool.K, Pool.V)]
        return kv + index_regions(layout, layer_id)
    rows = layout.mamba_rows
    return [Region(pool, layer_id, rows.start, rows.stop) for pool in (Pool.CONV, Pool.SSM)]


def index_regions(layout: Layout, layer_id: int) -> list[Region]:
    """An attention layer's sparse-attention index rows that the load-back restores: each request's
    prefix in compressed slots (none without an index)."""
    s = layout.shape
    if not s.indexer or s.layers[layer_id] != "A":
        return []
    return [Region(Pool.IDX, layer_id, rows.start, rows.stop)
            for r in layout.requests if len(r.prefix) for rows in (s.index_rows(r.prefix),)]
