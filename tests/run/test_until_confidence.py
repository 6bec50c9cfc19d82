"""run --until-confidence W: replays past each scenario's count until its stale rate's 95% interval is
narrower than W, or the cap; on the simulator, where the tiny scenarios race in every replay or none."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from harness.devices.sim import SimDevice
from harness.frontends.cli import main
from harness.input.scenario_file import parse_text
from harness.records.rates import Until
from harness.records.scenario import Fault, FaultKind
from harness.run.pipeline import run_scenario
from tests.support.paths import ROOT

TINY_TEXT = (ROOT / "tests" / "data" / "tiny.toml").read_text()
# At k = 0 or k = n the interval's width is 1 - 0.025^(1/n): narrower than 0.1 from n = 36.
NEEDED_AT_01 = math.ceil(math.log(0.025) / math.log(0.9))


@pytest.fixture
def tiny(tmp_path) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY_TEXT)
    return path


def _run(tiny: Path, out: Path, *extra: str) -> tuple[int, dict]:
    code = main(["run", str(tiny), "--device", "sim", "--out", str(out), *extra])
    return code, json.loads((out / "results.json").read_text())


def test_it_replays_until_the_interval_is_narrow_enough(tiny, tmp_path, capsys):
    assert NEEDED_AT_01 == 36
    code, doc = _run(tiny, tmp_path / "r", "--replays", "5", "--until-confidence", "0.1")
    assert code == 0
    for s in doc["scenarios"]:  # one races in every replay, the other in none: both need 36
        assert s["replays"] == 36, s["name"]
        c = s["confidence"]
        assert c["reached"] and c["width"] < 0.1 <= 1 - 0.025 ** (1 / 35)
        assert (c["target_width"], c["cap"], c["level"]) == (0.1, 10_000, 0.95)
    assert "note:" not in capsys.readouterr().out
    summary = (tmp_path / "r" / "summary.md").read_text()
    assert ("**Until confidence**: replayed until each stale rate's 95% interval was narrower than 0.1, at most "
            "10,000 replays: 2 of 2 got there") in summary


def test_at_the_cap_it_stops_says_so_and_the_verdict_stands(tiny, tmp_path, capsys):
    code, doc = _run(tiny, tmp_path / "r", "--replays", "5", "--until-confidence", "0.01", "--max-replays", "40")
    assert code == 0  # the expectations are met: too wide an interval is said, not failed
    assert [s["replays"] for s in doc["scenarios"]] == [40, 40]
    assert all(not s["confidence"]["reached"] and s["met"] for s in doc["scenarios"])
    printed = capsys.readouterr().out
    width = 1 - 0.025 ** (1 / 40)
    assert (f"note: tiny-full-none: 95% interval still {width:.3f} wide at the cap of 40 replays (asked for "
            f"< 0.01); the verdict stands on the replays made") in printed
    summary = (tmp_path / "r" / "summary.md").read_text()
    assert "0 of 2 got there; at the cap: tiny-full-none, tiny-full-final_event" in summary


def test_a_scenarios_own_replays_always_run(tiny, tmp_path):
    _, doc = _run(tiny, tmp_path / "r", "--replays", "50", "--until-confidence", "0.5")
    assert [s["replays"] for s in doc["scenarios"]] == [50, 50]


def test_without_it_nothing_changes(tiny, tmp_path):
    _, doc = _run(tiny, tmp_path / "r")
    assert [s["replays"] for s in doc["scenarios"]] == [3, 3] and all(s["confidence"] is None
                                                                    for s in doc["scenarios"])


def test_each_sweep_point_gets_there():
    fenced = next(s for s in parse_text(TINY_TEXT, "tiny.toml") if s.fence == "final_event")
    sweep = fenced.with_overrides(fault=Fault(FaultKind.SWEEP, points=(0.0, 500.0)))
    r = run_scenario(sweep, SimDevice(), replays=3, until=Until(0.1, 1000))
    assert [p.tally.replays for p in r.sweep] == [36, 36] and r.tally.replays == 72 and r.confident


def test_a_cap_without_a_width_is_one_line_exit_2(tiny, tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["run", str(tiny), "--device", "sim", "--out", str(out), "--max-replays", "50"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["fence-harness: --max-replays: caps --until-confidence; give --until-confidence W too"]
    assert not out.exists()


@pytest.mark.parametrize("value,needle", [
    ("0", "expected an interval width between 0 and 1 (exclusive), got 0"),
    ("1.5", "expected an interval width between 0 and 1 (exclusive), got 1.5"),
    ("wide", "expected an interval width between 0 and 1, like 0.05, got 'wide'"),
])
def test_a_bad_width_is_a_usage_error(tiny, tmp_path, capsys, value, needle):
    with pytest.raises(SystemExit) as stop:
        main(["run", str(tiny), "--device", "sim", "--out", str(tmp_path / "r"), "--until-confidence", value])
    assert stop.value.code == 2 and needle in capsys.readouterr().err


@pytest.mark.parametrize("width", [0.5, 0.2, 0.1, 0.05, 0.01])
def test_the_fewest_replays_that_can_be_narrow_enough_are_scipys(width):
    from harness.records.rates import Rate

    n = Until(width, 10_000).fewest
    assert Rate(0, n).width() < width <= Rate(0, n - 1).width()
    assert Rate(n, n).width() < width
