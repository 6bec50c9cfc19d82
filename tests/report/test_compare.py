"""compare(new, baseline) on crafted pairs: each kind of regression, and none; findings matched by
meaning; costs only on one device; a fresh simulator run against the GPU's verdicts."""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from pathlib import Path

import pytest

from harness.checkers.happens_before import Finding
from harness.frontends.cli import main
from harness.records.errors import InputError
from harness.records.races import RaceKind
from harness.records.trace import Region
from harness.report.compare import compare, record_key, sentence_key
from harness.report.results import finding_record
from harness.report.schema import load
from tests.support.paths import ROOT

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
    # An expected race that went clean is a race no longer seen, never "fixed".
    assert c.lost_races == [f"{RACY}: race -> clean (expected race)"] and not c.fixed_races
    assert c.newly_unmet == [f"{RACY}: expected race, observed clean"]
    assert c.regression and not c.new_races
    assert "fixed races" not in "\n".join(c.lines()) and c.lines()[-1] == "REGRESSION"


def test_a_race_fixed_where_clean_is_expected_is_a_fix():
    new = edited(**{RACY: dict(observed="clean", met=True, stale_replays=0, stale_rate=0.0, expect="clean")})
    c = compare(new, BASE)
    assert c.fixed_races == [f"{RACY}: race -> clean (expected clean)"] and not c.lost_races


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
    assert c.compared_nothing and c.shared == 0
    assert c.lines()[-1].startswith("NOTHING COMPARED") and "no regression" not in c.lines()


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


# ---------------------------------------------------------------- findings by meaning

K0 = Region("k", 0, 16, 272)
CONV1 = Region("conv", 1, 1, 3)


def finding(kind: RaceKind, region: Region = K0, *, copy: str = "load", access: str = "forward",
            what: str = "L0 attention", first: bool = False) -> Finding:
    return Finding(kind=kind, copy_stream=copy, copy_region=region, access_stream=access,
                   access_region=region, what=what, in_replay=True, access_first=first)


EVERY_SHAPE = [  # each kind the analyser reports, in each order it reports it, with and without a kernel name
    finding(RaceKind.READ_AFTER_WRITE),
    finding(RaceKind.WRITE_AFTER_WRITE, CONV1, what="L1 mamba"),
    finding(RaceKind.WRITE_AFTER_WRITE, CONV1, what="poison", first=True),
    finding(RaceKind.WRITE_AFTER_READ, first=True),
    finding(RaceKind.READ_AFTER_WRITE, what=""),
    finding(RaceKind.WRITE_AFTER_READ, CONV1, what="", first=True, copy="side stream", access="stream7"),
]


@pytest.mark.parametrize("f", EVERY_SHAPE, ids=lambda f: f"{f.kind.value}-{f.access_first}-{f.what or 'none'}")
def test_a_sentence_means_what_its_record_says(f):
    assert sentence_key(f.describe()) == record_key(finding_record(f))


def with_findings(findings: list[Finding], *, records: bool = True, name: str = RACY) -> dict:
    """The baseline with one scenario's findings replaced (as a run of this build writes them)."""
    doc = copy.deepcopy(BASE)
    entry = scenario(doc, name)
    entry["findings"] = [f.describe() for f in findings]
    if records:
        entry["finding_records"] = [finding_record(f) for f in findings]
    return doc


def relabelled(findings: list[Finding]) -> list[Finding]:
    """The same findings from a build that calls the load stream "h2d" and the forward one "main"."""
    names = {"load": "h2d", "forward": "main"}
    return [dataclasses.replace(f, copy_stream=names.get(f.copy_stream, f.copy_stream),
                                access_stream=names.get(f.access_stream, f.access_stream)) for f in findings]


@pytest.mark.parametrize("new_records,base_records", [(True, True), (True, False), (False, False)],
                         ids=["records", "records-on-one-side", "sentences"])
def test_findings_that_differ_only_in_stream_labels_are_the_same(new_records, base_records):
    now = with_findings(relabelled(EVERY_SHAPE), records=new_records)
    before = with_findings(EVERY_SHAPE, records=base_records)
    assert scenario(now, RACY)["findings"] != scenario(before, RACY)["findings"]  # the text differs
    c = compare(now, before)
    assert c.new_findings == {} and c.lost_findings == {}
    assert c.lines() == ["no regression"]


@pytest.mark.parametrize("records", [True, False], ids=["records", "sentences"])
def test_a_real_new_finding_is_listed_whatever_the_labels(records):
    extra = finding(RaceKind.READ_AFTER_WRITE, Region("v", 2, 304, 432), what="L2 attention")
    now = with_findings(relabelled([*EVERY_SHAPE, extra]), records=records)
    c = compare(now, with_findings(EVERY_SHAPE, records=records))
    (text,) = c.new_findings[RACY]
    assert text == relabelled([extra])[0].describe()  # shown as the new run wrote it
    assert c.lost_findings == {} and not c.regression


def test_a_finding_on_another_kernel_is_new_and_the_old_one_lost():
    now = with_findings([finding(RaceKind.READ_AFTER_WRITE, what="L0 final state")])
    c = compare(now, with_findings([finding(RaceKind.READ_AFTER_WRITE)]))
    assert list(c.new_findings) == list(c.lost_findings) == [RACY]


