"""`report` and `compare` subcommands: files written, exit codes 0 / 1 / 2, one-line errors."""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import sys
from pathlib import Path

import pytest

from harness.frontends.report_commands import add_commands, append_step_summary, write_all
from harness.records.errors import HarnessError
from tests.support.paths import ROOT

SAMPLE = ROOT / "tests" / "data" / "report" / "results-h200-core.json"
FULL = ROOT / "tests" / "data" / "report" / "results-full.json"


def cli(argv: list[str]) -> int:
    """The main CLI's dispatch, on a parser holding only the report commands."""
    parser = argparse.ArgumentParser(prog="fence-harness")
    handlers = add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    assert args.fn is handlers[args.command]
    try:
        return args.fn(args)
    except HarnessError as e:
        print(f"fence-harness: {e}", file=sys.stderr)
        return e.exit_code


def write(path: Path, doc: dict) -> Path:
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture
def pair(tmp_path):
    """(new, baseline) paths holding the fixture, for tests to edit the new one."""
    doc = json.loads(FULL.read_text())
    return doc, write(tmp_path / "new.json", doc), write(tmp_path / "baseline.json", doc)


def test_report_writes_next_to_the_results(tmp_path, capsys):
    results = write(tmp_path / "results.json", json.loads(FULL.read_text()))
    assert cli(["report", str(results)]) == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["report.html", "results.json", "summary.md", "timeline-attention-full-final_event.json",
                     "timeline-attention-full-none.json", "timeline-hybrid-full-none.json"]
    assert capsys.readouterr().out.splitlines()[0] == str(tmp_path / "summary.md")


def test_report_out_elsewhere(tmp_path):
    assert cli(["report", str(SAMPLE), "--out", str(tmp_path / "r")]) == 0
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["report.html", "summary.md"]


@pytest.mark.parametrize("command", ["report", "compare"])
def test_a_corrupt_file_exits_2_with_one_line(tmp_path, capsys, command):
    bad = tmp_path / "results.json"
    bad.write_text('{"schema_version": 1, "scenarios": [')
    argv = ["report", str(bad)] if command == "report" else ["compare", str(FULL), str(bad)]
    assert cli(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"fence-harness: {bad}: not valid JSON")
    assert not (tmp_path / "report.html").exists()


def test_a_baseline_of_another_schema_exits_2(pair, capsys):
    doc, new, baseline = pair
    write(baseline, {**doc, "schema_version": 2})
    assert cli(["compare", str(new), str(baseline)]) == 2
    assert f"{baseline}: schema_version: expected 1, got 2" in capsys.readouterr().err


def test_compare_same_run_exits_0(pair, capsys):
    _, new, baseline = pair
    assert cli(["compare", str(new), str(baseline)]) == 0
    out = capsys.readouterr()
    assert out.out == "no regression\n" and out.err == ""


def test_compare_new_race_exits_1(pair, capsys):
    doc, new, baseline = pair
    doc = copy.deepcopy(doc)
    doc["scenarios"][1].update(observed="race", met=False, stale_replays=1, stale_rate=0.005)
    write(new, doc)
    assert cli(["compare", str(new), str(baseline)]) == 1
    out = capsys.readouterr().out
    assert "new races (1):\n  attention-full-final_event: clean -> race" in out
    assert out.rstrip().endswith("REGRESSION")


def test_compare_cost_threshold_and_environment_warning(pair, capsys):
    doc, new, baseline = pair
    doc = copy.deepcopy(doc)
    doc["scenarios"][0]["timings"]["replays_per_s"] *= 0.8
    doc["environment"]["torch"] = "2.12.0+cu130"
    write(new, doc)
    assert cli(["compare", str(new), str(baseline), "--cost-threshold", "25"]) == 0
    assert cli(["compare", str(new), str(baseline), "--cost-threshold", "15"]) == 1
    captured = capsys.readouterr()
    assert "cost regressions (1):\n  attention-full-none: replays_per_s" in captured.out
    assert "warning: environment differs: torch 2.11.0+cu130 (baseline) vs 2.12.0+cu130 (new)" in captured.err


@pytest.mark.parametrize("value", ["-5", "abc", "nan"])
def test_a_bad_threshold_is_a_usage_error(value, capsys):
    with pytest.raises(SystemExit) as e:
        cli(["compare", str(FULL), str(FULL), "--cost-threshold", value])
    assert e.value.code == 2
    assert "--cost-threshold" in capsys.readouterr().err


def test_write_all_lists_what_it_wrote(tmp_path):
    paths = write_all(json.loads(SAMPLE.read_text()), tmp_path / "new" / "dir")
    assert [p.name for p in paths] == ["summary.md", "report.html"]
    assert all(p.is_file() for p in paths)


def test_step_summary_is_appended_when_github_sets_it(tmp_path, monkeypatch):
    summary = tmp_path / "summary.md"
    summary.write_text("| a | b |\n")
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    assert append_step_summary(summary) is False
    target = tmp_path / "step.md"
    target.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(target))
    assert append_step_summary(summary) is True
    assert target.read_text() == "earlier step\n| a | b |\n"


def test_an_unwritable_step_summary_is_a_warning(tmp_path, monkeypatch, capsys):
    summary = tmp_path / "summary.md"
    summary.write_text("x\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "no" / "such" / "dir" / "file"))
    assert append_step_summary(summary) is False
    assert "warning: step summary not written" in capsys.readouterr().err


def _main_has_report_commands() -> bool:
    from harness.frontends.cli import _parser

    with contextlib.redirect_stderr(io.StringIO()):
        try:
            _parser().parse_args(["compare", "a.json", "b.json"])
        except SystemExit:
            return False
    return True


def test_the_main_cli_runs_them(pair, tmp_path, capsys):
    if not _main_has_report_commands():
        pytest.skip("harness/cli.py does not register the report commands (add_commands) yet")
    from harness.frontends.cli import main

    doc, new, baseline = pair
    assert main(["compare", str(new), str(baseline)]) == 0
    write(new, {**doc, "scenarios": [{**doc["scenarios"][1], "observed": "race", "met": False},
                                     *doc["scenarios"][2:]]})
    assert main(["compare", str(new), str(baseline)]) == 1
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    assert main(["report", str(bad)]) == 2
    assert capsys.readouterr().err.strip().endswith("expected a JSON object, got []")


def test_compare_of_runs_that_share_nothing_exits_2_in_one_line(tmp_path, capsys):
    doc = json.loads(FULL.read_text())
    for s in doc["scenarios"]:
        s["name"] = "other-" + s["name"]
    doc["pairs"] = []
    other = tmp_path / "other.json"
    other.write_text(json.dumps(doc))
    assert cli(["compare", str(other), str(FULL)]) == 2
    out, err = capsys.readouterr()
    assert "no regression" not in out and err.count("\n") == 1 and "nothing was compared" in err
