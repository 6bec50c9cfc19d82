"""The other direction: the write-back (device to host) and the host buffers loads copy from.

The write-back mirrors SGLang's hierarchical cache (`HiCacheController.write` -> `start_writing`
-> `L2TransferEngine.submit_device_to_host` -> the host pool's `backup_from_device_all_layer`):

- the scheduler issues it after a prefill, for what the radix tree just cached (write-through):
  the new tokens' KV of every attention layer and, on a hybrid model, each request's Mamba state;
- with `write_fence_stream` set to the forward stream (sglang 0.5.23; 0.5.20-0.5.22 have no such
  fence), the device-to-host stream first waits on the forward stream (`wait_stream`), so the copy
  reads what the forward wrote;
- a start event is recorded on the scheduler's current stream and the device-to-host stream
  waits on it. Under overlap scheduling that stream is not the forward stream, so this start
  event alone orders nothing after the forward: hence the fence;
- then the ack's `start_event`, every layer's copies in one submission, the ack's `finish_event`;
- the `HiCacheAck` goes on `ack_write_queue`. The host polls its finish event (`writing_check`)
  before it releases the cached node, and a free or a move of device slots first orders the
  current stream after every pending transfer's finish event (`_wait_hicache_transfers`): a slot
  is reused only after its backup was copied (`WriteOp.release`).

The engine issues write-backs from the scheduler only: no write-back is captured in a prefill
graph (the graph runner holds none), so none is enqueued inside a replay here either.

The host buffers a load op copies from (`StagingRing`): an async copy reads its pinned source
when it runs, not when it is enqueued, so a host that refills that buffer for the next batch
while the copy is pending sends the next batch's bytes (TensorRT-LLM's block offsets,
NVIDIA/TensorRT-LLM#15546). The correct way is a ring of two buffers, each refilled only after
the host has seen the copies that read it complete.

Each known-bad variant of the transfer path (`TRANSFERS`) breaks exactly one of these.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from harness.devices.base import Device, Event, Gate, Stream, dtype_of
from harness.faults.plan import FaultPlan
from harness.protocol.layout import Layout
from harness.protocol.loadback import CopyPlan, LayerCopy, plan_copies
from harness.protocol.pools import HostPool, HybridPool
from harness.records.errors import ReplayTimeout
from harness.records.trace import Pool, Region


@dataclass(frozen=True)
class TransferPolicy:
    """What the engine does around its host transfers; each known-bad variant breaks one thing."""

    name: str
    what: str  # in words, for reports
    write_fence: bool = True  # the D2H stream waits on the forward stream before its copies
    ack_wait: bool = True  # backed-up slots are reused only after the write's ack finish event
    staging_buffers: int = 2  # a ring of pinned staging buffers for loads (1: refilled in place)
    # The load stream waits on the forward stream before a load's copies (`load_fence_stream`,
    # sgl-project/sglang#36738): pages freed and reallocated under overlap scheduling are restored
    # only after the forward still writing them has.
    load_fence: bool = True
    # A deferred Mamba copy-on-write, which reads a whole slot (every layer's state), waits on the
    # load op's final event first (`wait_for_hicache_load_complete`, sgl-project/sglang#36743).
    cow_waits_load: bool = True

    @property
    def waits_for_staging(self) -> bool:
        """Does the host wait for a staging buffer's last copies before it refills it?

        The one-buffer variant is the bug as shipped: overwritten in place, no wait (a wait
        there would block the host on the very load it is about to queue the next batch behind).
        """
        return self.staging_buffers > 1


ENGINE = TransferPolicy(
    "engine",
    "sglang 0.5.23: D2H after the forward (write fence), slots reused after the ack, staging double-buffered; "
    "with the later fixes: loads after the forward (load fence, #36738), a deferred Mamba COW after the "
    "whole load (#36743)",
)
TRANSFERS: dict[str, TransferPolicy] = {
    p.name: p
    for p in (
        ENGINE,
        TransferPolicy("no_write_fence", "no write fence: the D2H copy is not ordered after the forward "
                       "(sglang 0.5.20-0.5.22)", write_fence=False),
        TransferPolicy("no_ack_wait", "backed-up slots reused without waiting on the write's ack",
                       ack_wait=False),
        TransferPolicy("single_staging", "one pinned staging buffer, refilled in place while its copy is "
                       "pending", staging_buffers=1),
        TransferPolicy("no_load_fence", "no load fence: a load into reallocated pages is ordered only after the "
                       "scheduling stream, not after the forward still writing them (before sgl-project/sglang"
                       "#36738)", load_fence=False),
        TransferPolicy("cow_layer_wait", "a deferred Mamba copy-on-write ordered only by its first layer's event, "
                       "not by the load op's final one (before sgl-project/sglang#36743)", cow_waits_load=False),
    )
}


def transfer_policy(name: str | None) -> TransferPolicy:
    """The named variant; a scenario that names none runs the engine's."""
    return TRANSFERS[name or ENGINE.name]


