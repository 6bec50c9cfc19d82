"""Stale rates with their intervals, and exact tests of pairs, in results.json, the reports and compare."""

from __future__ import annotations

import copy
import json
import time

import pytest

from harness.records.errors import ReportInputError
from harness.records.rates import Rate, exact_test
from harness.report.compare import compare
from harness.report.html import render_html
from harness.report.pairs import pairs, pairs_of
from harness.report.schema import load, validate
from harness.report.summary import interval_text, p_text, render_summary, see_text
from tests.support.paths import ROOT

FULL = load(ROOT / "tests" / "data" / "report" / "results-full.json")
TINY = (ROOT / "tests" / "data" / "tiny.toml").read_text()


@pytest.fixture(scope="module")
def tiny_doc() -> dict:
    from harness.devices.sim import SimDevice
    from harness.input.scenario_file import parse_text
    from harness.report.results import build_results
    from harness.run.pipeline import run_scenario

    results = [run_scenario(s, SimDevice(), replays=4) for s in parse_text(TINY, "tiny.toml")]
    return json.loads(json.dumps(build_results(results, SimDevice().describe(), time.time(), time.time())))


def test_every_entry_carries_its_interval_and_the_replays_to_see(tiny_doc):
    validate(tiny_doc)
    racy, fenced = tiny_doc["scenarios"]
    assert (racy["stale_replays"], fenced["stale_replays"]) == (4, 0)
    assert racy["stale_interval"] == pytest.approx([0.025 ** (1 / 4), 1.0], abs=1e-6)
    assert fenced["stale_interval"] == pytest.approx([0.0, 1 - 0.025 ** (1 / 4)], abs=1e-6)
    assert (racy["replays_to_see"], racy["replays_to_see_low"]) == (1, Rate(4, 4).replays_to_see_low)
    assert fenced["replays_to_see"] is None and fenced["replays_to_see_low"] is None
    assert tiny_doc["statistics"]["level"] == 0.95 and "Clopper-Pearson" in tiny_doc["statistics"]["interval"]


def test_a_fenced_and_unfenced_pair_gets_its_exact_test(tiny_doc):
    (pair,) = tiny_doc["pairs"]
    assert pair == {"kind": "fence", "a": "tiny-full-none", "b": "tiny-full-final_event",
                    "differs": "fence none / final_event", "a_stale": 4, "a_replays": 4, "b_stale": 0,
                    "b_replays": 4, "p_value": pytest.approx(exact_test(Rate(4, 4), Rate(0, 4)).p_value)}
    assert pair["p_value"] == pytest.approx(2 / 70)  # the most extreme of C(8,4) = 70 tables, both tails


def _entry(name: str, fence: str = "none", fault: str = "none", stale: int = 0, replays: int = 100, **more) -> dict:
    definition = {"name": name, "backend": "full", "fence": fence, "fault": {"kind": fault}, "replays": replays,
                  "seed": 0, "model": {"layers": "AAAA"}, "expect": "race", **more}
    return {"name": name, "definition": definition, "error": None, "stale_replays": stale, "replays": replays}


def test_pairs_differ_in_the_fence_or_in_contention_only():
    entries = [
        _entry("quiet-none", stale=0),
        _entry("quiet-final", fence="final_event"),
        _entry("quiet-layerwise", fence="layerwise_graph", replays=50),  # replay counts may differ
        _entry("busy-none", fault="pressure", stale=87),
        _entry("busy-final", fence="final_event", fault="pressure"),
        _entry("other-seed", fence="final_event", seed=1),  # differs in more than the fence
        {**_entry("broken", fence="host_sync"), "error": "boom"},  # an error pairs with nothing
    ]
    found = [(p["kind"], p["a"], p["b"]) for p in pairs(entries)]
    assert found == [("fence", "quiet-none", "quiet-final"), ("fence", "quiet-none", "quiet-layerwise"),
                     ("pressure", "quiet-none", "busy-none"), ("pressure", "quiet-final", "busy-final"),
                     ("fence", "busy-none", "busy-final")]
    busy = next(p for p in pairs(entries) if p["b"] == "busy-none")
    assert busy["differs"] == "no fault / pressure (fence none)" and busy["p_value"] < 1e-40


def test_an_older_file_gets_its_pairs_worked_out():
    assert "pairs" not in FULL
    assert [(p["a"], p["b"]) for p in pairs_of(FULL)] == [
        ("attention-full-none", "attention-full-final_event"), ("mamba-full-none", "mamba-full-final_event"),
        ("hybrid-full-none", "hybrid-full-final_event")]


