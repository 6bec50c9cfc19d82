"""The simulator agrees with a real GPU on every shared scenario.

tests/data/gpu_verdicts.json is the results.json of
`fence-harness run scenarios/fidelity/shared.toml --device cuda` on an H200.
For each scenario in it, the simulator must reach the same verdict (race or
clean) and, for a race, find the same set of stale layers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.devices.sim import SimDevice
from harness.run.pipeline import run_scenario
from harness.report.results import as_plain
from harness.run.scenario_file import load_file

ROOT = Path(__file__).resolve().parent.parent
VERDICTS = json.loads((ROOT / "tests" / "data" / "gpu_verdicts.json").read_text())
SHARED = {s.name: s for s in load_file(ROOT / "scenarios" / "fidelity" / "shared.toml")}
ENTRIES = VERDICTS["scenarios"]


def _definition(d: dict) -> dict:
    # Unset optional fields (null) compare equal to fields an older record does not have.
    return {k: v for k, v in d.items() if k != "source" and v is not None}


def test_the_verdicts_come_from_a_gpu_and_cover_every_shared_scenario():
    env = VERDICTS["environment"]
    assert env["device"] == "cuda" and env["gpu"] and env["torch"]
    assert {e["name"] for e in ENTRIES} == set(SHARED)
    assert all(e["error"] is None and e["replays"] >= 100 for e in ENTRIES)


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["name"] for e in ENTRIES])
def test_simulator_agrees_with_the_gpu(entry):
    scenario = SHARED[entry["name"]]
    # The GPU ran this very scenario, not an older version of it.
    assert _definition(as_plain(scenario)) == _definition(entry["definition"])
    r = run_scenario(scenario, SimDevice(), replays=3)
    assert r.error is None, r.error
    assert r.observed.value == entry["observed"]
    if entry["observed"] == "race":
        assert {str(layer) for layer in r.tally.layer_counts} == set(entry["stale_layers"])
