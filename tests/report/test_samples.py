"""The committed samples (reports/samples/*) are runs of today's scenario files: each sample's
scenario set is what its recorded command selects from the files as they are now, so a sample left
behind by a change to a scenario file fails here; and no sample names a folder of the machine that
made it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.input.scenario_file import default_files, default_mutant_files, load_files
from harness.report.results import command_line
from harness.report.schema import load
from tests.support.paths import ROOT

SAMPLES = ROOT / "reports" / "samples"
# Samples known to be stale, by the commit they record: each fails both checks below, as an expected
# failure (strict: a sample regenerated on today's files must leave this list, or it fails), until
# a GPU run of the final build replaces it (docs/results.md#sample-reports names the commands).
STALE: set[str] = set()
# Samples of today's scenario files that still name the folder of the machine that made them, by
# commit: the path check alone is their expected failure (strict), until they are regenerated.
NAME_THEIR_HOST: set[str] = set()


def _runs(scenario_runs_only: bool) -> list:
    params = []
    for path in sorted(p.parent for p in SAMPLES.glob("*/results.json")):
        doc = load(path / "results.json")
        stale = doc["git_commit"] in STALE and not (scenario_runs_only and selected_names(doc["command"]) is None)
        named = not scenario_runs_only and doc["git_commit"] in NAME_THEIR_HOST
        marks = ([pytest.mark.xfail(strict=True, reason=f"{path.name}: stale, not yet regenerated")] if stale else
                 [pytest.mark.xfail(strict=True, reason=f"{path.name}: names its host's folder, not yet "
                                                        "regenerated")] if named else [])
        params.append(pytest.param(path, id=path.name, marks=marks))
    return params


# An absolute path of a build or test machine: a home, a checkout, a temporary or tool folder.
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:work|tmp|home|root|opt|usr/local|check|Users|var/folders)/")


def _files_after(command: list[str], flag: str) -> list[str]:
    if flag not in command:
        return []
    taken = []
    for arg in command[command.index(flag) + 1:]:
        if arg.startswith("-"):
            break
        taken.append(arg)
    return [a for a in taken if a.endswith(".toml")]


def _today(path: str) -> Path:
    """A recorded scenario file, as today's file of this checkout (a sample from before command
    lines were recorded path-free names it by the capturing machine's absolute path)."""
    parts = Path(path).parts
    return ROOT.joinpath(*parts[parts.index("scenarios"):]) if "scenarios" in parts else ROOT / path


def selected_names(recorded: list[str]) -> list[str] | None:
    """The scenario names the recorded command selects from today's files (None: a benchmark)."""
    command = command_line(recorded, ROOT)
    if command[0] == "fence-harness" and command[1] == "bench":
        return None
    if command[0] == "pytest":
        files = _files_after(command, "--harness-scenarios") + _files_after(command, "--harness-mutants")
    elif command[0] == "fence-harness" and command[1] in ("run", "mutants", "graph-check"):
        files = [a for a in command[2:] if a.endswith(".toml")]
        files = files or [str(p) for p in (default_mutant_files(ROOT) if command[1] == "mutants"
                                           else default_files("", ROOT))]
    else:
        raise AssertionError(f"a sample of a command this test does not know: {recorded}")
    return sorted(s.name for s in load_files(_today(f) for f in files))


RUNS = _runs(scenario_runs_only=False)


def test_there_are_samples():
    assert {"default-h200", "gpu-test-h200", "mutants-h200", "bench-h200"} <= {p.values[0].name for p in RUNS}


@pytest.mark.parametrize("run", _runs(scenario_runs_only=True))
def test_a_sample_is_a_run_of_todays_scenario_files(run):
    doc = load(run / "results.json")
    assert re.fullmatch(r"[0-9a-f]{40}", doc["git_commit"] or ""), doc["git_commit"]
    names = selected_names(doc["command"])
    if names is None:
        return
    ran = sorted({e["name"] for e in doc["scenarios"]} | {e["name"] for e in doc.get("skipped") or []})
    assert ran == names, (f"{run.name} is stale: rerun {' '.join(doc['command'])} — "
                          f"missing {sorted(set(names) - set(ran))}, gone {sorted(set(ran) - set(names))}")


@pytest.mark.parametrize("run", RUNS)
def test_a_sample_names_no_folder_of_the_machine_that_made_it(run):
    for path in sorted(p for p in run.rglob("*") if p.is_file()):
        text = path.read_text(encoding="utf-8", errors="replace")
        found = sorted(set(MACHINE_PATH.findall(text)))
        assert not found, f"{path.relative_to(ROOT)}: {found}"


def overlapping(timeline: dict, tolerance_us: float = 0.5) -> list[tuple[str, str, str]]:
    """(lane, span, span) for two spans of one lane that overlap in time. A stream runs its work one
    thing after another, so on a lane of its own no two spans of positive length overlap, but for
    what a graph replay holds (a drawing may put the replay's own reads inside it)."""
    lanes: dict[str, list[dict]] = {}
    for sp in timeline.get("spans") or []:
        if sp["end_us"] > sp["start_us"]:
            lanes.setdefault(sp["stream"], []).append(sp)
    found = []
    for lane, spans in lanes.items():
        spans.sort(key=lambda sp: (sp["start_us"], -sp["end_us"]))
        for a, b in zip(spans, spans[1:], strict=False):  # each span with the next to start
            held = a["kind"] == "replay" and b["end_us"] <= a["end_us"] + tolerance_us
            if b["start_us"] < a["end_us"] - tolerance_us and not held:
                found.append((lane, a["name"], b["name"]))
    return found


def test_overlapping_finds_two_streams_drawn_as_one_lane_and_nothing_else():
    copy = {"stream": "load", "name": "H2D k[L0]", "kind": "copy", "start_us": 10.0, "end_us": 30.0}
    replay = {"stream": "load", "name": "replay graph 7", "kind": "replay", "start_us": 20.0, "end_us": 90.0}
    inside = {"stream": "forward", "name": "L0 attention reads k", "kind": "kernel", "start_us": 30.0, "end_us": 40.0}
    assert overlapping({"spans": [copy, replay]}) == [("load", "H2D k[L0]", "replay graph 7")]
    assert overlapping({"spans": [{**copy, "stream": "forward"}, replay]}) == []  # two lanes
    assert overlapping({"spans": [{**replay, "stream": "forward"}, inside]}) == []  # the replay's own read
    record = {"stream": "load", "name": "record e1", "kind": "record", "start_us": 25.0, "end_us": 25.0}
    assert overlapping({"spans": [copy, record]}) == []  # a record takes no time


@pytest.mark.parametrize("run", [pytest.param(p, id=p.name) for p in sorted(SAMPLES.glob("*-h200"))])
def test_a_samples_timelines_draw_each_stream_on_a_lane_of_its_own(run):
    doc = load(run / "results.json")
    merged = {e["name"]: found[:2] for e in doc["scenarios"] if (found := overlapping(e.get("timeline") or {}))}
    assert not merged, (f"{run.name}: {len(merged)} timelines draw two streams on one lane, "
                        f"e.g. {list(merged.items())[:2]}")
