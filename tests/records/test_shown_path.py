"""How a scenario file's path shows in messages and reports: never a folder of the machine."""

from pathlib import Path

from harness.records.scenario import shown_path


def test_a_file_under_the_working_directory_is_relative_to_it(tmp_path):
    f = tmp_path / "scenarios" / "mine.toml"
    assert shown_path(str(f), cwd=tmp_path) == "scenarios/mine.toml"


def test_a_bundled_file_of_an_installed_package_shows_from_the_package_name(tmp_path):
    installed = "/opt/venv/lib/python3.11/site-packages/harness/scenarios/natural.toml"
    assert shown_path(installed, cwd=tmp_path) == "harness/scenarios/natural.toml"
    assert shown_path("/usr/lib/python3/dist-packages/harness/scenarios/x.toml",
                      cwd=tmp_path) == "harness/scenarios/x.toml"


def test_a_relative_path_and_a_path_elsewhere_stay_as_given(tmp_path):
    assert shown_path("scenarios/default.toml", cwd=tmp_path) == "scenarios/default.toml"
    elsewhere = str(Path("/srv/ci/sets/race.toml"))
    assert shown_path(elsewhere, cwd=tmp_path) == elsewhere
