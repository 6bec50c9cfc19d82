"""A run's recorded command line names no folder of the machine that made it."""

from __future__ import annotations

from pathlib import Path

from harness.report.results import command_line


def test_the_program_by_its_name_and_paths_under_the_working_directory_relative(tmp_path):
    here = tmp_path / "repo"
    argv = [str(here / "harness" / "__main__.py"), "run", str(here / "scenarios" / "default.toml"),
            "--out", str(here / "reports" / "x"), f"--harness-report={here / 'r'}", "-k", "gate", "/elsewhere/f.toml"]
    assert command_line(argv, here) == ["fence-harness", "run", "scenarios/default.toml", "--out", "reports/x",
                                        "--harness-report=r", "-k", "gate", "/elsewhere/f.toml"]


def test_pytest_and_a_console_script_are_named_so():
    assert command_line(["/opt/v/lib/python3.12/site-packages/pytest/__main__.py", "-q"], Path("/"))[0] == "pytest"
    assert command_line(["/usr/local/bin/fence-harness", "run"], Path("/"))[0] == "fence-harness"
