"""What results.json records of a scenario's definition."""

from __future__ import annotations

import dataclasses

from harness.report.results import definition
from tests.support.builders import small_scenario
from tests.support.paths import ROOT


def test_a_definition_names_its_scenario_file_relative_to_the_working_directory(monkeypatch):
    s = dataclasses.replace(small_scenario(), source=str(ROOT / "scenarios" / "default.toml"))
    monkeypatch.chdir(ROOT)
    assert definition(s)["source"] == "scenarios/default.toml"
    assert definition(dataclasses.replace(s, source=None))["source"] is None  # built in code: no file
