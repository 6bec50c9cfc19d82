"""Two results.json side by side: what a change to the harness or the engine did.

Scenarios are matched by name, bench points by (model, layers, prefix, strategy). A regression
is a race that was not there, an expectation that was met and no longer is, or a cost that
grew past the threshold; everything else is listed for a human to read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.report.schema import validate

ENVIRONMENT_KEYS = ("gpu", "driver", "torch", "cuda", "device")


@dataclass(frozen=True)
class CostRegression:
    what: str        # a scenario name or a bench point
    metric: str      # replays_per_s or median_ms
    baseline: float
    new: float

    @property
    def change_pct(self) -> float:
        return (self.new - self.baseline) / self.baseline * 100.0

    def __str__(self) -> str:
        return f"{self.what}: {self.metric} {self.baseline:g} -> {self.new:g} ({self.change_pct:+.1f}%)"


@dataclass
class Comparison:
    new_races: list[str] = field(default_factory=list)          # race now, clean in the baseline
    fixed_races: list[str] = field(default_factory=list)        # clean now, race in the baseline
    changed_expectations: list[str] = field(default_factory=list)  # "name: race -> clean"
    newly_unmet: list[str] = field(default_factory=list)        # met in the baseline, not now
    new_findings: dict[str, list[str]] = field(default_factory=dict)
    lost_findings: dict[str, list[str]] = field(default_factory=dict)
    cost_regressions: list[CostRegression] = field(default_factory=list)
    only_in_new: list[str] = field(default_factory=list)
    only_in_baseline: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)           # the two runs' environments differ

    @property
    def regression(self) -> bool:
        return bool(self.new_races or self.newly_unmet or self.cost_regressions)

    def lines(self) -> list[str]:
        """The report `fence-harness compare` prints: non-empty sections, then the verdict."""
        out: list[str] = []

        def section(title: str, items: list[str]) -> None:
            if items:
                out.append(f"{title} ({len(items)}):")
                out.extend(f"  {item}" for item in items)

        section("new races", self.new_races)
        section("expectations met before, unmet now", self.newly_unmet)
        section("cost regressions", [str(c) for c in self.cost_regressions])
        section("fixed races", self.fixed_races)
        section("changed expectations", self.changed_expectations)
        for title, found in (("new findings", self.new_findings), ("lost findings", self.lost_findings)):
            section(title, [f"{name}: {f}" for name, fs in found.items() for f in fs])
        section("only in the new run", self.only_in_new)
        section("only in the baseline", self.only_in_baseline)
        out.append("REGRESSION" if self.regression else "no regression")
        return out


def _observed(s: dict) -> str:
    return "error" if s.get("error") else str(s["observed"])


def _bench_key(p: dict) -> tuple:
    return (p["model"], p["layers"], p["prefix"], p["strategy"])


def compare(new_doc: dict, baseline_doc: dict, cost_threshold_pct: float = 10.0) -> Comparison:
    # Documents read from files were validated under their file names already; this catches a
    # document built in memory, and a baseline of another schema version, before any key is read.
    validate(baseline_doc, "baseline")
    validate(new_doc, "new results")
    c = Comparison()
    limit = cost_threshold_pct / 100.0

    for key in ENVIRONMENT_KEYS:
        a, b = baseline_doc["environment"].get(key), new_doc["environment"].get(key)
        if a != b:
            c.warnings.append(
                f"environment differs: {key} {a or 'absent'} (baseline) vs {b or 'absent'} (new)")

    new = {s["name"]: s for s in new_doc["scenarios"]}
    old = {s["name"]: s for s in baseline_doc["scenarios"]}
    c.only_in_new = [n for n in new if n not in old]
    c.only_in_baseline = [n for n in old if n not in new]
    if not any(n in old for n in new):
        c.warnings.append("the two runs share no scenario: nothing to compare but the bench")

    for name in (n for n in new if n in old):
        s, b = new[name], old[name]
        if s["observed"] == "race" and b["observed"] == "clean":
            c.new_races.append(f"{name}: clean -> race (stale {s['stale_replays']}/{s['replays']}, "
                               f"expected {s['expect']})")
        if s["observed"] == "clean" and b["observed"] == "race":
            c.fixed_races.append(f"{name}: race -> clean (expected {s['expect']})")
        if s["expect"] != b["expect"]:
            c.changed_expectations.append(f"{name}: {b['expect']} -> {s['expect']}")
        if b["met"] and not s["met"]:
            c.newly_unmet.append(f"{name}: expected {s['expect']}, observed {_observed(s)}")
        now_set, before_set = set(s["findings"]), set(b["findings"])
        added = [f for f in s["findings"] if f not in before_set]
        lost = [f for f in b["findings"] if f not in now_set]
        if added:
            c.new_findings[name] = added
        if lost:
            c.lost_findings[name] = lost
        # Throughput only between two runs that both finished; an error has no meaningful rate.
        rate, base_rate = s["timings"]["replays_per_s"], b["timings"]["replays_per_s"]
        if not s["error"] and not b["error"] and base_rate > 0 and rate < base_rate * (1 - limit):
            c.cost_regressions.append(CostRegression(name, "replays_per_s", base_rate, rate))

    base_points = {_bench_key(p): p for p in (baseline_doc.get("bench") or {}).get("points", [])}
    for p in (new_doc.get("bench") or {}).get("points", []):
        b = base_points.get(_bench_key(p))
        if b and b["median_ms"] > 0 and p["median_ms"] > b["median_ms"] * (1 + limit):
            what = "bench {} L{} P{} {}".format(*_bench_key(p))
            c.cost_regressions.append(CostRegression(what, "median_ms", b["median_ms"], p["median_ms"]))
    return c
