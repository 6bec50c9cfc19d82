"""The CLI console: rich progress and table on a terminal, plain lines anywhere else; slow rates
keep a decimal, and a long scenario name widens the plain columns rather than shifting them."""

from __future__ import annotations

import dataclasses
import io

import pytest

import harness.frontends.console
from harness.devices import open_device
from harness.frontends.console import NAME_WIDTH, RunConsole, plain_line, rate, results_table
from harness.input.scenario_file import parse_text
from harness.run.pipeline import ScenarioResult, run_scenario
from tests.support.paths import DATA

# The plugin tests' scenarios, the fenced one expecting a race: one line of each kind.
TINY = (DATA / "tiny_attention.toml").read_text().replace(
    'fence = "final_event"\nexpect = "clean"', 'fence = "final_event"\nexpect = "race"')


@pytest.fixture(scope="module")
def results():
    dev = open_device("sim")
    done = [run_scenario(s, dev) for s in parse_text(TINY, "tiny.toml")]
    broken = ScenarioResult(done[0].scenario, error="replay 3 did not finish within 30 s [timeout]")
    return done + [broken]


def drive(console: RunConsole, results) -> None:
    console.start(len(results), "sim", [r.scenario.name for r in results])
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


def slow(r: ScenarioResult, replays_per_s: float) -> ScenarioResult:
    """The same result, as if its replays had run at this rate (a long scenario on a slow device)."""
    return dataclasses.replace(r, replay_s=r.tally.replays / replays_per_s)


@pytest.mark.parametrize("replays_per_s,shown", [(0.4, "0.4"), (0.04, "0.04"), (2.4, "2"), (205.3, "205")])
def test_a_rate_below_one_keeps_a_decimal(results, replays_per_s, shown):
    r = slow(results[0], replays_per_s)
    assert rate(r.replays_per_s) == shown
    assert plain_line(r).endswith(f" {shown} replays/s")
    out = io.StringIO()
    console = RunConsole(out, force_terminal=True)
    console.console.width = 200
    drive(console, [r])
    lines = out.getvalue().splitlines()
    assert any(line.endswith(f" {shown} replays/s") for line in lines)  # the live line
    table_row = next(line for line in lines if "tiny-full-none" in line and "replays/s" not in line and "5/5" in line)
    assert table_row.rstrip().endswith(f" {shown}")


def test_a_long_name_widens_the_plain_columns_of_the_whole_run(results):
    long_name = "a-scenario-name-much-longer-than-the-thirty-four-columns-of-the-line"
    renamed = dataclasses.replace(results[0], scenario=results[0].scenario.with_overrides(name=long_name))
    run = [results[0], renamed, results[1]]
    out = io.StringIO()
    drive(RunConsole(out), run)
    lines = out.getvalue().splitlines()[1:4]
    assert long_name in lines[1]  # never cut
    columns = {line.index(" expected ") for line in lines}
    assert len(columns) == 1 and columns.pop() == len("ok   ") + len(long_name)
    assert len({line.index(" replays/s") for line in lines}) == 1


def test_a_run_of_short_names_keeps_the_default_width(results):
    out = io.StringIO()
    drive(RunConsole(out), results[:2])
    first = out.getvalue().splitlines()[1]
    assert first.index(" expected ") == len("ok   ") + NAME_WIDTH
