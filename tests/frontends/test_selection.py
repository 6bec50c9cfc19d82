"""What a command runs when given no files, -k, --version and --json: a run that selected nothing is
exit 2 with one line, never a pass."""

from __future__ import annotations

import json
import shutil

import pytest

from harness import __version__
from harness.frontends.cli import main
from harness.input.scenario_file import SCENARIO_DIR, bundled_files, default_files, default_mutant_files
from harness.records.plugin_api import API_VERSION
from tests.support.paths import DATA, ROOT


def test_with_no_files_a_project_runs_its_own_scenarios_else_the_bundled_set(tmp_path):
    assert default_files(cwd=tmp_path) == bundled_files() and bundled_files()
    assert {p.name for p in bundled_files()} == {p.name for p in (ROOT / "scenarios").glob("*.toml")}
    (tmp_path / "scenarios").mkdir()
    shutil.copy(DATA / "tiny.toml", tmp_path / "scenarios" / "mine.toml")
    assert default_files(cwd=tmp_path) == [tmp_path / "scenarios" / "mine.toml"]
    assert default_mutant_files(cwd=tmp_path) == bundled_files("mutants")  # no mutants of its own


def test_the_bundled_set_is_the_checkouts(tmp_path):
    assert SCENARIO_DIR.resolve() == (ROOT / "scenarios").resolve()


def test_repro_in_a_project_looks_in_its_own_files(tmp_path, monkeypatch, capsys):
    (tmp_path / "scenarios").mkdir()
    shutil.copy(DATA / "tiny.toml", tmp_path / "scenarios" / "mine.toml")
    monkeypatch.chdir(tmp_path)
    assert main(["repro", "attention-full-none", "--device", "sim"]) == 2
    err = capsys.readouterr().err
    assert "no scenario 'attention-full-none'" in err and "attention-full-none," not in err


def test_version_names_the_package_and_the_plugin_api(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"fence-harness {__version__} (plugin API {API_VERSION})"


@pytest.mark.parametrize("command", ["run", "mutants"])
def test_a_filter_that_matches_nothing_is_exit_2(command, tmp_path, capsys):
    assert main([command, "--device", "sim", "-k", "nothing-like-this", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "-k: 'nothing-like-this' matches none of the" in err
    assert not (tmp_path / "results.json").exists()


def test_a_file_whose_scenarios_the_device_skips_is_exit_2(tmp_path, capsys):
    natural = ROOT / "scenarios" / "natural.toml"
    assert main(["run", str(natural), "--device", "sim", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "runs only on cuda; none runs on sim" in err and "natural.toml" in err


def test_k_selects_by_name(tmp_path, capsys):
    assert main(["run", str(DATA / "tiny.toml"), "--device", "sim", "--replays", "2", "-k", "final_event",
                 "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "results.json").read_text())
    assert [s["name"] for s in doc["scenarios"]] and all("final_event" in s["name"] for s in doc["scenarios"])


def test_json_is_the_only_thing_on_stdout(tmp_path, capsys):
    rc = main(["run", str(DATA / "tiny.toml"), "--device", "sim", "--replays", "2", "--json", "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    doc = json.loads(out)  # the whole of stdout is one document
    assert doc["exit_code"] == rc == 0 and doc["scenarios"] == doc["met"] == len(doc["items"]) > 0
    assert doc["results"] == str(tmp_path / "results.json") and "scenarios met their expectation" in err


def test_json_says_why_a_command_failed(tmp_path, capsys):
    assert main(["run", "--device", "sim", "-k", "nothing-like-this", "--json", "--out", str(tmp_path)]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["exit_code"] == 2 and "matches none" in doc["error"]
