"""One verdict per scenario, with its evidence, decided here and nowhere else.

Every front end reads it: run, repro, mutants, fences, bench, soak, the pytest
plugin, and (from results.json) compare and the reports.

- A race is observed when any evidence shows one: stale data in some replay (a
  read, the post-prefill state or the output differs from ground truth), an
  unordered copy/access pair found by the happens-before analyser, or a node of a
  captured graph that nothing orders after a load (the graph check).
- A scenario that expects a race is met by any evidence, unless it demands one
  kind (`evidence = "data"`: a scenario meant to show the data going wrong).
- A scenario that expects clean is met only with no stale data and no findings.
- A scenario that ended in an error meets nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.records.scenario import Evidence, Expect, Scenario


@dataclass(frozen=True)
class Verdict:
    expect: Expect
    observed: Expect | None  # None: the scenario ended in an error
    evidence: tuple[Evidence, ...]  # what showed a race, in Evidence order (empty: none did)
    demanded: Evidence | None = None  # the evidence an expected race must show (None: any)
    error: str | None = None

    @property
    def met(self) -> bool:
        if self.error is not None or self.observed is not self.expect:
            return False
        return self.demanded is None or self.demanded in self.evidence

    def describe(self) -> str:
        """The verdict in a few words: 'race (data, analysis)', 'clean', 'error'."""
        if self.error is not None:
            return "error"
        if self.observed is Expect.RACE:
            return f"race ({', '.join(e.value for e in self.evidence)})"
        return "clean"

    def shortfall(self) -> str | None:
        """Why an expectation was not met, in one phrase; None when it was."""
        if self.met:
            return None
        if self.error is not None:
            return f"error: {self.error}"
        if self.expect is Expect.CLEAN:
            return f"a race showed in {_listed([e.value for e in self.evidence])}"
        if self.observed is Expect.CLEAN:
            return "no evidence of a race"
        assert self.demanded is not None
        return f"the race showed in {', '.join(e.value for e in self.evidence)}, not in {self.demanded.value}"


def _listed(words: list[str]) -> str:
    """"data", "data and analysis", "data, analysis and graph"."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def decide(scenario: Scenario, stale_replays: int, findings: int, error: str | None = None,
           graph_findings: int = 0) -> Verdict:
    if error is not None:
        return Verdict(scenario.expect, None, (), scenario.evidence, error)
    seen = {Evidence.DATA: stale_replays > 0, Evidence.ANALYSIS: findings > 0, Evidence.GRAPH: graph_findings > 0}
    evidence = tuple(e for e in Evidence if seen[e])
    observed = Expect.RACE if evidence else Expect.CLEAN
    return Verdict(scenario.expect, observed, evidence, scenario.evidence)
