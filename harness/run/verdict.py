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
- Wrong is observed when ground truth itself finds slots the landed load op did not restore
  (`NotRestored`): no replay runs, and no ordering could make it right. A scenario that expects
  wrong is met by that alone.
- A scenario that ended in an error meets nothing.

`fence-harness graph-check` asks one question of each scenario, answered here too
(`decide_graph`): does the graph check alone, with no replay, agree with the
expectation? Only where a full-graph replay can show the race (`graph_shows_race`);
a correct variant must have no graph finding whatever its backend.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.checkers.graph import GraphCheck
from harness.records.scenario import Backend, Evidence, Expect, Hazard, NamedEnum, Scenario


@dataclass(frozen=True)
class Verdict:
    expect: Expect
    observed: Expect | None  # None: the scenario ended in an error
    evidence: tuple[Evidence, ...]  # what showed a race, in Evidence order (empty: none did)
    demanded: Evidence | None = None  # the evidence an expected race must show (None: any)
    error: str | None = None
    not_restored: str | None = None  # observed wrong: the slots the landed load op did not restore

    @property
    def met(self) -> bool:
        if self.error is not None or self.observed is not self.expect:
            return False
        return self.demanded is None or self.demanded in self.evidence

    def describe(self) -> str:
        """The verdict in a few words: 'race (data, analysis)', 'clean', 'error'."""
        if self.error is not None:
            return "error"
        if self.observed is Expect.WRONG:
            return "wrong (not restored)"
        if self.observed is Expect.RACE:
            return f"race ({', '.join(e.value for e in self.evidence)})"
        return "clean"

    def shortfall(self) -> str | None:
        """Why an expectation was not met, in one phrase; None when it was."""
        if self.met:
            return None
        if self.error is not None:
            return f"error: {self.error}"
        if self.observed is Expect.WRONG:
            return f"every load landed, and the load op left slots unrestored: {self.not_restored}"
        if self.expect is Expect.WRONG:
            return "every slot was restored (the landed load op left none wrong)"
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
           graph_findings: int = 0, not_restored: str | None = None) -> Verdict:
    if error is not None:
        return Verdict(scenario.expect, None, (), scenario.evidence, error)
    if not_restored is not None:
        return Verdict(scenario.expect, Expect.WRONG, (), scenario.evidence, not_restored=not_restored)
    seen = {Evidence.DATA: stale_replays > 0, Evidence.ANALYSIS: findings > 0, Evidence.GRAPH: graph_findings > 0}
    evidence = tuple(e for e in Evidence if seen[e])
    observed = Expect.RACE if evidence else Expect.CLEAN
    return Verdict(scenario.expect, observed, evidence, scenario.evidence)


def graph_shows_race(scenario: Scenario) -> bool:
    """Whether the graph check can show this scenario's race: a node of the whole-body graph (backend
    full) reading or writing a region before the load op's copy lands (raw, waw). The other hazards
    order copies outside the graph after its accesses (the next batch's load over slots a replay
    reads, the write-back and its host buffers): no graph node misses an edge from a load. Breakable
    and eager races are waits the Python accessors skip, between graphs or with none."""
    return scenario.backend is Backend.FULL and scenario.hazard in (Hazard.RAW, Hazard.WAW)


class GraphStatus(NamedEnum):
    """How a scenario's graph check compares with its expectation."""

    AGREES = "agrees"
    DISAGREES = "disagrees"
    ERROR = "error"  # the scenario ended in an error (an op list that does not match its graph, say)
    NOT_A_GRAPH_RACE = "not a graph race"  # a race the graph cannot show (`graph_shows_race`): not compared
    NOT_CHECKED = "not checked"  # no graph could be read (no cuda-bindings): nothing to compare

    @property
    def ok(self) -> bool:
        return self not in (GraphStatus.DISAGREES, GraphStatus.ERROR)


@dataclass(frozen=True)
class GraphVerdict:
    """The graph check's own verdict on one scenario: race when it has findings, clean when none."""

    expect: Expect
    compared: bool  # the expectation is one the graph check must agree with
    observed: Expect | None  # None: an error, or no graph read
    findings: int = 0
    error: str | None = None
    unavailable: str | None = None  # why no graph could be read

    @property
    def status(self) -> GraphStatus:
        if self.error is not None:
            return GraphStatus.ERROR
        if self.observed is None:
            return GraphStatus.NOT_CHECKED
        if not self.compared:
            return GraphStatus.NOT_A_GRAPH_RACE
        return GraphStatus.AGREES if self.observed is self.expect else GraphStatus.DISAGREES

    def describe(self) -> str:
        """'race', 'clean', 'error' or 'not checked'."""
        if self.error is not None:
            return "error"
        return self.observed.value if self.observed is not None else "not checked"


def decide_graph(scenario: Scenario, graph: GraphCheck | None, error: str | None = None) -> GraphVerdict:
    """The graph verdict of a scenario that ran up to its graph check (`run_scenario(counted=False)`).
    A recorded op list that does not match its graph is the scenario's error (GraphMismatch)."""
    compared = scenario.expect is Expect.CLEAN or graph_shows_race(scenario)
    if error is not None or graph is None:
        return GraphVerdict(scenario.expect, compared, None, error=error or "no graph check ran")
    if graph.read_none:
        return GraphVerdict(scenario.expect, compared, None, unavailable=graph.unavailable)
    observed = Expect.RACE if graph.findings else Expect.CLEAN
    return GraphVerdict(scenario.expect, compared, observed, len(graph.findings))