# ---------------------------------------------------------------- what is backed up


class HostBackup:
    """Pinned host memory a write-back copies into: the batch's new-token KV per attention layer,
    in batch token order, and each request's Mamba state per Mamba layer. Its tensors have the
    shapes of the probe arena's backup segments (`harness.model.arena`), which the harness copies
    them into to compare them with ground truth. `seed` fills it with other data (a next batch's)."""

    def __init__(self, dev: Device, layout: Layout, name: str = "backup", seed: int | None = None):
        s = layout.shape
        dt = dtype_of(s.dtype)
        self.name = name
        n_a, n_m, b, t = len(s.attention_layers), len(s.mamba_layers), len(layout.requests), layout.total_new
        g = torch.Generator().manual_seed(seed) if seed is not None else None

        def host(shape: tuple[int, ...]) -> torch.Tensor:
            x = dev.empty_host(shape, dt)
            x.copy_(torch.randn(shape, generator=g).to(dt) if g is not None else torch.zeros(shape, dtype=dt))
            return x

        self.k = host((n_a, t, s.kv_heads, s.head_dim))
        self.v = host((n_a, t, s.kv_heads, s.head_dim))
        self.conv = host((n_m, b, s.d_inner, s.conv - 1))
        self.ssm = host((n_m, b, s.d_inner, s.state))

    @property
    def tensors(self) -> dict[str, torch.Tensor]:
        return {Pool.K: self.k, Pool.V: self.v, Pool.CONV: self.conv, Pool.SSM: self.ssm}


@dataclass(frozen=True)
class BackupCopy:
    """One device-to-host copy of a write-back: `src` (device view, `region`) into `dst` (host
    view, `host_region`)."""

    dst: torch.Tensor
    src: torch.Tensor
    region: Region
    host_region: Region


def backup_regions(layout: Layout, layer: int) -> list[Region]:
    """The device regions a write-back of `layer` reads: the new tokens' KV slots (attention),
    the batch's Mamba state slots (Mamba)."""
    if layout.shape.layers[layer] == "A":
        return [Region(p, layer, r.new.start, r.new.stop) for r in layout.requests for p in (Pool.K, Pool.V)]
    rows = layout.mamba_rows
    return [Region(p, layer, rows.start, rows.stop) for p in (Pool.CONV, Pool.SSM)]


def _pairs(layout: Layout, pool: HybridPool, host: HostBackup, layer: int) -> Iterator[BackupCopy]:
    """Each (device view, host view) pair of one layer's write-back, with both regions, in the
    order of `backup_regions`."""
    if layout.shape.layers[layer] == "A":
        a = pool.kv.layer_index[layer]
        for r in layout.requests:
            for p, device in ((Pool.K, pool.kv.k), (Pool.V, pool.kv.v)):
                yield BackupCopy(host.tensors[p][a, r.tokens.start : r.tokens.stop],
                                 device[a, r.new.start : r.new.stop], Region(p, layer, r.new.start, r.new.stop),
                                 Region(Pool.on_host(host.name, p), layer, r.tokens.start, r.tokens.stop))
        return
    m, rows = pool.mamba.layer_index[layer], layout.mamba_rows
    for p, device in ((Pool.CONV, pool.mamba.conv), (Pool.SSM, pool.mamba.ssm)):
        yield BackupCopy(host.tensors[p][m], device[m, rows], Region(p, layer, rows.start, rows.stop),
                         Region(Pool.on_host(host.name, p), layer, 0, len(layout.requests)))


def plan_backup(layout: Layout, pool: HybridPool, host: HostBackup) -> list[list[BackupCopy]]:
    """Each layer's device-to-host copies, as views, built once (an op only enqueues them)."""
    return [list(_pairs(layout, pool, host, layer)) for layer in range(layout.shape.num_layers)]


def plan_refill(layout: Layout, pool: HybridPool, host: HostBackup) -> CopyPlan:
    """A load op (one chunk a layer) that writes `host`'s data into the slots a write-back reads:
    the next batch's load into slots freed and allocated again."""
    return [[[LayerCopy(c.src, c.dst, c.region, c.host_region) for c in layer]]
            for layer in plan_backup(layout, pool, host)]


# ---------------------------------------------------------------- the write-back


@dataclass
class WriteOp:
    """One write-back, as the engine's `HiCacheAck` holds it: its start event and its ack's
    finish event (recorded after the last copy on the device-to-host stream)."""

    dev: Device
    start_event: Event
    ack_start: Event
    finish_event: Event
    policy: TransferPolicy
    held: bool = False  # a gate holds its stream before the copies

    def release(self) -> None:
        """Before the backed-up slots are freed for reuse, on the current stream: order it after
        the ack's finish event (the allocator's `_wait_hicache_transfers`). The `no_ack_wait`
        variant reuses them at once."""
        if self.policy.ack_wait:
            self.dev.current_stream().wait_event(self.finish_event)


