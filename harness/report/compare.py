"""Two results.json side by side: what a change to the harness or the engine did.

Scenarios are matched by name, bench points by (model, layers, prefix, strategy). A regression
is a race that was not there, an expectation that was met and no longer is, or a cost that
grew past the threshold; everything else (fixed races, changed evidence, new or lost findings)
is listed for a human to read.

Findings are matched by what they mean, (kind, copy region, access region, what), never by
their wording or the streams' labels: by their `finding_records` when both entries have them,
else by parsing the sentences (`Finding.describe()`, this build's wording or an older one).
Costs are compared only between runs on the same kind of device: the simulator's replays/s
say nothing about a GPU's.

Every scenario's stale rate in the two runs gets Fisher's exact test (two-sided): those that
differ at p < 0.05 are listed with their 95% intervals, not counted as regressions (a verdict
that changed is one already). Run one set twice, `--fence none` and `--fence final_event`, and
the comparison is the fenced against the unfenced rate of every scenario, each with its test.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from harness.records.races import RaceKind
from harness.records.rates import SIGNIFICANT, Rate, exact_test
from harness.records.trace import Region
from harness.report.schema import validate

ENVIRONMENT_KEYS = ("gpu", "driver", "torch", "cuda", "device")

# --- findings by meaning -------------------------------------------------------------------

# (kind, copy region, access region, what): what a finding means, whatever the streams are called.
FindingKey = tuple[str, str, str, str]

_REGION = r"\w+\[L\d+, slots \d+:\d+\]"
_WHO = r"(?P<what>.*?) \((?:graph replay|stream) on .+?\)"  # Finding._who: what, where, the access's stream
# Finding.describe()'s sentences; every stream label is matched by `.+?` and dropped.
_SENTENCES = (
    # this build: the access is the later side
    re.compile(rf"{_WHO} (?P<verb>reads|writes) (?P<access>{_REGION}), but nothing orders it after "
               rf"the H2D copy on .+? that (?P<copy_verb>writes|overwrites) (?P<copy>{_REGION}): "
               r".+ waited on no event recorded after that"),
    # this build: the copy is the later side
    re.compile(rf"the H2D copy on .+? that (?P<copy_verb>writes|overwrites) (?P<copy>{_REGION}), but "
               rf"nothing orders it after {_WHO} (?P<verb>reads|writes) (?P<access>{_REGION}): "
               r".+ waited on no event recorded after that"),
    # older builds: the access later, then the copy later
    re.compile(rf"{_WHO} (?P<verb>reads|writes) (?P<access>{_REGION}) unordered with the H2D copy on .+? "
               rf"that (?:also )?writes (?P<copy>{_REGION}): no event recorded after that copy was "
               r"waited on by .+ before the (?:read|write)"),
    re.compile(rf"the H2D copy on .+? (?P<copy_verb>overwrites|also writes) (?P<copy>{_REGION}) "
               rf"unordered with the earlier (?:read|write) of (?P<access>{_REGION}) by {_WHO}: "
               r"no event recorded after that (?:read|write) was waited on by .+ before the copy"),
)
_NO_WHAT = "an access"  # Finding._who's stand-in for an access with no `what`


def _sentence_kind(verb: str | None, copy_verb: str | None) -> RaceKind:
    # A copy over a read "overwrites" it; otherwise the access's own verb says read or write.
    if copy_verb == "overwrites":
        return RaceKind.WRITE_AFTER_READ
    return RaceKind.READ_AFTER_WRITE if verb == "reads" else RaceKind.WRITE_AFTER_WRITE


def sentence_key(sentence: str) -> FindingKey | None:
    """A finding's meaning from its sentence; None for a wording no build wrote."""
    for pattern in _SENTENCES:
        m = pattern.fullmatch(sentence)
        if m:
            what = "" if m["what"] == _NO_WHAT else m["what"]
            kind = _sentence_kind(m.groupdict().get("verb"), m.groupdict().get("copy_verb"))
            return (kind.value, m["copy"], m["access"], what)
    return None


def record_key(record: dict) -> FindingKey:
    """A finding's meaning from its `finding_records` entry (regions written as describe() does)."""
    return (record["kind"], str(Region(**record["copy_region"])), str(Region(**record["access_region"])),
            record["what"])


def _findings(s: dict, by_record: bool) -> dict[FindingKey | str, str]:
    """A scenario's findings: meaning -> the sentence to show. A sentence that does not parse
    stands for itself (it still matches the same sentence on the other side)."""
    sentences = s["findings"]
    if not by_record:
        return {sentence_key(text) or text: text for text in sentences}
    keys = [record_key(r) for r in s["finding_records"]]
    return {key: sentences[i] if i < len(sentences) else ", ".join(key) for i, key in enumerate(keys)}


def _changed_findings(s: dict, b: dict) -> tuple[list[str], list[str]]:
    """(new, lost) findings of one scenario, each as the sentence of the side that has it."""
    by_record = "finding_records" in s and "finding_records" in b
    now, before = _findings(s, by_record), _findings(b, by_record)
    return ([text for key, text in now.items() if key not in before],
            [text for key, text in before.items() if key not in now])


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


