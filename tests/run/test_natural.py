"""Scenarios for one kind of device (`devices`): the natural set's serving shapes on the simulator
are skipped, and every front end says so. What they find is a GPU matter (make gpu-test)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# matplotlib, imported here and not first by the in-process pytester run below: pytester drops the
# modules a run imported, and a second copy of matplotlib's classes breaks every later plot of this
# process (report tests on the same xdist worker).
import harness.report.plots  # noqa: F401
from harness.frontends.cli import main
from harness.input.scenario_file import SCENARIO_DIR, default_files, load_file
from harness.records.scenario import shown_path
from tests.support.paths import ROOT

NATURAL = SCENARIO_DIR / "natural.toml"
TINY = (ROOT / "tests" / "data" / "tiny.toml").read_text()
pytest_plugins = ["pytester"]


@pytest.fixture
def mixed(tmp_path) -> Path:
    """The tiny file with its fenced scenario for GPUs only."""
    path = tmp_path / "mixed.toml"
    path.write_text(TINY.replace('fence = "final_event"\n', 'fence = "final_event"\ndevices = ["cuda"]\n'))
    return path


def test_run_on_the_simulator_skips_what_is_for_gpus_and_says_so(mixed, tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["run", str(mixed), "--device", "sim", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f'skipped 1 of {mixed}: they run only on cuda (devices = ["cuda"]), not on sim' in printed
    assert "1/1 scenarios met" in printed
    doc = json.loads((out / "results.json").read_text())
    assert [s["name"] for s in doc["scenarios"]] == ["tiny-full-none"]
    assert doc["skipped"] == [{"name": "tiny-full-final_event",
                               "why": f"runs only on cuda (devices in {mixed}), not on sim"}]
    summary = (out / "summary.md").read_text()
    first = summary.splitlines()[0]
    assert first.startswith("✅ **fence-harness: 1 of 1 met** · ") and first.endswith(" · 1 skipped on this device")
    assert f"**Skipped**: 1 scenario skipped: runs only on cuda (devices in {mixed}), not on sim." in summary
    assert "1 scenario skipped: runs only on cuda" in (out / "report.html").read_text()


def test_the_natural_set_alone_on_the_simulator_selects_nothing_and_exits_2(tmp_path, capsys):
    # A run that tests nothing is an error, never a green run: every scenario of the file is skipped here.
    out = tmp_path / "r"
    assert main(["run", str(NATURAL), "--device", "sim", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    # The file as messages name it: relative to the working directory (the checkout), never absolute.
    assert err == [f"fence-harness: {shown_path(str(NATURAL))}: devices: each of its {len(load_file(NATURAL))} "
                   f"selected scenarios runs only on cuda; none runs on sim"]
    assert not (out / "results.json").exists()


def test_repro_of_a_gpu_scenario_on_the_simulator_is_one_line_exit_2(capsys):
    assert main(["repro", "natural-mha8-2k-full-none", "--device", "sim"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    # repro reads the working directory's scenarios/ (this checkout's), the file it names is that one.
    natural = next(p for p in default_files() if p.name == "natural.toml")
    shown = shown_path(str(natural))
    assert err == [f"fence-harness: {shown}: scenario 'natural-mha8-2k-full-none': runs only on cuda "
                   f"(devices in {shown}), not on sim"] and not shown.startswith("/")


def test_the_strategy_check_leaves_out_what_runs_on_one_device_only():
    from harness.frontends.fence_commands import race_scenarios

    names = {s.name for s in race_scenarios()}
    assert names and not any(n.startswith("natural-") for n in names)


def test_pytest_items_of_gpu_scenarios_are_skipped_on_the_simulator_with_the_reason(pytester, mixed):
    result = pytester.runpytest("-p", "harness.frontends.pytest_plugin", "-p", "no:cacheprovider",
                                "--harness-device", "sim", "--harness-scenarios", str(mixed), "-rs",
                                "--harness-report", "out")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*SKIPPED*runs only on cuda (devices in *mixed.toml), not on sim*"])
    doc = json.loads((pytester.path / "out" / "results.json").read_text())
    assert [s["name"] for s in doc["scenarios"]] == ["tiny-full-none"]
    assert doc["skipped"] == [{"name": "tiny-full-final_event",
                               "why": f"runs only on cuda (devices in {mixed}), not on sim"}]


def test_merged_worker_parts_keep_what_each_skipped():
    from harness.frontends.gpu_workers import merge

    base = {"schema_version": 1, "git_commit": None, "started": "a", "finished": "b", "command": [],
            "environment": {"device": "sim"}, "scenarios": []}
    parts = [{**base, "worker": "gw0", "gpu_uuid": None, "skipped": [{"name": "b", "why": "gpu only"}]},
             {**base, "worker": "gw1", "gpu_uuid": None, "skipped": [{"name": "a", "why": "gpu only"}]}]
    assert merge(parts, order=["a", "b"])["skipped"] == [{"name": "a", "why": "gpu only"},
                                                         {"name": "b", "why": "gpu only"}]


def test_the_write_back_fork_under_pressure_is_the_kill_matrix_pair_for_gpus_only(tmp_path, capsys):
    """sgl-project/sglang#38300's pressure variant: the kill matrix's pair with the pressure fault in
    place of the gate, the unjoined fork a race with no data evidence demanded,
    the joined twin clean; the simulator, which models no contention, skips both and says why."""
    natural = {s.name: s for s in load_file(NATURAL)}
    matrix = {s.name: s for s in load_file(SCENARIO_DIR / "mutants" / "kill_matrix.toml")}
    twins = {"natural-hybrid-384-pressure-forward_over_backup-no_ack_wait": "mutant.forward_overtakes_backup",
             "natural-hybrid-384-pressure-forward_over_backup-joined": "correct.forward_overtakes_backup.joined"}
    for name, twin in twins.items():
        s, m = natural[name], matrix[twin]
        assert (s.model, s.batch, s.backend, s.fence, s.hazard, s.transfer, s.expect) == (
            m.model, m.batch, m.backend, m.fence, m.hazard, m.transfer, m.expect)
        assert (s.fault.kind, m.fault.kind, s.pace, s.evidence) == ("pressure", "gate", m.pace, None)
        assert s.skip_reason("sim") == f"runs only on cuda (devices in {shown_path(str(NATURAL))}), not on sim"
    assert main(["run", str(NATURAL), "-k", "forward_over_backup", "--device", "sim", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (f"fence-harness: {shown_path(str(NATURAL))}: devices: each of its 2 "
                                               "selected scenarios runs only on cuda; none runs on sim")
