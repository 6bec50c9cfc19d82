"""The default scenario set end to end on the CPU simulator: every expectation met."""

import pytest

from harness.devices.sim import SimDevice
from harness.input.scenario_file import default_files, load_files
from harness.run.pipeline import run_scenario

# The scenarios the simulator runs: the natural set's serving shapes are for GPUs (devices = ["cuda"]).
DEFAULT = [s for s in load_files(default_files()) if s.runs_on("sim")]


@pytest.mark.parametrize("scenario", DEFAULT, ids=[s.name for s in DEFAULT])
def test_default_scenario_on_the_simulator(scenario):
    r = run_scenario(scenario, SimDevice(), replays=5)
    assert r.error is None, r.error
    assert r.observed == scenario.expect, dict(r.tally.layer_counts)
    if scenario.expect.value == "race":  # the race is total, not a fluke of one replay
        tally = r.sweep[-1].tally if r.sweep else r.tally  # a sweep: at its longest delay
        assert tally.stale_replays == tally.replays


def test_same_seed_same_verdicts_and_same_trace():
    scenario = next(s for s in DEFAULT if s.name == "hybrid-full-none")
    a, b = (run_scenario(scenario, SimDevice(), replays=3) for _ in range(2))
    assert a.tally == b.tally
    assert a.trace.ops == b.trace.ops and a.trace.stream_names == b.trace.stream_names
    assert a.findings == b.findings