@dataclass(frozen=True)
class RateChange:
    """One scenario's stale rate in both runs, with Fisher's exact test of the two."""

    what: str
    baseline: Rate
    new: Rate
    p_value: float
    fences: tuple[str, str] | None = None  # (baseline's, new) when the two ran other fences

    @staticmethod
    def _text(rate: Rate) -> str:
        low, high = rate.interval()
        return f"{rate.stale}/{rate.replays} ({low:.1%}–{high:.1%})"

    def __str__(self) -> str:
        p = f"{self.p_value:.3f}" if self.p_value >= 0.001 else f"{self.p_value:.1e}"
        fences = f" [fence {self.fences[0]} -> {self.fences[1]}]" if self.fences else ""
        return f"{self.what}: stale {self._text(self.baseline)} -> {self._text(self.new)}, p = {p}{fences}"


@dataclass
class Comparison:
    new_races: list[str] = field(default_factory=list)          # race now, clean in the baseline
    fixed_races: list[str] = field(default_factory=list)        # clean now, race in the baseline, clean expected
    lost_races: list[str] = field(default_factory=list)         # clean now, race in the baseline, race expected
    changed_evidence: list[str] = field(default_factory=list)   # "name: race (data, analysis) -> race (analysis)"
    changed_expectations: list[str] = field(default_factory=list)  # "name: race -> clean"
    newly_unmet: list[str] = field(default_factory=list)        # met in the baseline, not now
    new_findings: dict[str, list[str]] = field(default_factory=dict)
    lost_findings: dict[str, list[str]] = field(default_factory=dict)
    cost_regressions: list[CostRegression] = field(default_factory=list)
    rate_tests: list[RateChange] = field(default_factory=list)  # every scenario both runs finished
    only_in_new: list[str] = field(default_factory=list)
    only_in_baseline: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)           # the two runs' environments differ
    notes: list[str] = field(default_factory=list)              # what was not compared, and why

    @property
    def rate_changes(self) -> list[RateChange]:
        """The stale rates that differ between the runs by more than chance (p < 0.05)."""
        return [r for r in self.rate_tests if r.p_value < SIGNIFICANT]

    shared: int = 0  # scenarios both runs hold
    scenarios: int = 0  # scenarios either run holds
    bench_compared: int = 0  # bench points both runs hold

    @property
    def regression(self) -> bool:
        return bool(self.new_races or self.lost_races or self.newly_unmet or self.cost_regressions)

    @property
    def compared_nothing(self) -> bool:
        """The runs share no scenario though they hold some, or hold none and share no bench point:
        "no regression" would mean nothing."""
        return not self.shared and (self.scenarios > 0 or not self.bench_compared)

    def lines(self) -> list[str]:
        """The report `fence-harness compare` prints: non-empty sections, then the verdict."""
        out: list[str] = []

        def section(title: str, items: list[str]) -> None:
            if items:
                out.append(f"{title} ({len(items)}):")
                out.extend(f"  {item}" for item in items)

        section("new races", self.new_races)
        section("expected races no longer seen", self.lost_races)
        section("expectations met before, unmet now", self.newly_unmet)
        section("cost regressions", [str(c) for c in self.cost_regressions])
        section("fixed races", self.fixed_races)
        section("changed evidence", self.changed_evidence)
        section("changed expectations", self.changed_expectations)
        section(f"stale rates that differ (Fisher's exact test, two-sided, p < {SIGNIFICANT:g}, "
                f"of {len(self.rate_tests)} compared)", [str(r) for r in self.rate_changes])
        for title, found in (("new findings", self.new_findings), ("lost findings", self.lost_findings)):
            section(title, [f"{name}: {f}" for name, fs in found.items() for f in fs])
        section("only in the new run", self.only_in_new)
        section("only in the baseline", self.only_in_baseline)
        out.extend(f"note: {note}" for note in self.notes)
        if self.compared_nothing:
            out.append("NOTHING COMPARED: the two runs share no scenario" if self.scenarios
                       else "NOTHING COMPARED: the two runs share no bench point")
        else:
            out.append("REGRESSION" if self.regression else "no regression")
        return out


def _observed(s: dict) -> str:
    return "error" if s.get("error") else str(s["observed"])


def _verdict(s: dict) -> str:
    """The verdict with its evidence, as the console prints it: "race (data, analysis)"."""
    evidence = s.get("evidence") or []
    return f"{s['observed']} ({', '.join(evidence)})" if evidence else str(s["observed"])


def _evidence_change(name: str, s: dict, b: dict) -> str | None:
    """The same verdict shown by other evidence (older files have none to compare)."""
    if "evidence" not in s or "evidence" not in b or s["observed"] != b["observed"]:
        return None
    # A file from before the graph check has no graph evidence to compare with.
    drop = set() if "graph" in s and "graph" in b else {"graph"}
    new, old = sorted(set(s["evidence"]) - drop), sorted(set(b["evidence"]) - drop)
    if s["error"] or b["error"] or new == old:
        return None
    lost = sorted(set(old) - set(new))
    why = f" (lost its {' and '.join(lost)} evidence)" if lost else ""
    return f"{name}: {_verdict(b)} -> {_verdict(s)}{why}"


