"""The mutant kill matrix: each known-bad variant must be caught, each correct one must not.

A scenario that expects a race is a mutant; one that expects clean is a correct
variant. A mutant is killed when its verdict (`harness.run.verdict`) meets the
expectation: a race, shown by stale data in some replay or by an unordered
copy/access pair in the op list (the happens-before analyser), or by the evidence
the scenario demands. The evidence is kept apart, so a report can say which
caught it. A correct variant is flagged on either kind of evidence.

A row also says where the data went wrong (what the forward read, the post-prefill state,
the write-back's host copy) and which race kinds the analyser found, so the matrix shows
each mutant caught as its own hazard (a write-back mutant by its host copy and a
store-before-compute finding, not by some other race it happens to have).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from harness.records.plain import as_plain
from harness.records.scenario import Expect
from harness.run.oracle import Tally
from harness.run.pipeline import ScenarioResult


class Role(str, enum.Enum):
    MUTANT = "mutant"
    CORRECT = "correct"


class Outcome(str, enum.Enum):
    KILLED = "killed"  # a mutant the harness caught
    SURVIVED = "survived"  # a mutant the harness missed: a hole in the harness
    CLEAN = "clean"  # a correct variant with no race reported
    FLAGGED = "flagged"  # a correct variant reported as racy: a false positive
    ERROR = "error"  # the scenario did not run to the end


@dataclass(frozen=True)
class MatrixRow:
    name: str
    role: Role
    variant: str  # what makes it this variant, in words
    outcome: Outcome
    stale_replays: int
    replays: int
    findings: int
    evidence: tuple[str, ...]  # "data", "analysis"
    error: str | None = None
    data_in: tuple[str, ...] = ()  # where the data went wrong: "reads", "final state", "host copy", "output"
    finding_kinds: tuple[str, ...] = ()  # the analyser's race kinds, in the order first found

    @property
    def ok(self) -> bool:
        return self.outcome in (Outcome.KILLED, Outcome.CLEAN)

    @property
    def stale_rate(self) -> float:
        return self.stale_replays / self.replays if self.replays else 0.0


def classify(r: ScenarioResult) -> MatrixRow:
    s = r.scenario
    role = Role.MUTANT if s.expect is Expect.RACE else Role.CORRECT
    verdict = r.verdict if r.verdict is not None else r.seal()
    evidence = tuple(e.value for e in verdict.evidence)
    if verdict.error is not None:
        outcome = Outcome.ERROR
    elif role is Role.MUTANT:
        outcome = Outcome.KILLED if verdict.met else Outcome.SURVIVED
    else:
        outcome = Outcome.CLEAN if verdict.met else Outcome.FLAGGED
    return MatrixRow(
        name=s.name,
        role=role,
        variant=s.describe(),
        outcome=outcome,
        stale_replays=r.tally.stale_replays,
        replays=r.tally.replays,
        findings=len(r.findings),
        evidence=evidence,
        error=r.error,
        data_in=data_in(r.tally),
        finding_kinds=tuple(dict.fromkeys(f.kind.value for f in r.findings)),
    )


def data_in(t: Tally) -> tuple[str, ...]:
    """Where a scenario's stale replays went wrong: what the forward read, the post-prefill
    Mamba state, the write-back's host copy, or only the output (nondeterminism)."""
    seen = {"reads": bool(t.layer_counts), "final state": bool(t.final_state_replays),
            "host copy": bool(t.backup_replays), "output": bool(t.output_only_replays)}
    return tuple(k for k, shown in seen.items() if shown)


def matrix_ok(rows: list[MatrixRow]) -> bool:
    """Every mutant killed and every correct variant clean."""
    return all(row.ok for row in rows)


def matrix_section(rows: list[MatrixRow]) -> dict:
    """The `mutants` section of results.json for these rows, in their order."""

    return {"mutants": {"matrix": [{**as_plain(row), "stale_rate": row.stale_rate} for row in rows]}}
