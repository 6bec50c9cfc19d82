"""Release ranges to expectations (harness.records.releases), and the scenario key that holds them."""

from __future__ import annotations

import pytest

from harness.input.scenario_file import load_file
from harness.records.errors import InputError
from harness.records.releases import ReleaseExpectations
from harness.records.scenario import Expect

RANGES = ReleaseExpectations.parse({"<0.5.23": "race", ">=0.5.23": "clean"})


@pytest.mark.parametrize("version, expect", [
    ("0.5.20", Expect.RACE), ("0.5.22", Expect.RACE), ("0.5.23", Expect.CLEAN),
    ("0.5.24", Expect.CLEAN), ("0.6.0", Expect.CLEAN), ("0.5.23.post1", Expect.CLEAN),
])
def test_a_release_gets_the_expectation_of_its_range(version, expect):
    assert RANGES.expect_for(version) is expect


def test_a_release_outside_every_range_or_in_two_has_none():
    with pytest.raises(ValueError, match="no range covers it"):
        ReleaseExpectations.parse({">=0.5.20,<0.5.23": "race"}).expect_for("0.5.19")
    with pytest.raises(ValueError, match="2 ranges cover it"):
        ReleaseExpectations.parse({">=0.5": "race", ">=0.5.23": "clean"}).expect_for("0.5.23")


@pytest.mark.parametrize("table, message", [
    ({"0.5.x": "race"}, "is not a version range"),
    ({">=0.5": "stale"}, "valid: race, clean"),
    ({}, "no ranges"),
])
def test_bad_ranges_say_what_would_be_valid(table, message):
    with pytest.raises(ValueError, match=message):
        ReleaseExpectations.parse(table)


def test_the_key_needs_an_engine(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text("""
[[scenario]]
name = "s"
model = { layers = "A", hidden = 32, heads = 2, kv_heads = 1, head_dim = 16 }
batch = [{ prefix = 8, new = 2 }]
backend = "full"
expect_by_release = { ">=0" = "race" }
""")
    with pytest.raises(InputError) as e:
        load_file(path)
    assert e.value.key == "scenario[0].expect_by_release" and "needs an engine" in e.value.message
