"""fence-harness graph-check on the simulator: a graph verdict per scenario from one traced replay
and the graph check, no counted replay; its failing twins (findings dropped, a mismatch); bad input."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from harness.checkers.graph import GraphCheck, GraphSummary
from harness.frontends.cli import main
from harness.input.scenario_file import SCENARIO_DIR, load_files
from harness.records.scenario import Backend, Expect, Hazard
from harness.report.schema import load
from harness.run import pipeline
from harness.run.replay import Replayer
from harness.run.verdict import GraphStatus, decide_graph, graph_shows_race
from tests.support.paths import ROOT

TINY = ROOT / "tests" / "data" / "tiny.toml"
KILL_MATRIX = SCENARIO_DIR / "mutants" / "kill_matrix.toml"
BAD = ROOT / "tests" / "data" / "bad_scenarios" / "bad_dtype.toml"


def _entries(out: Path) -> dict[str, dict]:
    doc = load(out / "results.json")  # validates against the results schema
    return {e["name"]: e for e in doc["graph_check"]["scenarios"]}


@pytest.fixture
def counted(monkeypatch) -> list[int]:
    """The counted replays that ran: Replayer.replays, spied on (index -1 is the one traced,
    uncounted replay the graph check needs)."""
    calls: list[int] = []
    real = Replayer.replays

    def spy(self, indices, *args, **kwargs):
        indices = list(indices)
        calls.extend(i for i in indices if i >= 0)
        return real(self, indices, *args, **kwargs)

    monkeypatch.setattr(Replayer, "replays", spy)
    return calls


def test_the_tiny_pair_agrees_with_no_counted_replay(tmp_path, capsys, counted):
    out = tmp_path / "gc"
    assert main(["graph-check", str(TINY), "--device", "sim", "--out", str(out)]) == 0
    assert counted == []
    entries = _entries(out)
    race, fenced = entries["tiny-full-none"], entries["tiny-full-final_event"]
    assert (race["status"], race["graph"], race["op_list"]) == ("agrees", "race", "matched")
    assert race["findings"] > 0 and race["nodes"]
    assert (fenced["status"], fenced["graph"], fenced["findings"]) == ("agrees", "clean", 0)
    doc = json.loads((out / "results.json").read_text())
    assert [s["replays"] for s in doc["scenarios"]] == [0, 0]
    assert doc["summary"]["met"] == 2  # the graph check's agreement, as the exit code counts it
    assert doc["scenarios"][0]["graph"]["findings"]  # the findings themselves, as run writes them
    printed = capsys.readouterr().out
    assert "2 scenarios: 2 agrees" in printed
    summary = (out / "summary.md").read_text()
    assert "| tiny-full-none | race | race |" in summary and "**Graph check**" in summary


def test_the_spy_sees_the_counted_replays_of_run(tmp_path, counted):
    # The spy's twin: `run` goes through the same pipeline and does count replays.
    assert main(["run", str(TINY), "--device", "sim", "--out", str(tmp_path / "run")]) == 0
    assert len(counted) == 2 * 3


def test_findings_dropped_disagree_and_exit_1(tmp_path, capsys, monkeypatch):
    real = pipeline.check_graphs
    monkeypatch.setattr(pipeline, "check_graphs",
                        lambda trace, source: dataclasses.replace(real(trace, source), findings=()))
    out = tmp_path / "gc"
    assert main(["graph-check", str(TINY), "--device", "sim", "--out", str(out)]) == 1
    entries = _entries(out)
    assert entries["tiny-full-none"]["status"] == "disagrees"
    assert entries["tiny-full-final_event"]["status"] == "agrees"
    assert "1 disagrees" in capsys.readouterr().out


def test_an_op_list_that_does_not_match_its_graph_is_an_error(tmp_path, monkeypatch):
    bad = GraphSummary(7, "sim", 3, 0, 0, 3, (), ("graph 7: op 0 waits on event 1; the graph holds no node there",))
    monkeypatch.setattr(pipeline, "check_graphs", lambda trace, source: GraphCheck((bad,)))
    out = tmp_path / "gc"
    assert main(["graph-check", str(TINY), "--device", "sim", "--out", str(out)]) == 1
    entry = _entries(out)["tiny-full-final_event"]
    assert entry["status"] == "error" and "does not match the graph" in entry["error"]


def test_no_graph_read_is_not_checked_and_no_failure(tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline, "check_graphs", lambda trace, source: GraphCheck(unavailable="no cuda-bindings"))
    out = tmp_path / "gc"
    assert main(["graph-check", str(TINY), "--device", "sim", "--out", str(out)]) == 0
    assert {e["status"] for e in _entries(out).values()} == {"not checked"}


@pytest.mark.parametrize("argv, names", [
    (["graph-check", "no/such.toml"], "no/such.toml"),
    (["graph-check", str(BAD)], "bad_dtype.toml"),
])
def test_bad_input_is_one_line_exit_2(argv, names, tmp_path, capsys):
    out = tmp_path / "gc"
    assert main([*argv, "--device", "sim", "--out", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and names in lines[0]
    assert not out.exists()


def test_the_kill_matrix_agrees_on_the_simulator(tmp_path, counted):
    out = tmp_path / "gc"
    assert main(["graph-check", str(KILL_MATRIX), "--device", "sim", "--out", str(out)]) == 0
    assert counted == []
    entries = _entries(out)
    mutant = entries["mutant.layerwise_events_never_recorded"]
    assert (mutant["status"], mutant["graph"]) == ("agrees", "race") and mutant["findings"] > 0
    twin = entries["correct.layerwise_graph.gate"]
    assert (twin["status"], twin["graph"], twin["findings"]) == ("agrees", "clean", 0)
    assert entries["mutant.write_after_read"]["status"] == "not a graph race"
    assert not [n for n, e in entries.items() if e["status"] not in ("agrees", "not a graph race")]
    doc = json.loads((out / "results.json").read_text())
    # Data-evidence races are unmet with nothing counted; the summary counts the graph's agreement.
    assert doc["summary"]["met"] == len(entries) > sum(s["met"] for s in doc["scenarios"])


def test_which_races_a_graph_can_show():
    by_name = {s.name: s for s in load_files([KILL_MATRIX])}
    full_raw = by_name["mutant.no_fence"]
    assert full_raw.backend is Backend.FULL and graph_shows_race(full_raw)
    assert graph_shows_race(by_name["mutant.write_after_write"])
    assert not graph_shows_race(dataclasses.replace(full_raw, hazard=Hazard.WAR))
    assert not graph_shows_race(dataclasses.replace(full_raw, backend=Backend.BREAKABLE))
    # A race the graph cannot show is not compared; a finding on a correct variant always is.
    breakable = dataclasses.replace(full_raw, backend=Backend.BREAKABLE)
    assert decide_graph(breakable, GraphCheck()).status is GraphStatus.NOT_A_GRAPH_RACE
    clean = dataclasses.replace(breakable, expect=Expect.CLEAN)
    finding_check = GraphCheck(findings=(object(),))  # type: ignore[arg-type]
    assert decide_graph(clean, finding_check).status is GraphStatus.DISAGREES
    assert decide_graph(full_raw, GraphCheck()).status is GraphStatus.DISAGREES
    assert decide_graph(full_raw, None, "a replay past its timeout").status is GraphStatus.ERROR
