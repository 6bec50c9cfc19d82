"""Hazards as strategy objects: what a replay does around the forward so that one kind of race
can show.

Each hazard says how the pool slots are prepared before the load op, what happens
after the forward, and which side a gate fault holds so that the racing side lands
first. The replay loop (`harness.run.replay`) runs the same steps for every
hazard; ground truth runs them with the host waiting between the steps.

- read-after-write (raw): the loaded slots are poisoned, then loaded back; a read
  before its copy lands reads poison or half-loaded data.
- write-after-write (waw): the slots already hold the right data (resident state)
  and the load op re-copies it; a copy that lands after the prefill wrote the Mamba
  state in place clobbers it, which shows in the post-prefill state only.
- write-after-read (war): after the batch's forward, the next batch's load op
  writes other data into the same slots; if it is not ordered after the forward,
  the forward's reads (and outputs) show the next batch's data. The gate holds the
  forward until that load has landed.

The other direction (`harness.protocol.writeback`): each of these runs the transfer
path the scenario names (`transfer`: the engine's, or a variant with one defect).

- store-before-compute: after the forward, the write-back backs up the slots the
  forward wrote (new tokens' KV, the Mamba state); if the device-to-host copy is not
  ordered after the forward (no write fence), the host copy holds what was there
  before (poison, the pre-prefill state). The gate holds the forward until the copy
  has landed; a delay on the load stream makes the (fenced) forward late.
- reuse-before-backup: after the write-back, the next batch's load writes other data
  into the backed-up slots (freed and allocated again); if it is not ordered after the
  write-back's ack, the host copy holds the next batch's data. The gate (and a delay)
  holds the write-back stream, so the next batch's load lands first.
- staging overwrite: every load op copies from a pinned staging buffer the host
  refills before it; the next batch's refill happens while this batch's copies are
  pending (the host runs ahead). With one buffer refilled in place, the device
  receives the next batch's bytes and the forward reads them. The gate (and a
  delay) holds the load stream, so this batch's copies are still pending.

SGLang HiCache classes since 0.5.23 (each also names a transfer path):

- forward over backup (sgl-project/sglang#38300): after the write-back, the next
  forward overwrites the backed-up slots in place; the join is reuse-before-backup's
  wait on the write's finish event. The gate holds the write-back stream.
- reload before write (#36738): the next batch's load, started on a scheduling stream
  of its own, restores into the pages the forward writes; without the load fence the
  forward's writes land after it. The gate holds the forward.
- Mamba copy-on-write (#36743): before the fence, a deferred copy reads every Mamba
  layer's loaded slot at once (`before_forward`); ordered by one layer's event, it
  reads the later layers half loaded.

vLLM's offloading load (vllm-project/vllm#50696):

- load before zeroing: the engine zeroes the blocks a request was just allocated on the
  forward stream, before the load of its offloaded prefix into them; a load not ordered
  after the forward stream lands first and is wiped. The gate holds the forward stream
  before the zeroing, so an unordered load lands first.

A hazard's ground truth runs the engine's transfer path (`truth`): the truth must
not depend on the variant under test.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import torch

from harness.devices.base import Device, Event, Gate, Stream
from harness.faults.plan import FaultPlan
from harness.protocol.layout import Layout
from harness.protocol.loadback import CopyPlan, plan_copies
from harness.protocol.pools import HostPool, HybridPool
from harness.protocol.schedules import LoadOp
from harness.protocol.writeback import (
    ENGINE,
    HostBackup,
    StagingRing,
    TransferPolicy,
    WriteBack,
    backup_regions,
    plan_backup,
    plan_refill,
)
from harness.records.errors import EngineContractBroken
from harness.records.scenario import Fault, Hazard
from harness.records.trace import Pool, Region


@dataclass(frozen=True)
class HazardBed:
    """What a hazard acts on: the scenario's pools and copies, and a way to start a load op.

    `targets` are the regions every load op writes; `host` the host pool it copies from,
    on the `load` stream. `transfer` is the scenario's transfer path; `writeback` the
    write-back, for the hazards that need one (`HazardStrategy.backs_up`).
    """

    dev: Device
    layout: Layout
    pool: HybridPool
    copies: CopyPlan
    targets: tuple[Region, ...]
    poison: float
    seed: int
    chunks: int
    host: HostPool
    load: Stream
    transfer: TransferPolicy = ENGINE
    writeback: WriteBack | None = None
    timeout_s: float = 30.0
    # The probe arena's views a deferred copy-on-write writes into, by pool (`HazardStrategy.copies_slots`)
    cow: Mapping[str, torch.Tensor] | None = None


# load(copies, plan): start another batch's load op of `copies`, leaving this batch's
# consumer index as it was.
OtherLoad = Callable[[CopyPlan, FaultPlan], LoadOp]


class Racing(Protocol):
    """What races the forward's side (a load op, a write-back): the replay loop opens the gate
    once its finish event has completed."""

    @property
    def finish_event(self) -> Event: ...


class HazardStrategy:
    """Read-after-write, the default: poison the slots, load them back, run the forward."""

    holds_forward = False  # a gate fault holds the load stream (False) or the forward (True)
    holds_own = False  # ... or a stream the hazard holds itself (the gate is given to after_forward)
    backs_up = False  # it needs the write-back path (and the probe arena's host-copy units)
    uses_transfer = False  # it runs the scenario's transfer path (`Scenario.transfer`)
    # `prepare` is device work alone (no host writes, no host waits): it may be captured once and
    # replayed as a graph (the replay loop's poisoning is).
    prepares_on_device = True
    copies_slots = False  # it copies whole Mamba slots into the probe arena (`HazardBed.cow`)
    # A gate fault holds the forward stream before the slots' preparation (`prepare`: work the compute
    # stream has pending before the load op), and the harness opens it once the load op has landed.
    holds_compute = False
    # The batch's load op is the engine's offloading load (an offloaded prefix loaded back into freshly
    # allocated blocks: the adapter's `offload_loader`, with the scenario's transfer), where it has one.
    loads_offloaded = False

    def setup(self, bed: HazardBed) -> None:
        """Once per scenario, before anything runs."""

    def prepare(self, bed: HazardBed) -> None:
        """Before the load op, on the forward stream: the slots the load op will write."""
        poison(bed)

    def before_forward(self, bed: HazardBed, op: LoadOp | None, truth: bool = False) -> None:
        """Right after the batch's load op is enqueued (`op`; None: no load), before the fence, on
        the forward stream: what the scheduler does to the batch while its load lands."""

    def after_forward(self, bed: HazardBed, plan: FaultPlan, load: OtherLoad, gate: Gate | None = None,
                      truth: bool = False) -> Racing | None:
        """Right after the forward is enqueued; what races it (a load op, a write-back), or None.

        `gate` is the gate fault's gate when `holds_own` (None otherwise); `truth` says this is
        ground truth, which runs the engine's transfer path whatever the scenario's.
        """
        return None


class ReadAfterWrite(HazardStrategy):
    """Read-after-write (stale read): the loaded slots are poisoned, then loaded back; a read before
    its copy lands reads poison or half-loaded data."""


class WriteAfterWrite(HazardStrategy):
    """Write-after-write (clobber): the slots already hold the right data and the load op copies it
    again; a Mamba-state copy that lands after the prefill wrote the state clobbers it."""

    def prepare(self, bed: HazardBed) -> None:
        # The right data already there (resident state): only a late copy can be seen.
        for layer in bed.copies:
            for chunk in layer:
                for c in chunk:
                    bed.dev.copy_async(c.dst, c.src, c.region)


class WriteAfterRead(HazardStrategy):
    """Write-after-read (early reuse): the next batch's load-back writes the slots a replay still
    reads."""

    holds_forward = True

    def setup(self, bed: HazardBed) -> None:
        other = HostPool(bed.dev, bed.layout, bed.seed + 1)  # the next batch: other data
        self.next_copies = plan_copies(bed.layout, other, bed.pool, bed.chunks)

    def after_forward(self, bed: HazardBed, plan: FaultPlan, load: OtherLoad, gate: Gate | None = None,
                      truth: bool = False) -> Racing | None:
        # The next batch's load into the same slots, with no fault of its own.
        return load(self.next_copies, FaultPlan(Fault(), plan.replay))


class _WriteBackHazard(HazardStrategy):
    """What both write-back hazards share: the slots the forward writes are poisoned too (so a
    copy that reads them early reads poison, not the previous replay's data), and so is the host
    copy (so a copy that never lands shows)."""

    backs_up = True
    uses_transfer = True
    prepares_on_device = False  # the host copy is poisoned by the host

    def setup(self, bed: HazardBed) -> None:
        assert bed.writeback is not None, "a write-back hazard needs the testbed's write-back path"
        self.writeback = bed.writeback

    def prepare(self, bed: HazardBed) -> None:
        poison(bed, new_tokens=True)
        host, p = self.writeback.host, bed.poison

        def fill() -> None:
            for t in host.tensors.values():
                t.fill_(p)

        bed.dev.host_write(fill, self.writeback.host_regions(), "poison the host copy")

    def policy(self, bed: HazardBed, truth: bool) -> TransferPolicy:
        return ENGINE if truth else bed.transfer


class StoreBeforeCompute(_WriteBackHazard):
    """Store-before-compute: a device-to-host backup copy reads the slots before the forward that
    writes them has finished."""

    holds_forward = True  # the forward that writes the slots has not run: the copy must wait for it

    def after_forward(self, bed: HazardBed, plan: FaultPlan, load: OtherLoad, gate: Gate | None = None,
                      truth: bool = False) -> Racing | None:
        # The fault makes the forward late (held, or behind a delayed load); the write-back
        # itself runs with none.
        return self.writeback.write(FaultPlan(Fault(), plan.replay), self.policy(bed, truth))


class ReuseBeforeBackup(_WriteBackHazard):
    """Reuse-before-backup: the next batch writes a slot whose device-to-host backup copy has not
    finished."""

    holds_own = True  # the write-back stream: the next batch's load must land first to show

    def setup(self, bed: HazardBed) -> None:
        super().setup(bed)
        # The next batch's data, loaded into the very slots the write-back reads.
        self.refill = plan_refill(bed.layout, bed.pool, HostBackup(bed.dev, bed.layout, "host_next", bed.seed + 1))

    def after_forward(self, bed: HazardBed, plan: FaultPlan, load: OtherLoad, gate: Gate | None = None,
                      truth: bool = False) -> Racing | None:
        op = self.writeback.write(plan, self.policy(bed, truth), gate)
        op.release()  # the slots are freed; the next batch is allocated them
        return load(self.refill, FaultPlan(Fault(), plan.replay))


@dataclass(frozen=True)
class _Done:
    """Work a hazard enqueued on the forward stream, done once `finish_event` completes."""

    finish_event: Event


class ForwardOverBackup(_WriteBackHazard):
    """Reuse-before-backup by the next forward (sgl-project/sglang#38300): the write-back's
    device-to-host stream forks from the scheduling stream, and the next forward overwrites the
    backed-up slots in place (the new tokens' KV pages, the Mamba state) without joining the
    write's finish event.

    The join is `WriteOp.release` on the forward stream, the path `engine` (the fix proposed in
    #38463 rejoins the write onto the caller's current stream through its finish event, as the
    allocator's `_wait_hicache_transfers` does before a reuse); `no_ack_wait` leaves the fork
    open. The next forward's writes stand as one kernel on the forward stream that writes other
    data (kept on the device) into every backed-up slot."""

    holds_own = True  # the write-back stream: the next forward's writes must land first to show

    def setup(self, bed: HazardBed) -> None:
        super().setup(bed)
        nxt = HostBackup(bed.dev, bed.layout, "host_next", bed.seed + 1)
        device = bed.dev.torch_device
        self.writes = [(c.src, c.dst.to(device)) for layer in plan_backup(bed.layout, bed.pool, nxt) for c in layer]
        self.regions = tuple(c.region for layer in self.writeback.plan for c in layer)

    def after_forward(self, bed: HazardBed, plan: FaultPlan, load: OtherLoad, gate: Gate | None = None,
                      truth: bool = False) -> Racing | None:
        op = self.writeback.write(plan, self.policy(bed, truth), gate)
        op.release()  # the forward stream joins the write's finish (not in `no_ack_wait`)
        writes = self.writes

        def next_forward() -> None:
            for slots, value in writes:
                slots.copy_(value)

        bed.dev.launch(next_forward, writes=self.regions, what="next forward's writes")
        done = bed.dev.Event()
        done.record()
        return _Done(done)


class ReloadBeforeWrite(HazardStrategy):
    """Write-after-write on reallocated pages (sgl-project/sglang#36738): under overlap scheduling
    the scheduler frees the pages a batch's forward writes (its new tokens' KV, its Mamba state)
    while that forward is still in flight, allocates them to the next batch, and the next batch's
    load-back restores its prefix into them.

    The load op starts on the scheduling stream (its own here, which nothing orders after the
    forward): its start event orders nothing after the forward. With the load fence (transfer
    `engine`) the load stream first waits on the forward stream (`load_fence_stream`); without it
    (`no_load_fence`) the restore can land before the forward's writes, which then clobber it (and
    the forward reads the next batch's data). The gate holds the forward until the restore has
    landed. The post-prefill state is observed after the restore, so its truth is the next
    batch's data."""

    holds_forward = True
    uses_transfer = True

    def setup(self, bed: HazardBed) -> None:
        self.schedule = bed.dev.Stream("schedule")  # the overlap scheduler's stream, not the forward's
        self.fenced = bed.dev.Event()
        # The next batch's prefix, restored into the very pages this batch's forward writes.
        self.restore = plan_refill(bed.layout, bed.pool, HostBackup(bed.dev, bed.layout, "host_next", bed.seed + 1))

    def after_forward(self, bed: HazardBed, plan: FaultPlan, load: OtherLoad, gate: Gate | None = None,
                      truth: bool = False) -> Racing | None:
        policy = ENGINE if truth else bed.transfer
        if policy.load_fence:  # host_to_device_stream.wait_stream(load_fence_stream)
            self.fenced.record()  # on the forward stream, current here
            bed.load.wait_event(self.fenced)
        with bed.dev.stream(self.schedule):  # start_loading on the scheduler's current stream
            return load(self.restore, FaultPlan(Fault(), plan.replay))


class MambaCopyOnWrite(HazardStrategy):
    """A deferred Mamba copy-on-write (sgl-project/sglang#36743): the scheduler copies a restored
    radix slot into the request's own slot, every Mamba layer's state at once, while the load-back
    restores it layer by layer.

    The copy reads the whole slot before the forward's per-layer waits could order it: with the
    fix (transfer `engine`) it first waits on the load op's final event
    (`wait_for_hicache_load_complete`); without it (`cow_layer_wait`) it is ordered only by the
    first Mamba layer's event (the per-layer wait of the layer it reads first), so the later
    layers are copied half loaded. The request's slot is the probe arena's copy-on-write segment;
    the forward itself is the scenario's (its fence orders it).

    Where the pools have a copy-on-write of their own (`HybridPool.engine_copies_on_write`: an
    engine's), the copy is theirs, with whatever wait their code enqueues: the restored slots are
    copied into the pool's next free slots (the request's own: the scenario's `mamba_slots` must
    hold them), poisoned before each load op, and those slots are then copied into the probe
    arena on the same stream. Transfer `cow_layer_wait` binds the pools' wait to the first Mamba
    layer's event; `engine` leaves it as their code has it."""

    copies_slots = True
    uses_transfer = True

    def setup(self, bed: HazardBed) -> None:
        assert bed.cow is not None, "a copy-on-write hazard needs the probe arena's copy-on-write views"
        layout, pool, dest = bed.layout, bed.pool, bed.cow
        rows = layout.mamba_rows
        lids = layout.shape.mamba_layers
        self.reads = tuple(Region(p, lid, rows.start, rows.stop) for lid in lids for p in (Pool.CONV, Pool.SSM))
        self.engine = pool.engine_copies_on_write
        if not self.engine:
            def copy() -> None:
                dest[Pool.CONV].copy_(pool.mamba.conv[:, rows])
                dest[Pool.SSM].copy_(pool.mamba.ssm[:, rows])

            self.copy = copy
            return
        own = slice(rows.stop, rows.stop + (rows.stop - rows.start))
        if own.stop > layout.mamba_slots:
            raise EngineContractBroken(
                f"the pools' copy-on-write copies {own.stop - own.start} restored slots into the requests' own, "
                f"slots {own.start}-{own.stop - 1}: the model needs mamba_slots >= {own.stop}, "
                f"not {layout.mamba_slots}")
        self.own = own
        self.writes = tuple(Region(p, lid, own.start, own.stop) for lid in lids for p in (Pool.CONV, Pool.SSM))
        device = pool.mamba.ssm.device
        self.src = torch.arange(rows.start, rows.stop, dtype=torch.int64, device=device)
        self.dst = torch.arange(own.start, own.stop, dtype=torch.int64, device=device)

        def collect() -> None:
            dest[Pool.CONV].copy_(pool.mamba.conv[:, own])
            dest[Pool.SSM].copy_(pool.mamba.ssm[:, own])

        def poison_own() -> None:
            pool.mamba.conv[:, own].fill_(bed.poison)
            pool.mamba.ssm[:, own].fill_(bed.poison)

        self.collect, self.poison_own = collect, poison_own

    def prepare(self, bed: HazardBed) -> None:
        poison(bed)
        if self.engine:  # a copy that never ran must not leave the last one's right data there
            bed.dev.launch(self.poison_own, writes=self.writes, what="poison (the requests' own Mamba slots)")

    def before_forward(self, bed: HazardBed, op: LoadOp | None, truth: bool = False) -> None:
        if op is None:
            return  # no load pending: no restored slot to copy
        first = bed.layout.shape.mamba_layers[0]
        waits_load = (ENGINE if truth else bed.transfer).cow_waits_load
        if self.engine:
            bed.pool.copy_on_write(bed.dev, self.src, self.dst, self.reads, self.writes,
                                   None if waits_load else first)
            bed.dev.launch(self.collect, reads=self.writes, what="the requests' own Mamba slots, observed")
            return
        if waits_load:
            op.finish_event.wait(bed.dev.current_stream())
        else:
            op.load_events[first].wait(bed.dev.current_stream())
        bed.dev.launch(self.copy, reads=self.reads, what="deferred Mamba copy-on-write")


class LoadBeforeZeroing(HazardStrategy):
    """Write-after-write on freshly allocated blocks (vllm-project/vllm#50696): the engine zeroes the
    blocks a request was just allocated (vLLM's `needs_kv_cache_zeroing`, any model with Mamba layers)
    on the forward stream, then loads the request's offloaded prefix into them; a load that is not
    ordered after the forward stream can land first, the zeroing behind it wipes it, and the forward
    reads zeros.

    The slots the load writes are poisoned, then zeroed (one kernel writing them: the engine's
    zeroing), both on the forward stream before the load op. The gate holds the forward stream before
    them (`holds_compute`), so an unordered load lands first; the harness opens it once the load has
    landed, or after `hold_us` where the load waits for the forward stream. The load is the engine's
    offloading load where the adapter has one (vLLM's CPU offloading worker; transfer `no_load_fence`
    removes its wait on the forward stream), else the harness's own load op, whose start event,
    recorded on the forward stream, orders it after the zeroing (schedule `no_start_wait` does not)."""

    holds_compute = True
    loads_offloaded = True
    uses_transfer = True

    def setup(self, bed: HazardBed) -> None:
        self.written = tuple(r for r in bed.targets if r.pool in (Pool.K, Pool.V))  # the KV blocks vLLM zeroes
        layout, pool = bed.layout, bed.pool

        def zero() -> None:
            for r in layout.requests:
                pool.kv.k[:, r.prefix.start : r.prefix.stop].fill_(0.0)
                pool.kv.v[:, r.prefix.start : r.prefix.stop].fill_(0.0)

        self.zero = zero

    def prepare(self, bed: HazardBed) -> None:
        poison(bed)
        bed.dev.launch(self.zero, writes=self.written, what="zero the freshly allocated blocks")


class StagingOverwrite(HazardStrategy):
    """Staging overwrite: a pinned staging buffer is refilled while its host-to-device copy is still
    pending.

    Every load op copies from a staging buffer the host refills first; the scenario's host
    pool is buffer 0, refilled with this batch's bytes before the load op."""

    uses_transfer = True
    prepares_on_device = False  # the host refills the staging buffer

    def setup(self, bed: HazardBed) -> None:
        self.ring = StagingRing(bed.dev, bed.layout, bed.pool, bed.host, bed.timeout_s)
        # The batches' bytes, kept where no load copies from them.
        self.this_batch = HostPool(bed.dev, bed.layout, bed.seed, name="batch")
        self.next_batch = HostPool(bed.dev, bed.layout, bed.seed + 1, name="batch_next")

    def prepare(self, bed: HazardBed) -> None:
        poison(bed)
        self.ring.start_over()
        self.ring.fill(self.this_batch, "refill staging (this batch)", bed.transfer)  # buffer 0

    def after_forward(self, bed: HazardBed, plan: FaultPlan, load: OtherLoad, gate: Gate | None = None,
                      truth: bool = False) -> Racing | None:
        ring = self.ring
        ring.mark_read(0, bed.load)  # this batch's copies, enqueued before the forward
        i = ring.fill(self.next_batch, "refill staging (next batch)", ENGINE if truth else bed.transfer)
        op = load(ring.copies[i], FaultPlan(Fault(), plan.replay))
        ring.mark_read(i, bed.load)
        return op


HAZARDS: dict[Hazard, type[HazardStrategy]] = {
    Hazard.RAW: ReadAfterWrite,
    Hazard.WAW: WriteAfterWrite,
    Hazard.WAR: WriteAfterRead,
    Hazard.STORE: StoreBeforeCompute,
    Hazard.REUSE: ReuseBeforeBackup,
    Hazard.STAGING: StagingOverwrite,
    Hazard.FORWARD_OVER_BACKUP: ForwardOverBackup,
    Hazard.RELOAD: ReloadBeforeWrite,
    Hazard.COW: MambaCopyOnWrite,
    Hazard.ZEROING: LoadBeforeZeroing,
}


def poison(bed: HazardBed, new_tokens: bool = False) -> None:
    """Fill every slot the load-back writes with the poison value (one kernel); with `new_tokens`,
    the slots the forward writes the new tokens' KV into as well."""
    layout, pool, p = bed.layout, bed.pool, bed.poison
    written = bed.targets
    if new_tokens:
        written += tuple(r for lid in layout.shape.attention_layers for r in backup_regions(layout, lid))

    s = layout.shape
    index = [s.index_rows(r.prefix) for r in layout.requests] if s.indexer else []

    def fill() -> None:
        for r in layout.requests:
            kv = slice(r.prefix.start, r.new.stop if new_tokens else r.prefix.stop)
            pool.kv.k[:, kv].fill_(p)
            pool.kv.v[:, kv].fill_(p)
        for rows in index:
            pool.kv.idx[:, rows.start:rows.stop].fill_(p)
        pool.mamba.conv[:, layout.mamba_rows].fill_(p)
        pool.mamba.ssm[:, layout.mamba_rows].fill_(p)

    bed.dev.launch(fill, writes=written, what="poison")


def make_hazard(kind: Hazard, bed: HazardBed) -> HazardStrategy:
    hazard = HAZARDS[kind]()
    hazard.setup(bed)
    return hazard


__all__ = ["HAZARDS", "HazardBed", "HazardStrategy", "OtherLoad", "Racing", "make_hazard"]
