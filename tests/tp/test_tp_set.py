"""scenarios/tp.toml on the simulator, as `fence-harness run` and `mutants` run it."""

import pytest

from harness.devices.sim import SimDevice
from harness.frontends.console import plain_line
from harness.input.scenario_file import SCENARIO_DIR, load_file
from harness.run.mutants import Outcome, classify
from harness.run.pipeline import run_scenario

SET = {s.name: s for s in load_file(SCENARIO_DIR / "tp.toml")}
REPLAYS = 4


@pytest.mark.parametrize("name", list(SET))
def test_every_tp_scenario_meets_its_expectation_and_says_where_the_stale_data_went(name):
    r = run_scenario(SET[name], SimDevice(), replays=REPLAYS)
    assert r.error is None and r.met, r.verdict.describe()
    line = plain_line(r)
    if SET[name].expect.value == "race":
        assert r.tally.stale_replays == REPLAYS
        assert line.endswith("tp 2: stale reads on rank 1; carried to ranks 0,1 through the all-reduce")
        assert classify(r).outcome is Outcome.KILLED
    else:
        assert line.endswith("tp 2: no stale reads on any rank")


def test_the_clean_scenario_without_its_fence_races():
    fixed = SET["correct.tp2.final_event_every_rank.gate-rank1"]
    r = run_scenario(fixed.with_overrides(fence="none"), SimDevice(), replays=REPLAYS)
    assert r.error is None and not r.met and r.tally.stale_replays == REPLAYS
    assert classify(r).outcome is Outcome.FLAGGED


def test_the_reports_say_where_the_stale_data_went(tmp_path):
    # summary.md and report.html carry the cross-rank verdict the console line gives.
    from harness.frontends.cli import main

    out = tmp_path / "r"
    assert main(["run", str(SCENARIO_DIR / "tp.toml"), "--device", "sim", "-k", "gate-rank1 and none",
                 "--replays", "3", "--out", str(out)]) == 0
    summary = (out / "summary.md").read_text()
    line = next(x for x in summary.splitlines() if x.startswith("| tp2.gate-rank1.full-none "))
    assert ("race (data, analysis, graph); tp 2: stale reads on rank 1; carried to ranks 0,1 "
            "through the all-reduce") in line
    assert "tp 2: stale reads on rank 1; carried to ranks 0,1" in (out / "report.html").read_text()
