"""Compare what a replay read and produced against eager ground truth.

Everything the forward read from the pools (per-layer probes), the post-prefill
Mamba state and the output sit in one flat arena whose rows are *units*
(`harness.model.arena`). Comparing runs on the device: each segment, viewed as
[units, unit size], is tested elementwise and reduced per row into the replay's unit
mask (a bool a unit); that is all a replay's look does. Once per batch, the masks of
every replay in it are reduced into per-*group* counts (a group is a run of units of
one kind, layer and pool) and packed into bits, and the host reads both with one
synchronisation; a verdict is built from its replay's few group counts, and its bits
are localised to slots only when asked (`ReplayVerdict.slots`): the Python that walked
every stale unit of every replay was most of a checked replay's host time at serving
shapes, and a batch's masks as bools were most of the device's idle time between batches.
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


@dataclass(frozen=True)
class _Reduce:
    """Units reduced in one kernel: their words in their run's elementwise result, their slice of the
    unit mask, and their row width (in words)."""

    words: slice
    units: slice
    row: int


@dataclass
class _Run:
    """Neighbouring arena segments compared alike: the elements they span, the word their bits are
    compared in (None: by value), and the reductions of its elementwise result into the unit mask
    (neighbouring segments of one row width are one reduction: k and v at every shape)."""

    elems: slice
    word: torch.dtype | None
    reduces: list[_Reduce]
    width: int = 0  # words in the run's elementwise result


@dataclass(frozen=True)
class _Piece:
    """Neighbouring groups of one size, counted in one reduction over a batch of unit masks: their
    units (contiguous in the mask), their groups, and each group's size."""

    units: slice
    groups: slice
    size: int


@dataclass(frozen=True)
class Pass:
    """One kernel of the harness's own device work and the bytes it moves (from its tensors' sizes)."""

    what: str
    read: int
    written: int

    @property
    def bytes(self) -> int:
        return self.read + self.written


def _not_close(got: torch.Tensor, want: torch.Tensor, rtol: float, atol: float,
               out: torch.Tensor | None = None) -> torch.Tensor:
    differs = ~torch.isclose(got.float(), want.float(), rtol=rtol, atol=atol)
    return differs if out is None else out.copy_(differs)


