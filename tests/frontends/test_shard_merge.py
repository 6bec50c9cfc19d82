"""`run --shard K/N`, `mutants --shard K/N` and `fence-harness merge`, on the CPU simulator: two
shards run apart and merged give the verdicts of one unsharded run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.frontends.cli import main
from harness.input.shard import Shard
from tests.support.paths import DATA, ROOT

# tiny.toml's two scenarios fall in shard 1 of 2; the breakable pair splits across both shards,
# so the merge has to find a fenced / unfenced pair whose halves ran on two runners.
FOUR = (DATA / "tiny.toml").read_text() + '''
[[scenario]]
name = "tiny-breakable-none"
backend = "breakable"
expect = "clean"

[[scenario]]
name = "tiny-breakable-final_event"
backend = "breakable"
fence = "final_event"
expect = "clean"
'''
NAMES = ["tiny-full-none", "tiny-full-final_event", "tiny-breakable-none", "tiny-breakable-final_event"]


@pytest.fixture(scope="module")
def four(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("files") / "four.toml"
    path.write_text(FOUR)
    return path


@pytest.fixture(scope="module")
def runs(four, tmp_path_factory) -> Path:
    """One unsharded run of four.toml (whole/), and its two shards (s1/, s2/), run apart."""
    folder = tmp_path_factory.mktemp("runs")
    base = ["run", str(four), "--device", "sim", "--replays", "2"]
    assert main([*base, "--out", str(folder / "whole")]) == 0
    assert main([*base, "--shard", "1/2", "--out", str(folder / "s1")]) == 0
    assert main([*base, "--shard", "2/2", "--out", str(folder / "s2")]) == 0
    return folder


def _verdicts(doc: dict) -> list[tuple]:
    return [(e["name"], e["expect"], e["observed"], e["evidence"], e["met"], e["error"], e["stale_replays"],
             e["replays"], e["findings"]) for e in doc["scenarios"]]


def _read(folder: Path) -> dict:
    return json.loads((folder / "results.json").read_text())


def test_the_split_has_something_in_each_shard():
    # Else the merge below would test nothing of what it is for.
    assert [n for n in NAMES if Shard(2, 2).holds(n)] == ["tiny-breakable-final_event"]
    assert Shard(1, 2).holds("tiny-breakable-none")


def test_two_shards_merged_give_the_verdicts_of_one_unsharded_run(runs, tmp_path, capsys):
    s1, s2 = _read(runs / "s1"), _read(runs / "s2")
    assert (s1["shard"], s2["shard"]) == ("1/2", "2/2") and s1["shard_of"] == s2["shard_of"] == NAMES
    assert [e["name"] for e in s1["scenarios"]] == NAMES[:3] and [e["name"] for e in s2["scenarios"]] == NAMES[3:]
    # Folders or files, in any order.
    assert main(["merge", str(runs / "s2" / "results.json"), str(runs / "s1"), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "merged 2 runs (shards 1/2, 2/2 of 2): 4/4 scenarios met" in out
    merged, whole = _read(tmp_path), _read(runs / "whole")
    assert "shard" not in whole and _verdicts(merged) == _verdicts(whole)
    assert merged["summary"] == whole["summary"]
    assert [(p["a"], p["b"], p["p_value"]) for p in merged["pairs"]] == [
        (p["a"], p["b"], p["p_value"]) for p in whole["pairs"]]
    assert ("tiny-breakable-none", "tiny-breakable-final_event") in [(p["a"], p["b"]) for p in merged["pairs"]]
    assert merged["merge"]["complete"] and merged["merge"]["shards"] == ["1/2", "2/2"]
    for name in ("summary.md", "report.html", "timeline-tiny-full-none.json"):
        assert (tmp_path / name).is_file(), name


def test_a_missing_shard_or_a_failed_scenario_makes_the_merge_exit_1(runs, tmp_path, capsys):
    assert main(["merge", str(runs / "s1"), "--out", str(tmp_path / "half")]) == 1
    assert "shard 2/2 missing: the merged set is incomplete" in capsys.readouterr().err
    assert _read(tmp_path / "half")["merge"]["missing"] == ["2/2"]
    # Shard 2 as its runner would have written it had its scenario missed its expectation.
    failed = _read(runs / "s2")
    failed["scenarios"][0].update(met=False, observed="race", verdict="race (data)")
    (tmp_path / "s2").mkdir()
    (tmp_path / "s2" / "results.json").write_text(json.dumps(failed))
    assert main(["merge", str(runs / "s1"), str(tmp_path / "s2"), "--out", str(tmp_path / "m")]) == 1
    captured = capsys.readouterr()
    assert "FAIL tiny-breakable-final_event: expected clean, observed race (data)" in captured.out
    assert "missing" not in captured.err and _read(tmp_path / "m")["summary"]["met"] == 3


def test_merging_what_does_not_belong_together_is_one_line_exit_2(runs, tmp_path, capsys):
    s1 = runs / "s1" / "results.json"
    assert main(["merge", str(s1), str(s1), "--out", str(tmp_path / "m")]) == 2
    assert capsys.readouterr().err == f"fence-harness: {s1}: shard: 1/2 is {s1}'s shard too: give each shard once\n"
    assert main(["merge", str(s1), str(runs / "whole"), "--out", str(tmp_path / "m")]) == 2
    assert "shard: missing: a whole run, where" in capsys.readouterr().err
    assert main(["merge", str(tmp_path / "nowhere"), "--out", str(tmp_path / "m")]) == 2
    assert "nowhere: cannot read: No such file or directory" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def test_merge_imports_no_torch(runs, tmp_path):
    # The CI job that merges the GPU shards runs on a plain runner, with the dependencies but torch
    # (.github/workflows/gpu-gate.yml).
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "harness", "merge", str(runs / "s1"),
                           str(runs / "s2"), "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    modules = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
    assert "harness.report.merge" in modules and "torch" not in modules
    assert (tmp_path / "report.html").is_file()


def test_the_shards_of_a_kill_matrix_merge_into_one_matrix(four, tmp_path, capsys):
    # four.toml as a kill matrix, its breakable pair: one correct variant in each shard.
    for k in (1, 2):
        assert main(["mutants", str(four), "--device", "sim", "--replays", "1", "-k", "breakable",
                     "--shard", f"{k}/2", "--out", str(tmp_path / f"s{k}")]) == 0
    parts = [_read(tmp_path / f"s{k}") for k in (1, 2)]
    assert [p["shard"] for p in parts] == ["1/2", "2/2"]
    assert [[r["name"] for r in p["mutants"]["matrix"]] for p in parts] == [[n] for n in NAMES[2:]]
    capsys.readouterr()
    assert main(["merge", str(tmp_path / "s2"), str(tmp_path / "s1"), "--out", str(tmp_path / "m")]) == 0
    doc = _read(tmp_path / "m")
    assert [(r["name"], r["outcome"]) for r in doc["mutants"]["matrix"]] == [
        ("tiny-breakable-none", "clean"), ("tiny-breakable-final_event", "clean")]
    summary = (tmp_path / "m" / "summary.md").read_text()
    assert "tiny-breakable-none" in summary and "tiny-breakable-final_event" in summary


@pytest.mark.parametrize("command", ["run", "mutants"])
@pytest.mark.parametrize("value", ["0/2", "3/2", "2", "a/b", "1/0"])
def test_a_bad_shard_is_one_line_exit_2(command, value, tmp_path, capsys):
    assert main([command, "--device", "sim", "--shard", value, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == (f"fence-harness: --shard: expected K/N with whole numbers 1 <= K <= N, e.g. 1/2, "
                   f"got '{value}'\n")
    assert not (tmp_path / "results.json").exists()


def test_an_empty_shard_is_exit_2_that_says_how_many_scenarios_there_are(tmp_path, capsys):
    assert main(["run", str(DATA / "tiny.toml"), "--device", "sim", "--shard", "2/2", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == ("fence-harness: --shard: shard 2/2 holds none of the 2 selected scenarios; a shard that "
                   "tests nothing must not pass: use fewer shards\n")
    assert not (tmp_path / "results.json").exists()
