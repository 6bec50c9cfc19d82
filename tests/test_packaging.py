"""The package as a stranger installs it: a wheel holds the bundled scenario sets, and from it, in an
empty folder, a run runs them (none selected is exit 2, never a green run that tested nothing)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import harness
from tests.support.paths import ROOT


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The package built as a wheel from a copy of the checkout (the build writes beside its source)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("harness", "scenarios"):
        shutil.copytree(ROOT / name, src / name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           str(src), "-w", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (found,) = out.glob("fence_harness-*.whl")
    return found


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> dict[str, str]:
    """The wheel unpacked as pip installs it, first on the path, and an empty working folder."""
    site = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target",
                           str(site), str(wheel)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {"site": str(site), "cwd": str(tmp_path_factory.mktemp("empty"))}


def fence_harness(installed: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": installed["site"]}
    return subprocess.run([sys.executable, "-m", "harness", *argv], capture_output=True, text=True,
                          cwd=installed["cwd"], env=env, timeout=600)


def test_the_wheel_holds_every_scenario_file_of_the_checkout(wheel):
    with zipfile.ZipFile(wheel) as z:
        shipped = sorted(n.removeprefix("harness/") for n in z.namelist() if n.endswith(".toml"))
    checkout = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "scenarios").rglob("*.toml"))
    assert shipped == checkout and len(checkout) >= 8


def test_the_wheels_version_is_the_packages(wheel):
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert wheel.name.startswith(f"fence_harness-{version}-") and harness.__version__ == version


def test_from_the_wheel_in_an_empty_folder_a_run_runs_the_bundled_set(installed):
    probe = subprocess.run([sys.executable, "-c", "import harness; print(harness.__file__)"], capture_output=True,
                           text=True, cwd=installed["cwd"], env={**os.environ, "PYTHONPATH": installed["site"]})
    assert probe.stdout.strip().startswith(installed["site"])  # the wheel's harness, not the checkout's
    proc = fence_harness(installed, "run", "--device", "sim", "-k", "full and not hybrid", "--replays", "2",
                         "--out", "out", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert doc["scenarios"] == doc["met"] >= 4 and doc["exit_code"] == 0
    assert all("full" in item["name"] and "hybrid" not in item["name"] for item in doc["items"])


def test_from_the_wheel_a_filter_that_matches_nothing_is_exit_2(installed):
    proc = fence_harness(installed, "run", "--device", "sim", "-k", "no-such-scenario", "--out", "out")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "matches none of the" in proc.stderr and proc.stdout == ""


def test_from_the_wheel_the_kill_matrix_is_there(installed):
    proc = fence_harness(installed, "mutants", "--device", "sim", "-k", "fence_on_layer0 or final_event.gate",
                         "--replays", "2", "--out", "out")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "1/1 mutants killed, 1/1 correct variants clean" in proc.stdout
