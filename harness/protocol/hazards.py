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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from harness.devices.base import Device
from harness.protocol.layout import Layout
from harness.protocol.loadback import CopyPlan, plan_copies
from harness.protocol.pools import HostPool, HybridPool
from harness.protocol.schedules import LoadOp
from harness.records.faults import FaultPlan
from harness.records.scenario import Fault, Hazard
from harness.records.trace import Region


@dataclass(frozen=True)
class HazardBed:
    """What a hazard acts on: the scenario's pools and copies, and a way to start a load op.

    `targets` are the regions every load op writes.
    """

    dev: Device
    layout: Layout
    pool: HybridPool
    copies: CopyPlan
    targets: tuple[Region, ...]
    poison: float
    seed: int
    chunks: int


# load(copies, plan): start another batch's load op of `copies`, leaving this batch's
# consumer index as it was.
OtherLoad = Callable[[CopyPlan, FaultPlan], LoadOp]


class HazardStrategy:
    """Read-after-write, the default: poison the slots, load them back, run the forward."""

    holds_forward = False  # a gate fault holds the load stream (False) or the forward (True)

    def setup(self, bed: HazardBed) -> None:
        """Once per scenario, before anything runs."""

    def prepare(self, bed: HazardBed) -> None:
        """Before the load op, on the forward stream: the slots the load op will write."""
        poison(bed)

    def after_forward(self, bed: HazardBed, plan: FaultPlan, load: OtherLoad) -> LoadOp | None:
        """Right after the forward is enqueued; a load op that races it, or None."""
        return None


class ReadAfterWrite(HazardStrategy):
    pass


class WriteAfterWrite(HazardStrategy):
    def prepare(self, bed: HazardBed) -> None:
        # The right data already there (resident state): only a late copy can be seen.
        for layer in bed.copies:
            for chunk in layer:
                for c in chunk:
                    bed.dev.copy_async(c.dst, c.src, c.region)


class WriteAfterRead(HazardStrategy):
    holds_forward = True

    def setup(self, bed: HazardBed) -> None:
        other = HostPool(bed.dev, bed.layout, bed.seed + 1)  # the next batch: other data
        self.next_copies = plan_copies(bed.layout, other, bed.pool, bed.chunks)

    def after_forward(self, bed: HazardBed, plan: FaultPlan, load: OtherLoad) -> LoadOp | None:
        # The next batch's load into the same slots, with no fault of its own.
        return load(self.next_copies, FaultPlan(Fault(), plan.replay))


HAZARDS: dict[Hazard, type[HazardStrategy]] = {
    Hazard.RAW: ReadAfterWrite,
    Hazard.WAW: WriteAfterWrite,
    Hazard.WAR: WriteAfterRead,
}


def poison(bed: HazardBed) -> None:
    """Fill every slot the load-back writes with the poison value (one kernel)."""
    layout, pool, p = bed.layout, bed.pool, bed.poison

    def fill() -> None:
        for r in layout.requests:
            pool.kv.k[:, r.prefix.start : r.prefix.stop].fill_(p)
            pool.kv.v[:, r.prefix.start : r.prefix.stop].fill_(p)
        pool.mamba.conv[:, layout.mamba_rows].fill_(p)
        pool.mamba.ssm[:, layout.mamba_rows].fill_(p)

    bed.dev.launch(fill, writes=bed.targets, what="poison")


def make_hazard(kind: Hazard, bed: HazardBed) -> HazardStrategy:
    hazard = HAZARDS[kind]()
    hazard.setup(bed)
    return hazard


__all__ = ["HAZARDS", "HazardBed", "HazardStrategy", "OtherLoad", "make_hazard"]
