"""Without sglang installed (`make test`), asking for it is a one-line error, exit 2."""

from __future__ import annotations

import importlib.util

import pytest

from harness.frontends.cli import main

pytestmark = pytest.mark.skipif(importlib.util.find_spec("sglang") is not None,
                                reason="sglang is installed here (see tests/engines/test_sglang.py)")

SCENARIO = """
[[scenario]]
name = "s"
model = { layers = "AM", hidden = 32, heads = 2, kv_heads = 1, head_dim = 16, state = 4 }
batch = [{ prefix = 8, new = 2 }]
backend = "full"
engine = "sglang"
fence = "engine_execute"
expect = "clean"
"""


def test_engine_in_a_scenario_file_without_sglang(tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO)
    assert main(["run", str(path), "--device", "sim", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"{path}: scenario[0].engine: engine 'sglang' is not importable here" in err
    assert "make test-engine" in err
    assert not (tmp_path / "out").exists()


def test_engine_on_the_command_line_without_sglang(tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO.replace('engine = "sglang"\nfence = "engine_execute"\n', ""))
    assert main(["run", str(path), "--device", "sim", "--out", str(tmp_path), "--engine", "sglang"]) == 2
    assert "--engine: engine: engine 'sglang' is not importable here" in capsys.readouterr().err


def test_an_engine_fence_without_the_engine_names_what_is_missing(tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO.replace('engine = "sglang"\n', ""))
    assert main(["run", str(path), "--device", "sim", "--out", str(tmp_path / "out")]) == 2
    assert "scenario[0].fence: fence 'engine_execute' is the engine's own: it needs engine" in capsys.readouterr().err
