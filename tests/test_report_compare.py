"""compare(new, baseline) on crafted pairs: each kind of regression, and none."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from harness.records.errors import InputError
from harness.report.compare import compare
from harness.report.schema import load

ROOT = Path(__file__).resolve().parent.parent
BASE = load(ROOT / "tests" / "data" / "report" / "results-full.json")
FENCED = "hybrid-full-final_event"
RACY = "mamba-full-none"
FINDING = "L0 mamba (graph replay on forward) reads conv[L0, slots 1:3] unordered with the H2D copy"


def edited(**changes) -> dict:
    """A copy of the baseline with {scenario name: {key: value}} applied."""
    doc = copy.deepcopy(BASE)
    by_name = {s["name"]: s for s in doc["scenarios"]}
    for name, fields in changes.items():
        by_name[name.replace("__", "-")].update(fields)
    return doc


def scenario(doc: dict, name: str) -> dict:
    return next(s for s in doc["scenarios"] if s["name"] == name)


def test_the_same_run_is_no_regression():
    c = compare(copy.deepcopy(BASE), BASE)
    assert not c.regression
    assert c.lines() == ["no regression"]
    assert c.warnings == []


def test_a_race_on_a_fenced_scenario_is_a_regression():
    new = edited(**{FENCED: dict(observed="race", met=False, stale_replays=3, stale_rate=0.015)})
    c = compare(new, BASE)
    assert c.regression
    assert c.new_races == [f"{FENCED}: clean -> race (stale 3/200, expected clean)"]
    assert c.newly_unmet == [f"{FENCED}: expected clean, observed race"]
    assert c.lines()[0] == "new races (1):" and c.lines()[-1] == "REGRESSION"


def test_a_race_no_longer_seen_is_listed_and_unmet():
    new = edited(**{RACY: dict(observed="clean", met=False, stale_replays=0, stale_rate=0.0)})
    c = compare(new, BASE)
    assert c.fixed_races == [f"{RACY}: race -> clean (expected race)"]
    assert c.newly_unmet == [f"{RACY}: expected race, observed clean"]
    assert c.regression and not c.new_races


def test_an_error_is_an_unmet_expectation():
    new = edited(**{FENCED: dict(observed=None, met=False, error="replay 7 timed out after 30 s")})
    c = compare(new, BASE)
    assert c.newly_unmet == [f"{FENCED}: expected clean, observed error"]
    assert c.regression and not c.cost_regressions  # an errored run's throughput is not compared


def test_a_race_is_new_wherever_it_was_clean_before():
    # Even on a scenario that expects a race and missed it in the baseline: a race that was not
    # there is news, and compare leaves the judgement to whoever reads the list.
    new = edited(**{RACY: dict(observed="race", met=True)})
    base = edited(**{RACY: dict(observed="clean", met=False)})
    c = compare(new, base)
    assert c.new_races and c.regression and not c.newly_unmet


def test_a_changed_expectation_is_listed():
    c = compare(edited(**{FENCED: dict(expect="race", met=False)}), BASE)
    assert c.changed_expectations == [f"{FENCED}: clean -> race"]
    assert c.newly_unmet == [f"{FENCED}: expected race, observed clean"]


def test_changed_findings_are_listed_but_not_a_regression():
    old_findings = scenario(BASE, RACY)["findings"]
    new = edited(**{RACY: dict(findings=old_findings[1:] + [FINDING])})
    c = compare(new, BASE)
    assert c.new_findings == {RACY: [FINDING]}
    assert c.lost_findings == {RACY: [old_findings[0]]}
    assert not c.regression
    assert f"  {RACY}: {FINDING}" in c.lines()


@pytest.mark.parametrize("rate_factor,threshold,regressed", [
    (0.85, 10.0, True), (0.95, 10.0, False), (0.85, 20.0, False), (1.5, 0.0, False),
])
def test_a_throughput_drop_past_the_threshold(rate_factor, threshold, regressed):
    base_rate = scenario(BASE, RACY)["timings"]["replays_per_s"]
    new = edited(**{RACY: dict(timings={"replays_per_s": base_rate * rate_factor})})
    c = compare(new, BASE, cost_threshold_pct=threshold)
    assert c.regression is regressed
    if regressed:
        (cost,) = c.cost_regressions
        assert (cost.what, cost.metric) == (RACY, "replays_per_s")
        assert cost.change_pct == pytest.approx(-15.0)


def test_a_slower_bench_point_is_a_regression():
    new = copy.deepcopy(BASE)
    point = new["bench"]["points"][5]
    point["median_ms"] *= 1.25
    new["bench"]["points"][6]["median_ms"] *= 1.05  # within 10%
    c = compare(new, BASE)
    (cost,) = c.cost_regressions
    assert cost.metric == "median_ms" and cost.change_pct == pytest.approx(25.0)
    assert cost.what == f"bench {point['model']} L{point['layers']} P{point['prefix']} {point['strategy']}"
    assert c.regression


def test_a_faster_run_and_missing_bench_are_fine():
    new = copy.deepcopy(BASE)
    del new["bench"]
    for s in new["scenarios"]:
        s["timings"]["replays_per_s"] *= 2
    assert not compare(new, BASE).regression


def test_mismatched_scenario_sets_are_listed():
    new = copy.deepcopy(BASE)
    gone = new["scenarios"].pop(0)
    extra = copy.deepcopy(new["scenarios"][0])
    extra["name"] = "hybrid-full-first_event"
    new["scenarios"].append(extra)
    c = compare(new, BASE)
    assert c.only_in_new == ["hybrid-full-first_event"]
    assert c.only_in_baseline == [gone["name"]]
    assert not c.regression and c.warnings == []
    assert "only in the baseline (1):" in c.lines()


def test_runs_with_nothing_in_common_say_so():
    new = copy.deepcopy(BASE)
    for s in new["scenarios"]:
        s["name"] = "other-" + s["name"]
    c = compare(new, BASE)
    assert len(c.only_in_new) == len(c.only_in_baseline) == 12
    assert c.warnings == ["the two runs share no scenario: nothing to compare but the bench"]


def test_a_different_environment_is_a_warning():
    new = copy.deepcopy(BASE)
    new["environment"].update(gpu="NVIDIA H100 80GB HBM3", driver="570.86.15")
    c = compare(new, BASE)
    assert c.warnings == [
        "environment differs: gpu NVIDIA H200 (baseline) vs NVIDIA H100 80GB HBM3 (new)",
        "environment differs: driver 580.159.04 (baseline) vs 570.86.15 (new)",
    ]
    assert not c.regression


@pytest.mark.parametrize("change", [
    lambda d: d.update(schema_version=2),
    lambda d: d.pop("scenarios"),
    lambda d: d["scenarios"][0].pop("observed"),
])
def test_a_wrong_baseline_is_an_input_error(change):
    base = copy.deepcopy(BASE)
    change(base)
    with pytest.raises(InputError) as e:
        compare(BASE, base)
    assert e.value.exit_code == 2 and str(e.value).startswith("baseline: ")