def test_texts():
    entry = {"stale_replays": 261, "replays": 300}
    assert interval_text(entry) == "82.7%–90.6%" and see_text(entry) == "3"  # 0.13**2 > 0.01 >= 0.13**3
    assert see_text({"stale_replays": 0, "replays": 300}) == "-"
    assert interval_text({"stale_replays": 0, "replays": 0}) == "-"
    assert see_text({"stale_replays": 1, "replays": 1000, "replays_to_see": 4603}) == "4,603"
    assert (p_text(0.48571), p_text(3.56e-128), p_text(1.0)) == ("0.486", "3.6e-128", "1.000")


def test_summary_and_page_show_the_pairs(tiny_doc):
    text = render_summary(tiny_doc)
    assert "**Exact tests**" in text
    assert "| tiny-full-none | tiny-full-final_event | fence none / final_event | 4/4 (39.8%–100.0%) | " \
           "0/4 (0.0%–60.2%) | **0.029** |" in text
    page = render_html(tiny_doc)
    assert "<h2>Exact tests</h2>" in page and "differs" in page and "95%: 39.8%–100.0%" in page


def test_a_run_without_pairs_has_no_exact_test_block(tiny_doc):
    doc = copy.deepcopy(tiny_doc)
    doc["scenarios"] = doc["scenarios"][:1]
    doc["pairs"] = []
    assert "Exact tests" not in render_summary(doc) and "Exact tests" not in render_html(doc)


@pytest.mark.parametrize("change,key", [
    (lambda d: d["scenarios"][0].update(stale_interval=[0.5]), "scenarios[0].stale_interval"),
    (lambda d: d["scenarios"][0].update(stale_interval=[0.9, 0.1]), "scenarios[0].stale_interval"),
    (lambda d: d["scenarios"][0].update(replays_to_see="7"), "scenarios[0].replays_to_see"),
    (lambda d: d["pairs"][0].update(b="nobody"), "pairs[0].b"),
    (lambda d: d["pairs"][0].update(kind="seed"), "pairs[0].kind"),
    (lambda d: d["pairs"][0].pop("p_value"), "pairs[0].p_value"),
])
def test_bad_rate_fields_name_their_key(tiny_doc, change, key):
    doc = copy.deepcopy(tiny_doc)
    change(doc)
    with pytest.raises(ReportInputError) as e:
        validate(doc, "r.json")
    assert str(e.value).startswith(f"r.json: {key}: ")


def _with_rates(doc: dict, rates: dict[str, tuple[int, int]]) -> dict:
    doc = copy.deepcopy(doc)
    for s in doc["scenarios"]:
        if s["name"] in rates:
            s["stale_replays"], s["replays"] = rates[s["name"]]
            s["stale_rate"] = s["stale_replays"] / s["replays"]
    return doc


def test_compare_tests_every_rate_and_lists_those_that_differ():
    base = _with_rates(FULL, {"mamba-full-none": (188, 200), "hybrid-full-none": (200, 200)})
    new = _with_rates(FULL, {"mamba-full-none": (60, 200), "hybrid-full-none": (197, 200)})
    c = compare(new, base)
    assert len(c.rate_tests) == len([s for s in FULL["scenarios"] if not s["error"]])
    (change,) = c.rate_changes  # 200/200 -> 197/200 is within chance (p = 0.25)
    assert change.what == "mamba-full-none" and change.p_value == exact_test(Rate(188, 200), Rate(60, 200)).p_value
    assert not c.regression  # a rate that moved is listed, the verdicts decide regressions
    lines = c.lines()
    title = next(line for line in lines if line.startswith("stale rates that differ"))
    assert "of 12 compared" in title
    assert any(line.startswith("  mamba-full-none: stale 188/200 (89.8%–96.9%) -> 60/200 (23.7%–36.9%), p = ")
               for line in lines)


def test_compare_labels_a_fenced_run_against_an_unfenced_one():
    base = copy.deepcopy(FULL)
    new = copy.deepcopy(FULL)
    for s in new["scenarios"]:
        if s["name"] == "hybrid-full-none":
            s["definition"]["fence"] = "final_event"
            s.update(stale_replays=0, stale_rate=0.0, observed="clean", met=False)
    change = next(r for r in compare(new, base).rate_changes if r.what == "hybrid-full-none")
    assert change.fences == ("none", "final_event")
    assert str(change).endswith("[fence none -> final_event]") and change.p_value < 1e-100
