"""Compare what a replay read and produced against eager ground truth.

Everything the forward read from the pools (per-layer probes), the post-prefill
Mamba state and the output sit in one flat arena whose rows are *units*
(`harness.model.arena`). Comparing runs on the device: an elementwise test, an
`index_add_` into per-unit counts, and one more into per-*group* counts (a group is
the units of one kind, layer and pool). The replay loop keeps both for a batch of
replays and reads them with one host synchronisation; a verdict is built from its
replay's few group counts, and the unit mask is localised to slots only when asked
(`ReplayVerdict.slots`): the Python that walked every stale unit of every replay
was most of a checked replay's host time at serving shapes.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, field

import torch

from harness.model.arena import FINAL, OUTPUT, READ, ArenaLayout, Unit
from harness.records.scenario import Tolerance

Group = tuple[str, int, str]  # (kind, layer, pool)


@dataclass(frozen=True)
class ReplayVerdict:
    """One replay against ground truth."""

    stale_units: int
    read_units: int
    stale_reads: int = 0  # loaded slots whose read was stale
    layers: frozenset[int] = frozenset()  # layers whose reads were stale
    pools: frozenset[str] = frozenset()  # pools whose reads were stale
    final_state_layers: frozenset[int] = frozenset()  # post-prefill Mamba state differs
    output_differs: bool = False
    # The replay's unit mask (CPU) and the units it runs over: `slots` reads them on demand.
    mask: torch.Tensor | None = field(default=None, repr=False, compare=False)
    units: list[Unit] | None = field(default=None, repr=False, compare=False)

    @property
    def stale(self) -> bool:
        return self.stale_units > 0

    @property
    def read_fraction(self) -> float:
        """Fraction of loaded slots whose read was stale."""
        return self.stale_reads / self.read_units if self.read_units else 0.0

    @functools.cached_property
    def slots(self) -> frozenset[tuple[int, str, int]]:
        """(layer, pool, slot) of every loaded slot read stale."""
        if not self.stale_reads or self.mask is None or self.units is None:
            return frozenset()
        units = self.units
        return frozenset((u.layer, u.pool, u.slot) for i in self.mask.nonzero().flatten().tolist()
                         if (u := units[i]).kind == READ)


class Oracle:
    """Holds ground truth and the unit map; turns an arena into counts, and counts into a verdict."""

    def __init__(self, arena: ArenaLayout, truth: torch.Tensor, tolerance: Tolerance = Tolerance()):
        if torch.isnan(truth.float()).any():
            raise ValueError("ground truth holds NaN: the eager reference itself read poison")
        if arena.size != truth.numel():
            raise ValueError("arena layout and ground truth disagree")
        self.units = arena.units
        device = truth.device
        self.truth = truth
        self.tolerance = tolerance
        # Per segment, not per unit: a serving shape has hundreds of thousands of units.
        sizes = torch.tensor([seg.unit_size for seg in arena.segments], dtype=torch.long)
        counts = torch.tensor([len(seg.units) for seg in arena.segments], dtype=torch.long)
        unit_sizes = torch.repeat_interleave(sizes, counts).to(device)
        self._unit_of_elem = torch.repeat_interleave(torch.arange(len(self.units), device=device), unit_sizes)
        # Probes are copies of pool memory: always exact. Tolerance covers computed values.
        computed = torch.tensor([seg.units[0].kind != READ if seg.units else False for seg in arena.segments])
        self._tolerant = torch.repeat_interleave(torch.repeat_interleave(computed, counts).to(device), unit_sizes)
        index: dict[Group, int] = {}
        of_unit = [index.setdefault((u.kind, u.layer, u.pool), len(index)) for u in self.units]
        self.groups: list[Group] = list(index)
        self._group_of_unit = torch.tensor(of_unit, dtype=torch.long).to(device)
        self.read_units = sum(u.kind == READ for u in self.units)

    def stale_mask(self, arena: torch.Tensor) -> torch.Tensor:
        """Device-side: which units differ from ground truth (NaN always differs)."""
        diff = arena != self.truth
        if not self.tolerance.exact:
            loose = ~torch.isclose(
                arena.float(), self.truth.float(), rtol=self.tolerance.rtol, atol=self.tolerance.atol
            )
            diff = torch.where(self._tolerant, loose, diff)
        counts = torch.zeros(len(self.units), device=arena.device, dtype=torch.int32)
        counts.index_add_(0, self._unit_of_elem, diff.int())
        return counts > 0

    def group_counts(self, mask: torch.Tensor) -> torch.Tensor:
        """Device-side: stale units per group, from a unit mask."""
        out = torch.zeros(len(self.groups), device=mask.device, dtype=torch.int32)
        return out.index_add_(0, self._group_of_unit, mask.int())

    def compare(self, arena: torch.Tensor, mask_out: torch.Tensor, counts_out: torch.Tensor) -> None:
        """Device-side: the unit mask and the group counts of `arena`, into the two rows given."""
        mask = self.stale_mask(arena)
        mask_out.copy_(mask)
        counts_out.copy_(self.group_counts(mask))

    def verdict(self, counts: torch.Tensor, mask: torch.Tensor | None = None) -> ReplayVerdict:
        """Host-side: a verdict from one replay's group counts (CPU), its unit mask kept for `slots`."""
        stale = [(g, n) for g, n in zip(self.groups, counts.tolist(), strict=True) if n]
        if not stale:
            return ReplayVerdict(0, self.read_units)
        reads = [(layer, pool, n) for (kind, layer, pool), n in stale if kind == READ]
        return ReplayVerdict(
            stale_units=sum(n for _, n in stale),
            read_units=self.read_units,
            stale_reads=sum(n for _, _, n in reads),
            layers=frozenset(layer for layer, _, _ in reads),
            pools=frozenset(pool for _, pool, _ in reads),
            final_state_layers=frozenset(layer for (kind, layer, _), _ in stale if kind == FINAL),
            output_differs=any(kind == OUTPUT for (kind, _, _), _ in stale),
            mask=mask,
            units=self.units,
        )

    def judge(self, arena: torch.Tensor) -> ReplayVerdict:
        """Compare and localise at once (tests, one-off checks): the verdict of `arena`."""
        mask = self.stale_mask(arena)
        return self.verdict(self.group_counts(mask).cpu(), mask.cpu())


@dataclass
class Tally:
    """Replay verdicts summed over a scenario."""

    replays: int = 0
    stale_replays: int = 0
    layer_counts: Counter = field(default_factory=Counter)
    pool_counts: Counter = field(default_factory=Counter)
    final_state_replays: int = 0
    output_only_replays: int = 0  # output differs but every read was right: nondeterminism
    read_fraction_sum: float = 0.0

    def add(self, v: ReplayVerdict) -> None:
        self.replays += 1
        if not v.stale:
            return
        self.stale_replays += 1
        self.layer_counts.update(v.layers)
        self.pool_counts.update(v.pools)
        self.final_state_replays += bool(v.final_state_layers)
        self.output_only_replays += bool(v.output_differs and not v.stale_reads and not v.final_state_layers)
        self.read_fraction_sum += v.read_fraction

    @property
    def stale_rate(self) -> float:
        return self.stale_replays / self.replays if self.replays else 0.0

    @property
    def mean_read_fraction(self) -> float:
        """Mean fraction of loaded slots read stale, over stale replays."""
        return self.read_fraction_sum / self.stale_replays if self.stale_replays else 0.0
