"""What `make gpu-test` (the pull-request gate) and `make gpu-nightly` run, read from `make -n`:
the gate's sets and replay count, and that nothing the gate leaves out is lost."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from tests.support.paths import ROOT
from tests.support.replays import GATE_REPLAYS


def _dry_run(target: str) -> list[list[str]]:
    out = subprocess.run(["make", "-s", "-n", target, "PYTHON=python3"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    return [shlex.split(line) for line in out.replace("\\\n", " ").splitlines() if line.strip()]


def _pytest_line(target: str) -> list[str]:
    """The pytest command's arguments after `python -m pytest`."""
    cmd = next(cmd for cmd in _dry_run(target) if "pytest" in cmd)
    return cmd[cmd.index("pytest") + 1:]


def _after(cmd: list[str], flag: str) -> list[str]:
    i = cmd.index(flag) + 1
    taken = []
    while i < len(cmd) and not cmd[i].startswith("-"):
        taken.append(cmd[i])
        i += 1
    return taken


def test_the_gate_runs_every_set_but_the_natural_one_and_the_kill_matrix_at_the_stated_replays():
    cmd = _pytest_line("gpu-test")
    assert cmd[cmd.index("-m") + 1] == "gpu and not nightly"
    sets = _after(cmd, "--harness-scenarios")
    on_disk = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "scenarios").glob("*.toml"))
    assert sorted(sets) == [p for p in on_disk if p != "scenarios/natural.toml"]
    mutants = [a for a in _after(cmd, "--harness-mutants") if a.endswith(".toml")]
    assert mutants == ["scenarios/mutants/kill_matrix.toml"]
    assert _after(cmd, "--harness-replays") == [str(GATE_REPLAYS)]


def test_every_gpu_test_outside_the_engine_folder_is_on_the_gates_paths():
    # The engine tests need an sglang release: they run from the engine targets, not the gate.
    cmd = _pytest_line("gpu-test")
    paths = [a for a in cmd if a.startswith("tests")]
    marked = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py")
              if "mark.gpu" in p.read_text() and "tests/engines" not in p.as_posix() and p != Path(__file__)}
    missing = sorted(m for m in marked if not any(m == p or m.startswith(p.rstrip("/") + "/") for p in paths))
    assert marked and not missing, missing


def test_the_nightly_runs_what_the_gate_leaves_out():
    cmds = _dry_run("gpu-nightly")
    tests = _pytest_line("gpu-nightly")
    assert tests[tests.index("-m") + 1] == "gpu and nightly"
    harness = [c[c.index("harness") + 1:] for c in cmds if "harness" in c and "pytest" not in c]
    run = next(c for c in harness if c[0] == "run")
    assert not any(a.endswith(".toml") for a in run)  # every file of scenarios/, the natural set too
    mutants = next(c for c in harness if c[0] == "mutants")
    assert _after(mutants, "--replays") == ["1000"]
    assert {"fences", "bench", "checking"} <= {c[0] for c in harness}
    assert {"sanitizer"} <= {c[0] for c in harness}


def test_the_samples_target_rewrites_every_committed_sample_with_relative_paths():
    cmds = _dry_run("gpu-samples")
    written = {a.split("=", 1)[1] if a.startswith("REPORTS=") else a
               for c in cmds for i, a in enumerate(c) if a.startswith("REPORTS=") or (i and c[i - 1] == "--out")}
    committed = {p.parent.relative_to(ROOT).as_posix() for p in (ROOT / "reports" / "samples").glob("*/results.json")}
    assert committed and committed <= written, sorted(committed - written)
    assert all(not Path(w).is_absolute() for w in written), written
    # The gate's own command writes its sample: the same pytest line as `make gpu-test`.
    assert _pytest_line("gpu-samples")[:4] == _pytest_line("gpu-test")[:4]
