"""Compare what a replay read and produced against eager ground truth.

Everything the forward read from the pools (per-layer probes), the post-prefill
Mamba state and the output sit in one flat arena whose rows are *units*
(`harness.model.arena`). Comparing is two kernels (an elementwise test and an
`index_add_` into per-unit counts); one small host copy then says which units
differ. Localisation is pure host logic on that mask.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch

from harness.model.arena import BACKUP, FINAL, OUTPUT, READ, ArenaLayout
from harness.records.scenario import Tolerance


@dataclass(frozen=True)
class ReplayVerdict:
    """One replay against ground truth."""

    stale_units: int
    read_units: int
    layers: frozenset[int] = frozenset()  # layers whose reads were stale
    pools: frozenset[str] = frozenset()  # pools whose reads were stale
    slots: frozenset[tuple[int, str, int]] = frozenset()  # (layer, pool, slot) read stale
    final_state_layers: frozenset[int] = frozenset()  # post-prefill Mamba state differs
    output_differs: bool = False
    backup_layers: frozenset[int] = frozenset()  # layers whose write-back host copy differs

    @property
    def stale(self) -> bool:
        return self.stale_units > 0

    @property
    def read_fraction(self) -> float:
        """Fraction of loaded slots whose read was stale."""
        return len(self.slots) / self.read_units if self.read_units else 0.0


class Oracle:
    """Holds ground truth and the unit map; turns an arena into a verdict."""

    def __init__(self, arena: ArenaLayout, truth: torch.Tensor, tolerance: Tolerance = Tolerance()):
        if torch.isnan(truth.float()).any():
            raise ValueError("ground truth holds NaN: the eager reference itself read poison")
        if arena.size != truth.numel():
            raise ValueError("arena layout and ground truth disagree")
        self.units = arena.units
        device = truth.device
        self.truth = truth
        self.tolerance = tolerance
        sizes = torch.tensor([seg.unit_size for seg in arena.segments for _ in seg.units], dtype=torch.long)
        self._unit_of_elem = torch.repeat_interleave(torch.arange(len(self.units)), sizes).to(device)
        # Probes are copies of pool memory: always exact. Tolerance covers computed values.
        computed = torch.tensor([u.kind != READ for u in self.units])
        self._tolerant = torch.repeat_interleave(computed, sizes).to(device)
        self.read_units = sum(u.kind == READ for u in self.units)

    def stale_mask(self, arena: torch.Tensor) -> torch.Tensor:
        """Device-side: which units differ from ground truth (NaN always differs)."""
        diff = arena != self.truth
        if not self.tolerance.exact:
            loose = ~torch.isclose(
                arena.float(), self.truth.float(), rtol=self.tolerance.rtol, atol=self.tolerance.atol
            )
            diff = torch.where(self._tolerant, loose, diff)
        counts = torch.zeros(len(self.units), device=arena.device, dtype=torch.float32)
        counts.index_add_(0, self._unit_of_elem, diff.float())
        return counts > 0

    def verdict(self, mask: torch.Tensor) -> ReplayVerdict:
        """Host-side: localise a unit mask (a CPU bool tensor)."""
        stale = mask.nonzero().flatten().tolist()
        if not stale:
            return ReplayVerdict(0, self.read_units)
        units = [self.units[i] for i in stale]
        reads = [u for u in units if u.kind == READ]
        return ReplayVerdict(
            stale_units=len(units),
            read_units=self.read_units,
            layers=frozenset(u.layer for u in reads),
            pools=frozenset(u.pool for u in reads),
            slots=frozenset((u.layer, u.pool, u.slot) for u in reads),
            final_state_layers=frozenset(u.layer for u in units if u.kind == FINAL),
            output_differs=any(u.kind == OUTPUT for u in units),
            backup_layers=frozenset(u.layer for u in units if u.kind == BACKUP),
        )


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
    backup_replays: int = 0  # the write-back's host copy differs
    backup_layer_counts: Counter = field(default_factory=Counter)

    def add(self, v: ReplayVerdict) -> None:
        self.replays += 1
        if not v.stale:
            return
        self.stale_replays += 1
        self.layer_counts.update(v.layers)
        self.pool_counts.update(v.pools)
        self.final_state_replays += bool(v.final_state_layers)
        self.output_only_replays += bool(v.output_differs and not v.slots and not v.final_state_layers)
        self.read_fraction_sum += v.read_fraction
        self.backup_replays += bool(v.backup_layers)
        self.backup_layer_counts.update(v.backup_layers)

    @property
    def stale_rate(self) -> float:
        return self.stale_replays / self.replays if self.replays else 0.0

    @property
    def mean_read_fraction(self) -> float:
        """Mean fraction of loaded slots read stale, over stale replays."""
        return self.read_fraction_sum / self.stale_replays if self.stale_replays else 0.0
