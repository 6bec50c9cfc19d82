"""The load-back protocol, mirrored from the engine's cache controller.

A load op: the scheduling stream records `start_event`; the load stream waits on
it; then for each layer i, the H2D copy of that layer's KV (or Mamba state,
indexed by global layer id) and `load_events[i]` recorded on the load stream.
The op's final event is `load_events[-1]`.

`LayerDoneCounter` keeps a ring of 3 such event sets. The producer advances per
load op; a batch carries a consumer index; `wait_until(i)` does nothing at
consumer index -1 and otherwise enqueues `current_stream().wait_event(...)`:
the host never blocks.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from harness.devices.base import Device, Event
from harness.protocol.layout import Layout, prefix_regions
from harness.records.errors import SlotReusedEarly
from harness.records.trace import Pool, Region

if TYPE_CHECKING:
    from harness.protocol.pools import HostPool, HybridPool

RING = 3  # the engine keeps three event sets: in use, loading, being released


class LayerLoadingEvent:
    """One load op's events: a start event and one event per layer."""

    def __init__(self, dev: Device, num_layers: int, external: bool = False):
        self._dev = dev
        self.num_layers = num_layers
        # External where a load op records them inside a captured graph (`CapturedLoad`).
        self.load_events: list[Event] = [dev.Event(external=external) for _ in range(num_layers)]
        self.start_event: Event = dev.Event()

    def complete(self, layer_index: int) -> None:
        """Record layer `layer_index`'s event on the current (load) stream."""
        if not 0 <= layer_index < self.num_layers:
            raise IndexError(f"layer {layer_index} out of range 0..{self.num_layers - 1}")
        self.load_events[layer_index].record()

    def wait(self, layer_index: int) -> None:
        self._dev.current_stream().wait_event(self.load_events[layer_index])

    @property
    def finish_event(self) -> Event:
        return self.load_events[-1]


class LayerDoneCounter:
    def __init__(self, dev: Device, num_layers: int, external: bool = False):
        self.num_layers = num_layers
        self.events = [LayerLoadingEvent(dev, num_layers, external) for _ in range(RING)]
        self.producer_index = -1
        self.consumer_index = -1

    def update_producer(self) -> int:
        self.producer_index = (self.producer_index + 1) % RING
        if not self.events[self.producer_index].finish_event.query():
            # The engine asserts this: an event set is reused only after its load finished.
            raise SlotReusedEarly(
                f"load-event set {self.producer_index} reused before its final event completed"
            )
        return self.producer_index

    def set_consumer(self, index: int) -> None:
        self.consumer_index = index

    def wait_until(self, threshold: int) -> None:
        if self.consumer_index < 0:
            return  # no pending load for this batch (and always so during capture)
        self.events[self.consumer_index].wait(threshold)


@dataclass(frozen=True)
class LayerCopy:
    dst: torch.Tensor  # a view of a device pool
    src: torch.Tensor  # a view of a pinned host pool
    region: Region  # the device slots it writes
    source: Region | None = None  # the host rows it reads (a host pool's `Pool.on_host` region)


# plan[layer][chunk] -> the copies of that chunk of that layer
CopyPlan = list[list[list[LayerCopy]]]


def _split(n: int, parts: int) -> list[slice]:
    """`parts` contiguous, nearly equal, non-empty slices of range(n) (fewer if n < parts)."""
    parts = max(1, min(parts, n))
    bounds = [n * i // parts for i in range(parts + 1)]
    return [slice(a, b) for a, b in zip(bounds, bounds[1:], strict=False)]


def plan_copies(layout: Layout, host: HostPool, pool: HybridPool, chunks: int = 1) -> CopyPlan:
    """Each layer's H2D copies, as views, built once so a load op only enqueues them.

    Attention layers copy K and V per request (each request's prefix is contiguous
    on both sides), and the index rows of its prefix where the model has an index;
    Mamba layers copy the batch's conv and SSM state slots at once.
    With `chunks` > 1 every copy is split along its slots, chunk by chunk, so a
    fault can hold the stream between the parts of one layer.
    """
    plan: CopyPlan = []
    for layer in range(layout.shape.num_layers):
        parts: list[list[LayerCopy]] = [[] for _ in range(chunks)]
        for dst, src, region, source in _layer_copies(layout, host, pool, layer):
            for c, part in enumerate(_split(region.stop - region.start, chunks)):
                sub = Region(region.pool, region.layer, region.start + part.start, region.start + part.stop)
                read = Region(source.pool, source.layer, source.start + part.start, source.start + part.stop)
                parts[c].append(LayerCopy(dst[part], src[part], sub, read))
        plan.append([p for p in parts if p])
    return plan


def stale_by_chunk(
    stale_slots: frozenset[tuple[int, str, int]], plan: CopyPlan
) -> Iterator[tuple[int, list[Region], list[set[int]]]]:
    """(layer, chunk regions, stale slots in each chunk) for every whole copy of a chunked plan.

    `stale_slots` holds (layer, pool, slot), as a replay verdict's `slots` do; chunks come in
    copy order, so a fault that holds the stream between chunks shows as a stale tail. Every
    copy must have been split into the same number of chunks (ValueError otherwise).
    """
    for layer, parts in enumerate(plan):
        for copies in zip(*parts, strict=True):  # the chunks of one whole copy
            regions = [c.region for c in copies]
            yield layer, regions, [
                {slot for (lay, pool, slot) in stale_slots
                 if lay == layer and pool == r.pool and r.start <= slot < r.stop}
                for r in regions
            ]


def _layer_copies(
    layout: Layout, host: HostPool, pool: HybridPool, layer: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor, Region, Region]]:
    """(device view, host view, device region, host region) of each whole copy of one layer."""
    regions = prefix_regions(layout, layer)

    def on_host(r: Region, start: int) -> Region:
        return Region(Pool.on_host(host.name, r.pool), layer, start, start + r.stop - r.start)

    if layout.shape.layers[layer] == "A":
        a = pool.kv.layer_index[layer]
        loaded = [r for r in layout.requests if len(r.prefix)]
        kv = regions[: 2 * len(loaded)]
        for r, rk, rv in zip(loaded, kv[0::2], kv[1::2], strict=True):
            rows = slice(r.host_offset, r.host_offset + len(r.prefix))
            dst = slice(r.prefix.start, r.prefix.stop)
            yield pool.kv.k[a, dst], host.k[a, rows], rk, on_host(rk, r.host_offset)
            yield pool.kv.v[a, dst], host.v[a, rows], rv, on_host(rv, r.host_offset)
        s = layout.shape
        index = regions[2 * len(loaded):] if s.indexer else []
        for r, ri in zip(loaded if s.indexer else [], index, strict=True):
            first = r.host_offset // s.indexer
            rows = slice(first, first + ri.stop - ri.start)
            yield pool.kv.idx[a, ri.start:ri.stop], host.idx[a, rows], ri, on_host(ri, first)
    else:
        m = pool.mamba.layer_index[layer]
        rc, rs = regions
        yield pool.mamba.conv[m, layout.mamba_rows], host.conv[m], rc, on_host(rc, 0)
        yield pool.mamba.ssm[m, layout.mamba_rows], host.ssm[m], rs, on_host(rs, 0)