def _cost_skip(new_doc: dict, baseline_doc: dict) -> str | None:
    """Why costs are not compared, or None when both runs ran on one kind of device."""
    new, base = new_doc["environment"]["device"], baseline_doc["environment"]["device"]
    if new == base:
        return None
    return (f"costs not compared (replays/s, bench medians): the new run ran on {new} and the baseline "
            f"on {base}, and one device's speed says nothing about the other's")


def _bench_key(p: dict) -> tuple:
    return (p["model"], p["layers"], p["prefix"], p["strategy"], p.get("hidden", 1024))


def compare(new_doc: dict, baseline_doc: dict, cost_threshold_pct: float = 10.0) -> Comparison:
    # Documents read from files were validated under their file names already; this catches a
    # document built in memory, and a baseline of another schema version, before any key is read.
    validate(baseline_doc, "baseline")
    validate(new_doc, "new results")
    c = Comparison(warnings=_environment_warnings(new_doc, baseline_doc))
    skip = _cost_skip(new_doc, baseline_doc)
    limit = None if skip else cost_threshold_pct / 100.0
    if skip:
        c.notes.append(skip)

    new = {s["name"]: s for s in new_doc["scenarios"]}
    old = {s["name"]: s for s in baseline_doc["scenarios"]}
    c.only_in_new = [n for n in new if n not in old]
    c.only_in_baseline = [n for n in old if n not in new]
    c.shared = sum(n in old for n in new)
    c.scenarios = len(set(new) | set(old))
    for name in (n for n in new if n in old):
        _compare_scenario(name, new[name], old[name], limit, c)
    if limit is not None:
        _compare_bench(new_doc, baseline_doc, limit, c)
    return c


def _environment_warnings(new_doc: dict, baseline_doc: dict) -> list[str]:
    warnings = []
    for key in ENVIRONMENT_KEYS:
        a, b = baseline_doc["environment"].get(key), new_doc["environment"].get(key)
        if a != b:
            warnings.append(f"environment differs: {key} {a or 'absent'} (baseline) vs {b or 'absent'} (new)")
    return warnings


def _compare_scenario(name: str, s: dict, b: dict, limit: float | None, c: Comparison) -> None:
    """One scenario of both runs into `c`; `limit` is the cost threshold (None: costs skipped)."""
    if s["observed"] == "race" and b["observed"] == "clean":
        c.new_races.append(f"{name}: clean -> race (stale {s['stale_replays']}/{s['replays']}, "
                           f"expected {s['expect']})")
    if s["observed"] == "clean" and b["observed"] == "race":
        # Clean where a race is expected is a race the harness stopped seeing, never a fix.
        gone = c.lost_races if s["expect"] == "race" else c.fixed_races
        gone.append(f"{name}: race -> clean (expected {s['expect']})")
    if s["expect"] != b["expect"]:
        c.changed_expectations.append(f"{name}: {b['expect']} -> {s['expect']}")
    if b["met"] and not s["met"]:
        c.newly_unmet.append(f"{name}: expected {s['expect']}, observed {_observed(s)}")
    evidence = _evidence_change(name, s, b)
    if evidence:
        c.changed_evidence.append(evidence)
    added, lost = _changed_findings(s, b)
    if added:
        c.new_findings[name] = added
    if lost:
        c.lost_findings[name] = lost
    rate = _rate_test(name, s, b)
    if rate is not None:
        c.rate_tests.append(rate)
    # Throughput only between two runs that both finished; an error has no meaningful rate.
    speed, base_speed = s["timings"]["replays_per_s"], b["timings"]["replays_per_s"]
    if limit is not None and not s["error"] and not b["error"] and 0 < base_speed and speed < base_speed * (1 - limit):
        c.cost_regressions.append(CostRegression(name, "replays_per_s", base_speed, speed))


def _rate_test(name: str, s: dict, b: dict) -> RateChange | None:
    """The exact test of one scenario's two stale rates; None where either side has none."""
    if s["error"] or b["error"] or not s["replays"] or not b["replays"]:
        return None
    new, base = Rate(s["stale_replays"], s["replays"]), Rate(b["stale_replays"], b["replays"])
    fences = ((b.get("definition") or {}).get("fence"), (s.get("definition") or {}).get("fence"))
    differ = None not in fences and fences[0] != fences[1]
    return RateChange(name, base, new, exact_test(base, new).p_value, fences if differ else None)  # type: ignore[arg-type]


def _compare_bench(new_doc: dict, baseline_doc: dict, limit: float, c: Comparison) -> None:
    base_points = {_bench_key(p): p for p in (baseline_doc.get("bench") or {}).get("points", [])}
    for p in (new_doc.get("bench") or {}).get("points", []):
        b = base_points.get(_bench_key(p))
        c.bench_compared += b is not None
        if b and b["median_ms"] > 0 and p["median_ms"] > b["median_ms"] * (1 + limit):
            what = "bench {} L{} P{} {}".format(*_bench_key(p))
            c.cost_regressions.append(CostRegression(what, "median_ms", b["median_ms"], p["median_ms"]))
