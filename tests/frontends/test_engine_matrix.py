"""fence-harness engine-matrix: one release per process, one table, one results.json.

The table and the merged document are tested on made-up child results (any Python); one
release end to end needs sglang installed (`make test-engine`): the installed one stands
in as an already-installed release folder, so nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.frontends import engine_matrix as em
from harness.frontends.cli import main
from harness.input.scenario_file import load_files
from harness.report.schema import validate
from tests.support.paths import DATA

ENTRY = {"name": "s", "expect": "race", "observed": "race", "met": True, "stale_replays": 3, "replays": 3,
         "findings": ["x"] * 16, "error": None}


def child_doc(**changes) -> dict:
    return {"schema_version": 1, "run_id": "r", "environment": {"device": "sim", "torch": "t"},
            "scenarios": [{**ENTRY, **changes}]}


def test_every_row_names_its_release_and_the_table_says_what_met():
    docs = {"0.5.22": child_doc(), "0.5.23": child_doc(expect="clean", met=False)}
    rows = [r for v, d in docs.items() for r in em.rows_of(v, d)]
    text = em.table(rows)
    assert "ok   0.5.22   s" in text and "FAIL 0.5.23   s" in text
    assert text.splitlines()[-1] == "1 of 2 met their expectation on 2 releases (0.5.22, 0.5.23)"
    doc = em.merged(docs, rows, {"0.5.22": 0, "0.5.23": 1}, 0.0)
    assert [e["name"] for e in doc["scenarios"]] == ["0.5.22/s", "0.5.23/s"]
    assert [e["release"] for e in doc["scenarios"]] == ["0.5.22", "0.5.23"]
    assert [r["release"] for r in doc["engine_matrix"]["rows"]] == ["0.5.22", "0.5.23"]
    assert doc["summary"] == {"scenarios": 2, "met": 1, "errors": 0}


def test_a_release_already_in_its_folder_is_not_installed_again(tmp_path, monkeypatch):
    (tmp_path / "sglang-9.9.9" / "sglang").mkdir(parents=True)
    (tmp_path / "sglang-9.9.9" / "sglang" / "__init__.py").write_text("")
    monkeypatch.setattr(em.subprocess, "run", lambda *a, **k: pytest.fail("pip ran"))
    assert em.install("9.9.9", tmp_path) == tmp_path / "sglang-9.9.9"


def test_one_release_runs_in_its_own_process_through_the_hidden_option(tmp_path, monkeypatch, capsys):
    # What the parent starts per release, with no sglang needed: the harness's own tiny scenarios.
    out = tmp_path / "out"
    assert main(["engine-matrix", "--in-process", str(DATA / "tiny.toml"), "--device", "sim", "--replays", "1",
                 "--out", str(out)]) == 0
    doc = json.loads((out / "results.json").read_text())
    validate(doc)
    assert [e["name"] for e in doc["scenarios"]] == [s.name for s in load_files([DATA / "tiny.toml"])]
    assert all(e["replays"] == 1 for e in doc["scenarios"])
    runs, real_run = [], subprocess.run

    def child(cmd, **kwargs):  # the release's process, not started; anything else (git) runs
        if cmd[1:3] != ["-m", "harness"]:
            return real_run(cmd, **kwargs)
        runs.append(cmd)
        return SimpleNamespace(returncode=2)

    monkeypatch.setattr(em, "install", lambda version, engines_dir, engine="sglang": tmp_path)
    monkeypatch.setattr(em.subprocess, "run", child)
    assert main(["engine-matrix", "--releases", "9.9.9", "--device", "sim", "--out", str(tmp_path / "m")]) == 2
    (cmd,) = runs
    assert cmd[1:5] == ["-m", "harness", "engine-matrix", "--in-process"] and "--small" in cmd


def test_a_vllm_release_runs_the_default_files_whose_releases_hold_it(tmp_path, monkeypatch):
    # The connector contract and the store's handlers up to 0.17.0, SimpleCPUOffloadConnector's worker from
    # 0.19.0, the offloading load's worker from 0.27.0.
    runs, real_run = [], subprocess.run

    def child(cmd, **kwargs):  # the release's process, not started; anything else (git) runs
        if cmd[1:3] != ["-m", "harness"]:
            return real_run(cmd, **kwargs)
        runs.append(cmd)
        return SimpleNamespace(returncode=2)

    monkeypatch.setattr(em, "install", lambda version, engines_dir, engine="sglang": tmp_path)
    monkeypatch.setattr(em.subprocess, "run", child)
    assert main(["engine-matrix", "--engine", "vllm", "--releases", "0.17.0,0.23.0,0.27.0", "--device", "sim",
                 "--out", str(tmp_path / "m")]) == 2
    files = {cmd[cmd.index("--out") + 1].rsplit("-", 1)[-1]: [Path(a).name for a in cmd if a.endswith(".toml")]
             for cmd in runs}
    assert files == {"0.17.0": ["vllm.toml", "vllm_offload.toml"], "0.23.0": ["vllm_simple_offload.toml"],
                     "0.27.0": ["vllm_simple_offload.toml", "vllm_offload_store.toml", "vllm_offload_load.toml"]}
    assert em.MATRIX["vllm"].files_for("0.28.0", [Path("mine.toml")]) == [Path("mine.toml")]  # not a default


def test_the_hidden_option_takes_files(capsys):
    assert main(["engine-matrix", "--in-process", "--device", "sim"]) == 2
    assert "FILES: give the scenario files to run" in capsys.readouterr().err


needs_sglang = pytest.mark.skipif(importlib.util.find_spec("sglang") is None,
                                  reason="sglang is not installed here; `make test-engine` installs it")


@needs_sglang
def test_one_release_end_to_end_in_its_own_process(tmp_path):
    import sglang

    version = sglang.__version__
    folder = tmp_path / "engines" / f"sglang-{version}"
    folder.mkdir(parents=True)
    (folder / "sglang").symlink_to(Path(sglang.__file__).parent)
    scenarios = tmp_path / "s.toml"
    scenarios.write_text(em.FILES[0].read_text().split("[[scenario]]")[0] + """
[[scenario]]
name = "sglang.hybrid-execute.gate"
model = { layers = "AM", hidden = 32, heads = 2, kv_heads = 1, head_dim = 16, state = 4 }
fault = { kind = "gate" }
""")
    out = tmp_path / "out"
    code = main(["engine-matrix", str(scenarios), "--releases", version, "--engines-dir", str(tmp_path / "engines"),
                 "--device", "sim", "--replays", "2", "--out", str(out)])
    assert code == 0
    doc = json.loads((out / "results.json").read_text())
    validate(doc)
    (entry,) = doc["scenarios"]
    assert entry["release"] == version and entry["engine"] == {"name": "sglang", "version": version}
    assert entry["met"] and entry["replays"] == 2
    assert doc["engine_matrix"]["releases"] == [{"release": version, "exit_code": 0, "ran": True}]


@needs_sglang
def test_the_pack_lists_what_the_adapter_imports_in_a_process_of_its_own(tmp_path):
    import sglang

    from harness.frontends import engine_pack

    target = Path(sglang.__file__).parent.parent
    files = engine_pack.imported_files(target, tmp_path, cuda_branches=False)
    assert any(f.endswith("sglang/srt/managers/cache_controller.py") for f in files)
