"""The probe arena's layout: one flat buffer, its segments, and the unit each row stands for.

Everything a forward read from the pools (per-layer probes, the sparse-attention index's among
them where the model has one), the post-prefill Mamba
state and the output sit in one flat arena, so that poisoning and comparing are a
few kernels, not one per layer. Each row of each segment is a *unit*: one slot of
one pool at one layer, one request's final state, or one output token. The model
writes through views of the segments (`ProbeSet`); the oracle compares unit by unit
(`harness.run.oracle`). Both read this one layout.

A scenario with a write-back adds its host copy: one unit per slot it backs up (the
new tokens' KV per attention layer, each request's Mamba state per Mamba layer), in
the layout of `harness.protocol.writeback.HostBackup`, which the harness copies in
when it observes a replay.

A scenario with a deferred Mamba copy-on-write (`harness.protocol.hazards.MambaCopyOnWrite`) adds the
request-owned slots it copies into: one read unit per Mamba layer and request (`cow_conv`,
`cow_ssm`), compared bit-exact with ground truth as the forward's own reads are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.protocol.layout import Layout
from harness.records.trace import Pool

READ, FINAL, OUTPUT = "read", "final", "output"
BACKUP = "backup"  # a backed-up slot's host copy (the write-back's)


@dataclass(frozen=True)
class Unit:
    segment: str  # arena segment name (k, v, idx, conv, ssm, final_conv, final_ssm, out, backup_*, cow_*)
    kind: str  # read | final | output | backup
    layer: int  # global layer id; -1 for output
    pool: str  # k | v | idx | conv | ssm | out
    slot: int  # pool slot (read, final) or token row (output)
    request: int


@dataclass(frozen=True)
class Segment:
    name: str
    shape: tuple[int, ...]  # the view's shape; its leading dimensions run over the units
    units: tuple[Unit, ...]  # in memory order

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def unit_size(self) -> int:
        return self.size // len(self.units) if self.units else 0


@dataclass(frozen=True)
class ArenaLayout:
    segments: tuple[Segment, ...]

    @property
    def size(self) -> int:
        return sum(s.size for s in self.segments)

    @property
    def units(self) -> list[Unit]:
        return [u for s in self.segments for u in s.units]

    def unit_starts(self) -> list[range]:
        """Each segment's units' first elements in the arena, as a range per segment (in unit order):
        a row of a unit is always written whole, so one element marks whether it was written."""
        out, at = [], 0
        for s in self.segments:
            out.append(range(at, at + s.size, s.unit_size) if s.units else range(at, at))
            at += s.size
        return out

    def spans(self) -> dict[str, tuple[int, int]]:
        """Each segment's [start, stop) in the arena."""
        out, at = {}, 0
        for s in self.segments:
            out[s.name] = (at, at + s.size)
            at += s.size
        return out


def arena_layout(layout: Layout, backup: bool = False, cow: bool = False) -> ArenaLayout:
    """The arena of a batch; with `backup`, the write-back's host copy too; with `cow`, the slots a
    deferred Mamba copy-on-write copies the loaded state into."""
    s = layout.shape
    reqs = layout.requests
    n_m, b = len(s.mamba_layers), len(reqs)

    def kv(seg: str, pool: str) -> Segment:
        units = tuple(Unit(seg, READ, lid, pool, slot, r.index)
                      for lid in s.attention_layers for r in reqs for slot in r.prefix)
        return Segment(seg, (len(s.attention_layers), layout.total_prefix, s.kv_heads, s.head_dim), units)

    def state(seg: str, pool: str, kind: str, width: int) -> Segment:
        units = tuple(Unit(seg, kind, lid, pool, r.mamba_slot, r.index) for lid in s.mamba_layers for r in reqs)
        return Segment(seg, (n_m, b, s.d_inner, width), units)

    def new_kv(seg: str, pool: str) -> Segment:
        units = tuple(Unit(seg, BACKUP, lid, pool, slot, r.index)
                      for lid in s.attention_layers for r in reqs for slot in r.new)
        return Segment(seg, (len(s.attention_layers), layout.total_new, s.kv_heads, s.head_dim), units)

    def index() -> tuple[Segment, ...]:
        if not s.indexer:
            return ()
        units = tuple(Unit("idx", READ, lid, Pool.IDX, slot, r.index)
                      for lid in s.attention_layers for r in reqs for slot in s.index_rows(r.prefix))
        return (Segment("idx", (len(s.attention_layers), layout.total_prefix // s.indexer, 1, s.head_dim), units),)

    out = Segment("out", (layout.total_new, s.hidden),
                  tuple(Unit("out", OUTPUT, -1, "out", tok, r.index) for r in reqs for tok in r.tokens))
    segments: tuple[Segment, ...] = (
        kv("k", Pool.K),
        kv("v", Pool.V),
        *index(),
        state("conv", Pool.CONV, READ, s.conv - 1),
        state("ssm", Pool.SSM, READ, s.state),
        state("final_conv", Pool.CONV, FINAL, s.conv - 1),
        state("final_ssm", Pool.SSM, FINAL, s.state),
        out,
    )
    if backup:
        segments += (
            new_kv(backup_segment(Pool.K), Pool.K),
            new_kv(backup_segment(Pool.V), Pool.V),
            state(backup_segment(Pool.CONV), Pool.CONV, BACKUP, s.conv - 1),
            state(backup_segment(Pool.SSM), Pool.SSM, BACKUP, s.state),
        )
    if cow:
        segments += (
            state(cow_segment(Pool.CONV), Pool.CONV, READ, s.conv - 1),
            state(cow_segment(Pool.SSM), Pool.SSM, READ, s.state),
        )
    return ArenaLayout(segments)


def cow_segment(pool: str) -> str:
    """The arena segment of a deferred copy-on-write's copy of `pool`."""
    return f"cow_{pool}"


def backup_segment(pool: str) -> str:
    """The arena segment of the host copy of `pool`."""
    return f"backup_{pool}"
