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
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from harness.model.arena import BACKUP, FINAL, OUTPUT, READ, ArenaLayout, Unit
from harness.records.scenario import Tolerance

Group = tuple[str, int, str]  # (kind, layer, pool)


@dataclass
class _Run:
    """Neighbouring arena segments compared alike: the elements they span, the word their bits are
    compared in (None: by value), and per segment its slice of the run's elementwise result (in
    words), its units and its row width."""

    elems: slice
    word: torch.dtype | None
    rows: list[tuple[slice, slice, int]]

    @property
    def width(self) -> int:
        return self.rows[-1][0].stop if self.rows else 0


def _not_close(got: torch.Tensor, want: torch.Tensor, rtol: float, atol: float) -> torch.Tensor:
    return ~torch.isclose(got.float(), want.float(), rtol=rtol, atol=atol)


def _not_within(got: torch.Tensor, want_f: torch.Tensor, bound: torch.Tensor) -> torch.Tensor:
    """`~isclose(got, want)` for a finite `want` (in fp32) and `bound = atol + rtol * |want|`, in four
    kernels: |got - want| <= bound is False for NaN and for an infinite `got`, as isclose is."""
    d = torch.sub(got, want_f)  # promoted to fp32 in the kernel
    d.abs_()
    close = torch.le(d, bound)
    return close.logical_not_()


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
        # by value, under the tolerance. Neighbouring segments compared the same way (probes in
        # one word size; the values) are one *run*: one elementwise kernel over the run, then one
        # row reduction per segment, so a look is a few kernels whatever the number of segments.
        self._runs: list[_Run] = []
        at = u = 0
        for seg in arena.segments:
            n = len(seg.units)
            if n:
                word: torch.dtype | None
                if seg.units[0].kind == READ:
                    bits = _word(truth[at:at + seg.size], seg.unit_size)
                    word, row = bits, seg.unit_size * truth.element_size() // bits.itemsize
                else:
                    word, row = None, seg.unit_size
                run = self._runs[-1] if self._runs else None
                if run is None or run.word != word or run.elems.stop != at:
                    run = _Run(slice(at, at), word, [])
                    self._runs.append(run)
                width = (seg.size * truth.element_size() // word.itemsize) if word is not None else seg.size
                start = run.width
                run.rows.append((slice(start, start + width), slice(u, u + n), row))
                run.elems = slice(run.elems.start, at + seg.size)
            at, u = at + seg.size, u + n
        # Groups: maximal runs of units of one (kind, layer, pool), counted from a prefix sum.
        self.groups: list[Group] = []
        starts: list[int] = []
        for i, unit in enumerate(self.units):
            key = (unit.kind, unit.layer, unit.pool)
            if not self.groups or self.groups[-1] != key:
                self.groups.append(key)
                starts.append(i)
        # Each group's count is the difference of the unit mask's prefix sum at its bounds.
        self._bounds = torch.tensor([*starts, len(self.units)], dtype=torch.long, device=device)
        self._running = torch.zeros(len(self.units) + 1, dtype=torch.int32, device=device)  # [0] stays 0
        self._at_bounds = torch.zeros(len(starts) + 1, dtype=torch.int32, device=device)
        self.read_units = sum(u.kind == READ for u in self.units)

    def comparer(self, arena: torch.Tensor, mask_out: torch.Tensor, counts_out: torch.Tensor) -> Callable[[], None]:
        """Device-side work that compares `arena` into the two rows given, its views built once
        (the replay loop's look runs it every replay, or captures it into a graph)."""
        tol = self.tolerance
        steps: list[Callable[[], torch.Tensor]] = []
        for run in self._runs:
            got, want = arena[run.elems], self.truth[run.elems]
            if run.word is not None:
                got, want = got.view(run.word), want.view(run.word)
                steps.append(functools.partial(torch.ne, got, want))
            elif tol.exact:
                steps.append(functools.partial(torch.ne, got, want))
            elif bool(torch.isfinite(want).all()):
                # isclose against a finite truth, with what depends on the truth alone computed once.
                want_f = want.float()
                bound = tol.atol + tol.rtol * want_f.abs()
                steps.append(functools.partial(_not_within, got, want_f, bound))
            else:
                steps.append(functools.partial(_not_close, got, want, tol.rtol, tol.atol))
        running, at = self._running, self._at_bounds
        rows = [(i, width, mask_out[units], row) for i, run in enumerate(self._runs)
                for width, units, row in run.rows]

        def compare() -> None:
            differs = [step() for step in steps]  # NaN always differs
            for i, width, out, row in rows:
                torch.any(differs[i][width].view(-1, row), dim=1, out=out)
            torch.cumsum(mask_out, 0, dtype=torch.int32, out=running[1:])
            torch.index_select(running, 0, self._bounds, out=at)
            torch.sub(at[1:], at[:-1], out=counts_out)

        return compare

    def compare(self, arena: torch.Tensor, mask_out: torch.Tensor, counts_out: torch.Tensor) -> None:
        """Device-side: the unit mask and the group counts of `arena`, into the two rows given."""
        self.comparer(arena, mask_out, counts_out)()

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