def _not_within(got: torch.Tensor, want_f: torch.Tensor, bound: torch.Tensor,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """`~isclose(got, want)` for a finite `want` (in fp32) and `bound = atol + rtol * |want|`, in four
    kernels: |got - want| <= bound is False for NaN and for an infinite `got`, as isclose is."""
    d = torch.sub(got, want_f)  # promoted to fp32 in the kernel
    d.abs_()
    close = torch.le(d, bound) if out is None else torch.le(d, bound, out=out)
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
    # The replay's unit mask as bits (CPU, `pack_bits`) and the units it runs over: `slots` reads
    # them on demand.
    bits: torch.Tensor | None = field(default=None, repr=False, compare=False)
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
        if not self.stale_reads or self.bits is None or self.units is None:
            return frozenset()
        units = self.units
        mask = unpack_bits(self.bits, len(units))
        return frozenset((u.layer, u.pool, u.slot) for i in mask.nonzero().flatten().tolist()
                         if (u := units[i]).kind == READ)


def _word(t: torch.Tensor, row: int) -> torch.dtype:
    """The widest integer type a row of `row` elements of `t` (and its start) divides into."""
    nbytes, offset = row * t.element_size(), t.storage_offset() * t.element_size()
    for word in (torch.int64, torch.int32, torch.int16, torch.uint8):
        if nbytes % word.itemsize == 0 and offset % word.itemsize == 0:
            return word
    return torch.uint8


MASK_ALIGN = 8  # a unit mask row is padded to whole bytes of bits (`pack_bits`)


def mask_width(units: int) -> int:
    """A unit mask row's length: every unit, padded to a multiple of 8 (at least 8)."""
    return max(MASK_ALIGN, -(-units // MASK_ALIGN) * MASK_ALIGN)


_SHIFTS: dict[torch.device, torch.Tensor] = {}


def pack_bits(masks: torch.Tensor, out: torch.Tensor) -> None:
    """Device-side: rows of a bool mask (length a multiple of 8) into bytes of bits, unit i of a row
    at bit i % 8 of byte i // 8: what crosses to the host is an eighth of the mask. Two kernels."""
    rows, width = masks.shape
    shifts = _SHIFTS.get(masks.device)
    if shifts is None:
        shifts = _SHIFTS[masks.device] = torch.arange(MASK_ALIGN, dtype=torch.uint8, device=masks.device)
    bits = torch.bitwise_left_shift(masks.view(torch.uint8).view(rows, width // MASK_ALIGN, MASK_ALIGN), shifts)
    torch.sum(bits, dim=2, dtype=torch.uint8, out=out)  # distinct bits: the sum is their OR


def unpack_bits(bits: torch.Tensor, units: int) -> torch.Tensor:
    """Host-side: a row of `pack_bits` back into its first `units` entries (bool)."""
    shifts = torch.arange(MASK_ALIGN, dtype=torch.uint8)
    return ((bits[:, None] >> shifts) & 1).flatten()[:units].bool()


class Oracle:
    """Holds ground truth and the unit map; turns an arena into a unit mask, unit masks into group
    counts, and counts into a verdict.

    Per replay (`comparer`): one elementwise kernel per run of segments compared alike, then one row
    reduction per run of units of one row width, into the replay's unit mask. Per batch (`counter`):
    each group's count, one reduction per run of groups of one size over every replay's mask at once,
    and the masks packed into bits for the host. `look_passes` and `batch_passes` list those kernels
    and the bytes each moves; the comparer runs exactly them.
    """

    def __init__(self, arena: ArenaLayout, truth: torch.Tensor, tolerance: Tolerance = Tolerance()):
        if torch.isnan(truth.float()).any():
            raise ValueError("ground truth holds NaN: the eager reference itself read poison")
        if arena.size != truth.numel():
            raise ValueError("arena layout and ground truth disagree")
        self.units = arena.units
        self.truth = truth
        self.tolerance = tolerance
        # Units are rows of equal size within a segment: compare a segment as a [units, size]
        # view and reduce each row (no atomics; a serving shape has hundreds of thousands).
        # A probe is a copy of pool memory, so fresh is bit for bit: its rows are compared as
        # bits, in the widest words a row divides into (int64: a bool a word, an eighth of the
        # bytes compared); computed values (final state, output) by value, under the tolerance.
        # Neighbouring segments compared the same way (probes in one word size; the values) are
        # one *run*: one elementwise kernel over the run, then one row reduction per stretch of
        # one row width (k and v together), so a look is a few kernels whatever the segments.
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
                width = n * row
                last = run.reduces[-1] if run.reduces else None
                if last is not None and last.row == row and last.units.stop == u:
                    run.reduces[-1] = _Reduce(slice(last.words.start, run.width + width),
                                              slice(last.units.start, u + n), row)
                else:
                    run.reduces.append(_Reduce(slice(run.width, run.width + width), slice(u, u + n), row))
                run.width += width
                run.elems = slice(run.elems.start, at + seg.size)
            at, u = at + seg.size, u + n
        # Groups: maximal runs of units of one (kind, layer, pool); every group a contiguous stretch
        # of the unit mask. Neighbouring groups of one size are one piece: counted in one reduction.
        self.groups: list[Group] = []
        sizes: list[int] = []
        for unit in self.units:
            key = (unit.kind, unit.layer, unit.pool)
            if not self.groups or self.groups[-1] != key:
                self.groups.append(key)
                sizes.append(0)
            sizes[-1] += 1
        self._pieces: list[_Piece] = []
        u = 0
        for g, size in enumerate(sizes):
            last_piece = self._pieces[-1] if self._pieces else None
            if last_piece is not None and last_piece.size == size:
                self._pieces[-1] = _Piece(slice(last_piece.units.start, u + size),
                                          slice(last_piece.groups.start, g + 1), size)
            else:
                self._pieces.append(_Piece(slice(u, u + size), slice(g, g + 1), size))
            u += size
        self.read_units = sum(u.kind == READ for u in self.units)
        self.mask_width = mask_width(len(self.units))

    # ---- per replay: the unit mask ------------------------------------------------------------
    def comparer(self, arena: torch.Tensor, mask_out: torch.Tensor) -> Callable[[], None]:
        """Device-side work that compares `arena` into the unit mask given (its first units), its
        views and buffers made once: under the default (exact) tolerance it allocates nothing (the
        replay loop's look runs it every replay, or captures it into a graph)."""
        tol = self.tolerance
        steps: list[Callable[[], object]] = []
        reduces: list[tuple[torch.Tensor, torch.Tensor]] = []
        for run in self._runs:
            got, want = arena[run.elems], self.truth[run.elems]
            differs = torch.empty(run.width, dtype=torch.bool, device=arena.device)
            if run.word is not None:
                got, want = got.view(run.word), want.view(run.word)
                steps.append(functools.partial(torch.ne, got, want, out=differs))
            elif tol.exact:
                steps.append(functools.partial(torch.ne, got, want, out=differs))  # NaN always differs
            elif bool(torch.isfinite(want).all()):
                # isclose against a finite truth, with what depends on the truth alone computed once.
                want_f = want.float()
                bound = tol.atol + tol.rtol * want_f.abs()
                steps.append(functools.partial(_not_within, got, want_f, bound, out=differs))
            else:
                steps.append(functools.partial(_not_close, got, want, tol.rtol, tol.atol, out=differs))
            for r in run.reduces:
                # The flags read in the widest words a row of them divides into (eight a word at every
                # checking shape): a word is nonzero when any of its flags is set, so a unit's row
                # reduces to the same answer over an eighth of the elements. (On a GPU `any` reads
                # them as they are; on the CPU torch casts them to bool first.)
                flags = differs[r.words]
                word = _word(flags, r.row)
                reduces.append((flags.view(word).view(-1, r.row // word.itemsize), mask_out[r.units]))

        def compare() -> None:
            for step in steps:
                step()
            for differs, out in reduces:
                torch.any(differs, dim=1, out=out)

        return compare

    # ---- per batch: the group counts and the bits -----------------------------------------------
    def counts_size(self, rows: int) -> int:
        """Elements of the flat count buffer `counter` fills for `rows` masks."""
        return rows * len(self.groups)

    def counter(self, masks: torch.Tensor, counts_out: torch.Tensor, bits_out: torch.Tensor
                ) -> Callable[[int], None]:
        """Device-side work over the first `rows` rows of a batch of unit masks ([batch, mask_width]):
        each group's count (into `counts_out`, flat int64 of `counts_size(batch)`: per piece, a
        [batch, groups] block) and the masks packed into bits (`bits_out`, [batch, mask_width / 8])."""
        blocks = self._blocks(counts_out, masks.shape[0])

        def count(rows: int) -> None:
            for p, block in blocks:
                part = masks[:rows, p.units].view(rows, -1, p.size)
                torch.sum(part, dim=2, out=block[:rows])
            pack_bits(masks[:rows], bits_out[:rows])

        return count

    def counts_of(self, flat: torch.Tensor, batch: int, rows: int) -> torch.Tensor:
        """Host-side: the group counts ([rows, groups], in group order) from `counter`'s flat buffer."""
        return torch.cat([block[:rows] for _, block in self._blocks(flat, batch)], dim=1)

    def _blocks(self, flat: torch.Tensor, batch: int) -> list[tuple[_Piece, torch.Tensor]]:
        """The flat count buffer's layout, in one place: per piece, a [batch, its groups] block."""
        blocks, at = [], 0
        for p in self._pieces:
            n = p.groups.stop - p.groups.start
            blocks.append((p, flat[at:at + batch * n].view(batch, n)))
            at += batch * n
        return blocks

    # ---- the kernels and their bytes --------------------------------------------------------
    def look_passes(self) -> list[Pass]:
        """The comparer's kernels, each with the bytes it reads and writes (default tolerance; a
        tolerance runs four elementwise kernels on its values)."""
        size = self.truth.element_size()
        out = []
        for run in self._runs:
            n = run.elems.stop - run.elems.start
            what = "compare bits" if run.word is not None else "compare values"
            out.append(Pass(what, 2 * n * size, run.width))
            for r in run.reduces:
                out.append(Pass("any per unit", r.words.stop - r.words.start, r.units.stop - r.units.start))
        return out

    def batch_passes(self, rows: int) -> list[Pass]:
        """The counter's kernels over `rows` masks, with their bytes."""
        out = []
        for p in self._pieces:
            n, g = rows * (p.units.stop - p.units.start), rows * (p.groups.stop - p.groups.start)
            # torch sums bools into int64 by widening its input first (a copy), then reduces.
            out += [Pass("count: widen", n, 8 * n), Pass("count: sum per group", 8 * n, 8 * g)]
        width = rows * self.mask_width
        out.append(Pass("pack bits: shift", width + MASK_ALIGN, width))
        out.append(Pass("pack bits: or", width, width // MASK_ALIGN))
        return out

    # ---- the verdict -------------------------------------------------------------------------
    def verdict(self, counts: torch.Tensor | list[int], bits: torch.Tensor | None = None) -> ReplayVerdict:
        """Host-side: a verdict from one replay's group counts (CPU), its unit mask's bits (CPU,
        `pack_bits`) kept for `slots`."""
        if isinstance(counts, torch.Tensor):
            counts = counts.tolist()
        stale = [(g, n) for g, n in zip(self.groups, counts, strict=True) if n]
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
            bits=bits,
            units=self.units,
        )

    def judge(self, arena: torch.Tensor) -> ReplayVerdict:
        """Compare, count and localise at once (tests, one-off checks): the verdict of `arena`."""
        device = arena.device
        masks = torch.zeros((1, self.mask_width), dtype=torch.bool, device=device)
        counts = torch.empty(self.counts_size(1), dtype=torch.long, device=device)
        bits = torch.empty((1, self.mask_width // MASK_ALIGN), dtype=torch.uint8, device=device)
        self.comparer(arena, masks[0])()
        self.counter(masks, counts, bits)(1)
        return self.verdict(self.counts_of(counts.cpu(), 1, 1)[0], bits[0].cpu())


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
