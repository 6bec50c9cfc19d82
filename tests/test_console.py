"""The CLI console: rich progress and table on a terminal, plain lines anywhere else."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

import harness.frontends.console
from harness.devices import open_device
from harness.frontends.console import RunConsole, plain_line, results_table
from harness.run.pipeline import ScenarioResult, run_scenario
from harness.run.scenario_file import parse_text

# The plugin tests' scenarios, the fenced one expecting a race: one line of each kind.
TINY = (Path(__file__).parent / "data" / "tiny_attention.toml").read_text().replace(
    'fence = "final_event"\nexpect = "clean"', 'fence = "final_event"\nexpect = "race"')


@pytest.fixture(scope="module")
def results():
    dev = open_device("sim")
    done = [run_scenario(s, dev) for s in parse_text(TINY, "tiny.toml")]
    broken = ScenarioResult(done[0].scenario, error="replay 3 did not finish within 30 s [timeout]")
    return done + [broken]


def drive(console: RunConsole, results) -> None:
    console.start(len(results), "sim")
    for r in results:
        console.scenario_done(r)
    console.finish(results, "reports/results.json")


def test_plain_lines_when_not_a_terminal(results):
    out = io.StringIO()
    console = RunConsole(out)
    assert not console.live
    drive(console, results)
    text = out.getvalue()
    assert "\x1b[" not in text and "━" not in text  # no colour codes, no bar
    lines = text.splitlines()
    assert lines[0] == "device: sim  scenarios: 3"
    assert lines[1] == plain_line(results[0])
    assert lines[1].startswith("ok   tiny-full-none") and "observed race" in lines[1]
    assert lines[2].startswith("FAIL tiny-full-final_event") and "observed clean" in lines[2]
    assert lines[3].startswith("FAIL tiny-full-none") and "error: replay 3 did not finish" in lines[3]
    assert lines[4] == "1/3 scenarios met their expectation; results: reports/results.json"
    assert len(lines) == 5


def test_rich_progress_and_table_on_a_terminal(results):
    out = io.StringIO()
    console = RunConsole(out, force_terminal=True)
    assert console.live
    console.console.width = 160  # a StringIO has no width of its own
    drive(console, results)
    text = out.getvalue()
    assert "\x1b[" in text  # coloured
    for header in ("scenario", "expected", "observed", "stale", "layers", "findings", "replays/s"):
        assert header in text
    assert "5/5 100%" in text and "0/5 0%" in text
    assert "[timeout]" in text  # an error message's brackets are text, not markup
    assert "1/3 scenarios met their expectation" in text


def test_the_plain_console_follows_sys_stdout(results, capsys):
    console = RunConsole()  # no file: whatever sys.stdout is when it prints
    console.start(1, "sim")
    console.scenario_done(results[0])
    assert capsys.readouterr().out.splitlines() == ["device: sim  scenarios: 1", plain_line(results[0])]


def test_status_column_and_notes(results):
    out = io.StringIO()
    console = RunConsole(out)
    console.scenario_done(results[0], status="killed  ")
    console.note("gate: host-released spin")
    console.stop()
    assert out.getvalue().splitlines() == [
        plain_line(results[0], "killed  "), "     note: gate: host-released spin"]
    assert out.getvalue().startswith("killed   tiny-full-none")


def test_without_rich_it_prints_plain_lines_even_on_a_terminal(results, monkeypatch):
    monkeypatch.setattr(harness.frontends.console, "Console", None)  # a GPU runner's Python without rich
    out = io.StringIO()
    console = RunConsole(out, force_terminal=True)
    assert not console.live
    drive(console, results)
    assert out.getvalue().splitlines()[-1].startswith("1/3 scenarios met")


def test_the_table_keeps_every_column_in_80_columns(results):
    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=80).print(results_table(results))
    header = next(line for line in out.getvalue().splitlines() if "scenario" in line)
    assert header.split() == ["scenario", "expected", "observed", "stale", "layers", "findings", "replays/s"]
    assert "tiny-full-final_event" in out.getvalue()  # names are never cut
