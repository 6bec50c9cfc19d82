"""A tensor-parallel scenario's ranks, each on its own and across them (pure).

Each rank compares its own replays with its own ground truth (`harness.run.oracle`): what it read
from its own pools (its heads' KV), and its output, which the all-reduce after each block makes
every rank's. So a stale read on one rank shows twice: in that rank's reads, and in the output of
every rank the collective carried it to. `cross_rank` puts the ranks' replays side by side, replay
by replay, and says which rank read stale data and where it went.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from harness.records.scenario import ModelShape

TP_SIZES = (1, 2, 4, 8)  # what a scenario's `tp` may be


def split_problem(shape: ModelShape, tp: int) -> str | None:
    """Why `shape` cannot be split over `tp` ranks, or None."""
    if tp == 1:
        return None
    if shape.mamba_layers:
        return "tensor parallelism splits attention heads and MLP columns; Mamba layers are not split (use A layers)"
    if shape.indexer:
        return "the sparse-attention index (indexer) is not split across ranks (leave indexer out)"
    shares = (("heads", shape.heads), ("kv_heads", shape.kv_heads), ("2 * hidden (the MLP width)", 2 * shape.hidden))
    for what, n in shares:
        if n % tp:
            return f"{what} ({n}) must be a multiple of tp ({tp}): each rank holds an equal share"
    return None


@dataclass(frozen=True)
class RankReplay:
    """One replay on one rank, as the cross-rank verdict needs it."""

    stale_reads: bool  # this rank's own reads were stale
    output_differs: bool  # this rank's output differs from its ground truth
    stale: bool  # anything of it differs (reads, state, output)


@dataclass
class RankTally:
    """One rank's replays, findings and end."""

    rank: int
    fault: str = "none"  # the fault this rank ran (in words)
    fence: str = "none"  # the fence this rank ran
    replays: int = 0
    stale_replays: int = 0  # anything differed
    stale_read_replays: int = 0  # its own reads were stale
    output_replays: int = 0  # its output differed
    carried_replays: int = 0  # its output differed, its reads were right, and another rank read stale
    findings: int = 0  # the happens-before analysis of its traced replay
    graph_findings: int = 0  # the graph check of its graphs
    graph_nodes: int = 0  # nodes of its captured graphs
    collective_nodes: int = 0  # of which all-reduces
    error: str | None = None
    state: str = "finished"  # how it ended: finished, failed, stopped, died
    stack: str | None = None  # its traceback (failed) or its stack when it was stopped


@dataclass
class CrossRank:
    """The ranks side by side: who read stale data, and whom the collective carried it to."""

    tp: int
    ranks: list[RankTally] = field(default_factory=list)
    stale_on: tuple[int, ...] = ()  # ranks that read stale data in some replay
    carried_to: tuple[int, ...] = ()  # ranks whose output differed in a replay in which some rank read stale

    @property
    def carried(self) -> bool:
        """Did the collective carry a stale read to a rank that read nothing stale itself?"""
        return bool(set(self.carried_to) - set(self.stale_on))

    def describe(self) -> str:
        """One line: "stale reads on rank 1; carried to ranks 0,1 through the all-reduce"."""
        failed = [t for t in self.ranks if t.state != "finished"]
        if failed:
            return "; ".join(f"rank {t.rank} {t.state}" for t in self.ranks)
        if not self.stale_on:
            differ = [t.rank for t in self.ranks if t.output_replays]
            if differ:
                return f"outputs differ on {_ranks(differ)} with no stale read on any rank"
            return "no stale reads on any rank"
        head = f"stale reads on {_ranks(self.stale_on)}"
        if self.carried:
            return f"{head}; carried to {_ranks(self.carried_to)} through the all-reduce"
        return f"{head}; not carried to the other ranks"


def _ranks(ranks: Sequence[int]) -> str:
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {','.join(map(str, ranks))}"


def cross_rank(tallies: list[RankTally], replays: Sequence[Sequence[RankReplay]]) -> CrossRank:
    """`replays[r]`: rank r's replays in order (every rank runs the same replays). Fills each
    tally's replay counts and the cross-rank verdict."""
    stale_on: set[int] = set()
    carried_to: set[int] = set()
    for t, mine in zip(tallies, replays, strict=True):
        t.replays = len(mine)
        t.stale_replays = sum(r.stale for r in mine)
        t.stale_read_replays = sum(r.stale_reads for r in mine)
        t.output_replays = sum(r.output_differs for r in mine)
        t.carried_replays = 0
    for i in range(min((len(r) for r in replays), default=0)):
        row = [r[i] for r in replays]
        stale = {rank for rank, r in enumerate(row) if r.stale_reads}
        if not stale:
            continue
        stale_on |= stale
        for rank, r in enumerate(row):
            if r.output_differs:
                carried_to.add(rank)
                if not r.stale_reads:
                    tallies[rank].carried_replays += 1
    return CrossRank(len(tallies), tallies, tuple(sorted(stale_on)), tuple(sorted(carried_to)))