def test_an_older_builds_wording_and_labels_match_this_builds_sentences():
    # results-full.json holds findings in an earlier wording (and one scenario whose streams were
    # labelled "capture"); the GPU verdicts hold this build's sentences for the same scenarios.
    gpu = load(ROOT / "tests" / "data" / "gpu_verdicts.json")
    shared = {s["name"] for s in gpu["scenarios"]} & {s["name"] for s in BASE["scenarios"]}
    assert "hybrid-eager-nowaits" in shared
    assert scenario(BASE, "hybrid-eager-nowaits")["findings"] != scenario(gpu, "hybrid-eager-nowaits")["findings"]
    c = compare(gpu, BASE)
    assert c.new_findings == {} and c.lost_findings == {}


def test_a_sentence_of_no_known_wording_stands_for_itself():
    assert sentence_key("something the analyser never wrote") is None
    now = edited(**{RACY: dict(findings=["an odd sentence"])})
    c = compare(now, edited(**{RACY: dict(findings=["an odd sentence"])}))
    assert c.new_findings == {} and c.lost_findings == {}


# ---------------------------------------------------------------- evidence and devices


def test_a_race_that_lost_its_data_evidence_is_listed():
    base = edited(**{RACY: dict(evidence=["data", "analysis"])})
    new = edited(**{RACY: dict(evidence=["analysis"], stale_replays=0, stale_rate=0.0)})
    c = compare(new, base)
    assert c.changed_evidence == [f"{RACY}: race (data, analysis) -> race (analysis) (lost its data evidence)"]
    assert "changed evidence (1):" in c.lines()
    assert not c.regression  # the expectation is still met; a demanded evidence would make it unmet


def test_evidence_is_compared_only_where_both_files_have_it():
    c = compare(edited(**{RACY: dict(evidence=["analysis"])}), BASE)  # the baseline predates evidence
    assert c.changed_evidence == [] and c.lines() == ["no regression"]


def test_costs_are_not_compared_across_devices():
    new = copy.deepcopy(BASE)
    new["environment"]["device"] = "sim"
    for s in new["scenarios"]:
        s["timings"]["replays_per_s"] /= 10
    for p in new["bench"]["points"]:
        p["median_ms"] *= 10
    c = compare(new, BASE)
    assert c.cost_regressions == [] and not c.regression
    notes = [line for line in c.lines() if line.startswith("note:")]
    assert notes == ["note: costs not compared (replays/s, bench medians): the new run ran on sim and the "
                     "baseline on cuda, and one device's speed says nothing about the other's"]
    assert c.lines()[-1] == "no regression"


def test_costs_on_one_device_are_still_compared():
    new = edited(**{RACY: dict(timings={"replays_per_s": 1.0})})
    c = compare(new, BASE)
    assert [cost.what for cost in c.cost_regressions] == [RACY] and c.notes == []


# ---------------------------------------------------------------- a simulator run against the GPU's


GPU_VERDICTS = ROOT / "tests" / "data" / "gpu_verdicts.json"
SIM_SCENARIOS = ("hybrid-full-none", "hybrid-full-final_event", "mamba-eager-nowaits")


@pytest.fixture(scope="module")
def sim_results(tmp_path_factory) -> Path:
    """results.json of a fresh simulator run of a few default scenarios, as `run` writes it."""
    from harness.devices.sim import SimDevice
    from harness.input.scenario_file import SCENARIO_DIR, load_files
    from harness.report.results import build_results, write_results
    from harness.run.pipeline import run_scenario

    dev = SimDevice()
    scenarios = [s for s in load_files([SCENARIO_DIR / "default.toml"]) if s.name in SIM_SCENARIOS]
    started = time.time()
    results = [run_scenario(s, dev, replays=3) for s in scenarios]
    doc = build_results(results, dev.describe(), started, time.time())
    return write_results(tmp_path_factory.mktemp("sim"), doc)


@pytest.mark.parametrize("restricted", [False, True], ids=["every-gpu-scenario", "the-same-scenarios"])
def test_a_simulator_run_against_gpu_verdicts_agrees(sim_results, restricted, tmp_path, capsys):
    baseline = GPU_VERDICTS
    if restricted:
        gpu = json.loads(GPU_VERDICTS.read_text())
        gpu["scenarios"] = [s for s in gpu["scenarios"] if s["name"] in SIM_SCENARIOS]
        gpu["pairs"] = [p for p in gpu.get("pairs") or [] if {p["a"], p["b"]} <= set(SIM_SCENARIOS)]
        baseline = tmp_path / "gpu.json"
        baseline.write_text(json.dumps(gpu))
    assert main(["compare", str(sim_results), str(baseline)]) == 0
    out = capsys.readouterr().out
    for section in ("new races", "unmet now", "cost regressions", "fixed races", "changed evidence",
                    "new findings", "lost findings", "only in the new run"):
        assert section not in out, out
    others = len([s for s in json.loads(GPU_VERDICTS.read_text())["scenarios"] if s["name"] not in SIM_SCENARIOS])
    assert (f"only in the baseline ({others}):" in out) is not restricted
    assert "note: costs not compared" in out and out.rstrip().endswith("no regression")


def test_the_simulator_run_records_its_findings_by_meaning(sim_results):
    doc = load(sim_results)
    racy = scenario(doc, "hybrid-full-none")
    assert racy["finding_records"] and len(racy["finding_records"]) == len(racy["findings"])
    assert [record_key(r) for r in racy["finding_records"]] == [sentence_key(t) for t in racy["findings"]]
    assert {r["streams"]["copy"] for r in racy["finding_records"]} == {"load"}
