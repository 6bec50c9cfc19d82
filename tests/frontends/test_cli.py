"""The command line: exit codes, one-line errors, results.json, on the CPU simulator."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.frontends.cli import main
from tests.support.paths import ROOT

BAD = ROOT / "tests" / "data" / "bad_scenarios"

TINY = (ROOT / "tests" / "data" / "tiny.toml").read_text()


@pytest.fixture
def tiny(tmp_path) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return path


def test_run_on_the_simulator_writes_results(tiny, tmp_path, capsys):
    out = tmp_path / "reports"
    assert main(["run", str(tiny), "--device", "sim", "--out", str(out)]) == 0
    doc = json.loads((out / "results.json").read_text())
    assert doc["schema_version"] == 1
    by_name = {s["name"]: s for s in doc["scenarios"]}
    assert by_name["tiny-full-none"]["observed"] == "race"
    assert by_name["tiny-full-none"]["stale_rate"] == 1.0
    assert by_name["tiny-full-final_event"]["stale_replays"] == 0
    assert "2/2 scenarios met" in capsys.readouterr().out


def test_unmet_expectation_exits_1(tiny, tmp_path):
    # The fence removed from a scenario that expects clean: the harness must say so.
    flipped = tmp_path / "flipped.toml"
    flipped.write_text(TINY.replace('fence = "final_event"\n', ""))
    assert main(["run", str(flipped), "--device", "sim", "--out", str(tmp_path / "r")]) == 1


BAD_FILES = sorted(p.name for p in BAD.glob("*.toml") if p.name != "EXPECTED.toml")


@pytest.mark.parametrize("name", BAD_FILES)
def test_every_bad_scenario_file_is_one_line_exit_2_and_no_report(name, tmp_path, capsys):
    out = tmp_path / "reports"
    assert main(["run", str(BAD / name), "--device", "sim", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and name in lines[0], captured.err
    assert not out.exists()


def test_bad_input_in_a_real_process_has_no_traceback(tmp_path):
    out = tmp_path / "reports"
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "run", str(BAD / "unknown_backend.toml"), "--out", str(out)],
        capture_output=True, text=True, cwd=ROOT,
    )
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert not out.exists()


def test_cuda_requested_without_cuda_is_exit_2(tiny, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["run", str(tiny), "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no CUDA device" in err


def test_auto_picks_the_simulator_without_cuda(tiny, tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["run", str(tiny), "--device", "auto", "--out", str(tmp_path)]) == 0
    assert "device: sim" in capsys.readouterr().out


def test_repro_prints_each_verdict_once_with_its_count_and_the_trace(tiny, capsys):
    assert main(["repro", "tiny-full-none", "--file", str(tiny), "--device", "sim", "--replays", "3"]) == 0
    out = capsys.readouterr().out
    assert "replay    0: STALE" in out and "replay    1:" not in out and "replays 1-2: the same (2 more)" in out
    assert "load: H2D copy -> k[L0" in out and "replay graph" in out
    # Every trace row is named for what runs it: no unnamed stream, a graph's ops by their graph.
    assert "stream" not in "\n".join(ln.split(":")[0] for ln in out.splitlines() if ln.startswith("  "))
    assert "      graph " in out


def test_repro_keeps_a_change_of_verdict_in_its_place(capsys):
    from harness.frontends.cli import _ReplayLines
    from harness.run.oracle import ReplayVerdict

    lines = _ReplayLines()
    clean, stale = ReplayVerdict(0, 8), ReplayVerdict(2, 8, 2, frozenset({1}), frozenset({"k"}))
    for i, v in enumerate([clean, clean, stale, clean, clean, clean]):
        lines.add(i, v)
    lines.flush()
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == ["replay    0: clean", "replay    1: the same"] and out[2].startswith("replay    2: STALE")
    assert out[3:] == ["replay    3: clean", "replays 4-5: the same (2 more)"]


def test_repro_unknown_name_suggests_and_exits_2(tiny, capsys):
    assert main(["repro", "tiny-full-nne", "--file", str(tiny), "--device", "sim"]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'tiny-full-none'" in err and len(err.strip().splitlines()) == 1


def test_sim_costs_are_set_from_the_command_line(tiny, tmp_path, capsys):
    # A host launch cost so high that every copy lands before the replay reads it:
    # the race no longer shows in the data; the analyser and the graph check still find it,
    # and the unfenced scenario still meets its expectation of a race, by that evidence alone.
    args = ["run", str(tiny), "--device", "sim", "--out", str(tmp_path), "--sim-cost", "launch_us=100000"]
    assert main(args) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "tiny-full-none" in ln)
    assert "observed race (analysis, graph)" in line and "stale     0/" in line


@pytest.mark.parametrize("setting", ["nope=1", "launch_us=-1", "launch_us=abc", "launch_us"])
def test_bad_sim_cost_is_one_line_exit_2(tiny, setting, capsys):
    assert main(["run", str(tiny), "--device", "sim", "--sim-cost", setting]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("fence-harness: --sim-cost")


def test_a_directory_as_input_is_one_line_that_suggests_its_files(tmp_path, capsys):
    assert main(["run", str(tmp_path), "--device", "sim", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"fence-harness: {tmp_path}: is a directory, not a scenario file; give its files: {tmp_path}/*.toml"


REPORT_FILES = {"results.json", "summary.md", "report.html"}


def test_fences_writes_the_report_next_to_its_results(tmp_path, monkeypatch, capsys):
    from harness.input.scenario_file import parse_text

    race = next(s for s in parse_text(TINY, "tiny.toml") if s.fence == "none")
    monkeypatch.setattr("harness.frontends.fence_commands.race_scenarios", lambda: [race])
    out = tmp_path / "fences"
    assert main(["fences", "--device", "sim", "--replays", "1", "--out", str(out)]) == 0
    assert REPORT_FILES <= {p.name for p in out.iterdir()}
    assert "tiny-full-none" in (out / "summary.md").read_text()


def test_bench_writes_the_report_next_to_its_results(tmp_path, monkeypatch):
    from harness.studies import fence_cost as benchmark

    monkeypatch.setattr(benchmark, "DEFAULT_POINT", benchmark.Point("attention", 2, 64, 4))
    out = tmp_path / "bench"
    args = ["bench", "--device", "sim", "--points", "default", "--repeats", "2", "--warmup", "1",
            "--arm", "final_event", "--out", str(out)]
    assert main(args) == 0
    assert REPORT_FILES <= {p.name for p in out.iterdir()}
    doc = json.loads((out / "results.json").read_text())
    assert [p["strategy"] for p in doc["bench"]["points"]] == ["final_event"]


def test_bench_without_points_runs_the_default_point_on_the_simulator(tmp_path, monkeypatch):
    from harness.studies import fence_cost as benchmark

    small = benchmark.Point("attention", 2, 64, 4)
    monkeypatch.setitem(benchmark.POINT_SETS, "default", lambda: [small])
    monkeypatch.setitem(benchmark.POINT_SETS, "sweep", lambda: pytest.fail("the sweep on the simulator"))
    out = tmp_path / "bench"
    assert main(["bench", "--device", "sim", "--repeats", "2", "--warmup", "1", "--arm", "final_event",
                 "--out", str(out)]) == 0
    doc = json.loads((out / "results.json").read_text())
    assert [(p["layers"], p["prefix"]) for p in doc["bench"]["points"]] == [(2, 64)]


def test_a_bench_point_too_large_for_the_device_ends_the_run_in_one_line_keeping_the_points_before(
        tmp_path, monkeypatch, capsys):
    from harness.devices.base import Memory
    from harness.devices.sim import SimDevice
    from harness.studies import fence_cost as benchmark

    monkeypatch.setitem(benchmark.POINT_SETS, "two", lambda: [benchmark.Point("attention", 2, 64, 4),
                                                              benchmark.Point("attention", 2, 128, 4)])
    gib = 2**30
    # Two readings a point: the first point's testbed takes 0.1 GiB, the second's 50 of 50 available.
    readings = iter([(1.0, 100), (1.1, 100), (1.0, 100), (51.0, 50)])
    monkeypatch.setattr(SimDevice, "memory",
                        lambda self: Memory("host memory", *(int(x * gib) for x in next(readings))))
    out = tmp_path / "bench"
    args = ["bench", "--device", "sim", "--points", "two", "--repeats", "2", "--warmup", "1",
            "--arm", "final_event", "--out", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "prefix 128" in err[0] and "50.0 GiB is available" in err[0], err
    doc = json.loads((out / "results.json").read_text())
    assert doc["partial"] is True and [p["prefix"] for p in doc["bench"]["points"]] == [64]


def test_a_bench_stopped_between_points_leaves_the_points_it_measured_marked_partial(tmp_path, monkeypatch):
    from harness.studies import fence_cost as benchmark

    monkeypatch.setitem(benchmark.POINT_SETS, "two", lambda: [benchmark.Point("attention", 2, 64, 4),
                                                              benchmark.Point("attention", 2, 128, 4)])
    measure = benchmark.bench_point
    calls = []

    def stopped_at_the_second(*args, **kwargs):
        calls.append(args[1])
        if len(calls) == 2:
            raise KeyboardInterrupt  # what SIGTERM becomes in the command line
        return measure(*args, **kwargs)

    monkeypatch.setattr(benchmark, "bench_point", stopped_at_the_second)
    out = tmp_path / "bench"
    args = ["bench", "--device", "sim", "--points", "two", "--repeats", "2", "--warmup", "1",
            "--arm", "final_event", "--out", str(out)]
    assert main(args) == 130
    doc = json.loads((out / "results.json").read_text())
    assert doc["partial"] is True and [p["prefix"] for p in doc["bench"]["points"]] == [64]
    monkeypatch.setattr(benchmark, "bench_point", measure)
    assert main(args) == 0  # run to the end: the same file, whole
    doc = json.loads((out / "results.json").read_text())
    assert "partial" not in doc and [p["prefix"] for p in doc["bench"]["points"]] == [64, 128]
