"""Compare what a replay read and produced against eager ground truth.

Everything the forward read from the pools (per-layer probes), the post-prefill
Mamba state and the output sit in one flat arena whose rows are *units*
(`harness.model.arena`). Comparing runs on the device: each segment, viewed as
[units, unit size], is tested elementwise and reduced per row into a unit mask, and a
prefix sum of the mask gives per-*group* counts (a group is a run of units of one kind,
layer and pool). The replay loop keeps both for a batch of
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

from harness.model.arena import BACKUP, FINAL, OUTPUT, READ, ArenaLayout, Unit
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
    backup_layers: frozenset[int] = frozenset()  # layers whose write-back host copy differs
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


def _word(t: torch.Tensor, row: int) -> torch.dtype:
    """The widest integer type a row of `row` elements of `t` (and its start) divides into."""
    nbytes, offset = row * t.element_size(), t.storage_offset() * t.element_size()
    for word in (torch.int64, torch.int32, torch.int16, torch.uint8):
        if nbytes % word.itemsize == 0 and offset % word.itemsize == 0:
            return word
    return torch.uint8


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
        # Units are rows of equal size within a segment: compare a segment as a [units, size]
        # view and reduce each row (no atomics; a serving shape has hundreds of thousands).
        # A probe is a copy of pool memory, so fresh is bit for bit: its rows are compared as
        # bits, in the widest words a row divides into; computed values (final state, output)
        # by value, under the tolerance. Word None: compare by value.
        self._segments: list[tuple[slice, slice, torch.dtype | None, int]] = []  # elements, units, word, row
        at = u = 0
        for seg in arena.segments:
            n = len(seg.units)
            if n:
                elems = slice(at, at + seg.size)
                if seg.units[0].kind == READ:
                    word = _word(truth[elems], seg.unit_size)
                    row = seg.unit_size * truth.element_size() // word.itemsize
                    self._segments.append((elems, slice(u, u + n), word, row))
                else:
                    self._segments.append((elems, slice(u, u + n), None, seg.unit_size))
            at, u = at + seg.size, u + n
        # Groups: maximal runs of units of one (kind, layer, pool), counted from a prefix sum.
        self.groups: list[Group] = []
        starts: list[int] = []
        for i, unit in enumerate(self.units):
            key = (unit.kind, unit.layer, unit.pool)
            if not self.groups or self.groups[-1] != key:
                self.groups.append(key)
                starts.append(i)
        self._starts = torch.tensor(starts, dtype=torch.long, device=device)
        self._ends = torch.tensor([*starts[1:], len(self.units)], dtype=torch.long, device=device)
        self._running = torch.zeros(len(self.units) + 1, dtype=torch.int32, device=device)  # [0] stays 0
        self.read_units = sum(u.kind == READ for u in self.units)

    def _mask_into(self, arena: torch.Tensor, mask: torch.Tensor) -> None:
        """Device-side: which units of `arena` differ from ground truth (NaN always differs)."""
        tol = self.tolerance
        for elems, units, word, row in self._segments:
            got, want = arena[elems], self.truth[elems]
            if word is not None:
                differs = got.view(word) != want.view(word)
            elif tol.exact:
                differs = got != want
            else:
                differs = ~torch.isclose(got.float(), want.float(), rtol=tol.rtol, atol=tol.atol)
            torch.any(differs.view(-1, row), dim=1, out=mask[units])

    def _counts_into(self, mask: torch.Tensor, out: torch.Tensor) -> None:
        """Device-side: stale units per group, from a unit mask."""
        running = self._running
        torch.cumsum(mask, 0, dtype=torch.int32, out=running[1:])
        torch.sub(running[self._ends], running[self._starts], out=out)

    def compare(self, arena: torch.Tensor, mask_out: torch.Tensor, counts_out: torch.Tensor) -> None:
        """Device-side: the unit mask and the group counts of `arena`, into the two rows given."""
        self._mask_into(arena, mask_out)
        self._counts_into(mask_out, counts_out)

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
            backup_layers=frozenset(layer for (kind, layer, _), _ in stale if kind == BACKUP),
            mask=mask,
            units=self.units,
        )

    def judge(self, arena: torch.Tensor) -> ReplayVerdict:
        """Compare and localise at once (tests, one-off checks): the verdict of `arena`."""
        mask = torch.empty(len(self.units), dtype=torch.bool, device=arena.device)
        counts = torch.empty(len(self.groups), dtype=torch.int32, device=arena.device)
        self.compare(arena, mask, counts)
        return self.verdict(counts.cpu(), mask.cpu())


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
        self.output_only_replays += bool(v.output_differs and not v.stale_reads and not v.final_state_layers)
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