class WriteBack:
    """The engine's write-back path on one scenario's pools: its streams, events and copies.

    `schedule` is the scheduler's current stream: under overlap scheduling it is not the forward
    stream, so a start event recorded there orders nothing after the forward.
    """

    def __init__(self, dev: Device, layout: Layout, pool: HybridPool, forward: Stream, host: HostBackup):
        self.dev, self.forward, self.host = dev, forward, host
        self.d2h = dev.Stream("write-back")
        self.schedule = dev.Stream("schedule")
        self.plan = plan_backup(layout, pool, host)
        # One set: the host synchronizes after every replay of a write-back hazard (its host copy is
        # the host's to poison: `harness.run.replay.Replayer`), so no op is pending at the next.
        self.start_event, self.fenced = dev.Event(), dev.Event()
        self.ack_start, self.ack_finish = dev.Event(), dev.Event()

    def host_regions(self) -> list[Region]:
        return [c.host_region for layer in self.plan for c in layer]

    def write(self, fault: FaultPlan, policy: TransferPolicy, gate: Gate | None = None) -> WriteOp:
        """`start_writing`: back up every layer, enqueued now (with `fault`'s pauses before each
        layer's copies and, when given, `gate` held before the first, on the D2H stream)."""
        dev, d2h = self.dev, self.d2h
        self.start_event.record(self.schedule)
        if policy.write_fence:
            self.fenced.record(self.forward)  # d2h.wait_stream(write_fence_stream)
            d2h.wait_event(self.fenced)
        op = WriteOp(dev, self.start_event, self.ack_start, self.ack_finish, policy)
        with dev.stream(d2h):
            self.start_event.wait(d2h)
            self.ack_start.record()
            if gate is not None:
                gate.hold()
                op.held = True
            for layer, copies in enumerate(self.plan):
                us = fault.pause_us(layer)
                if us > 0:
                    dev.delay(us)
                for c in copies:
                    dev.copy_to_host(c.dst, c.src, c.region, c.host_region)
            self.ack_finish.record()
        return op


# ---------------------------------------------------------------- staging for loads


class StagingRing:
    """Pinned staging buffers a load op copies from, refilled by the host before each load.

    Buffer 0 is the scenario's host pool (what every load op of the replay loop reads); the
    engine's ring adds a second. Fills go round the policy's ring (`staging_buffers`), starting
    over with each replay. Before it refills a buffer, the engine's way waits for the copies that
    last read it (`mark_read`); the one-buffer variant rewrites it in place at once.

    Within a replay that is the transfer path under test. Across replays it is not: a replay loop
    that ran a batch of replays ahead of the device let the next replay's refill reach the previous
    replay's pending next-batch copies, and that replay's final state read this batch's bytes (on
    an H200, 15 to 55 of 60 replays). A hazard whose preparation the host writes therefore runs one
    replay a batch (`harness.run.replay.Replayer`): each replay starts once the last has finished.
    """

    def __init__(self, dev: Device, layout: Layout, pool: HybridPool, first: HostPool, timeout_s: float = 30.0):
        self.dev, self.timeout_s = dev, timeout_s
        self.buffers = [first, HostPool(dev, layout, 0, name="staging1")]
        self.copies = [plan_copies(layout, b, pool) for b in self.buffers]
        self.read_by: list[Event | None] = [None] * len(self.buffers)
        self.next = 0

    def start_over(self) -> None:
        """A new replay: the ring starts at buffer 0 (no copy of the last replay still reads one: the
        replay loop runs this hazard one replay a batch)."""
        self.next = 0

    def fill(self, data: HostPool, what: str, policy: TransferPolicy) -> int:
        """Refill the next buffer of `policy`'s ring with `data`'s bytes, on the host; its index."""
        i = self.next % policy.staging_buffers
        self.next += 1
        last = self.read_by[i]
        if policy.waits_for_staging and last is not None and not self.dev.host_wait(last, self.timeout_s):
            raise ReplayTimeout(f"staging buffer {i}'s last copies did not finish within {self.timeout_s:g}s")
        buf = self.buffers[i]
        regions = [c.source for layer in self.copies[i] for chunk in layer for c in chunk if c.source is not None]

        def refill() -> None:
            for name in ("k", "v", "conv", "ssm"):
                getattr(buf, name).copy_(getattr(data, name))

        self.dev.host_write(refill, regions, what)
        return i

    def mark_read(self, i: int, stream: Stream) -> None:
        """Everything enqueued on `stream` so far may read buffer `i`: record where that ends."""
        event = self.read_by[i] or self.dev.Event()
        event.record(stream)
        self.read_by[i] = event


__all__ = [
    "ENGINE", "TRANSFERS", "BackupCopy", "HostBackup", "StagingRing", "TransferPolicy", "WriteBack", "WriteOp",
    "backup_regions", "plan_backup", "plan_refill", "transfer_policy",
]
