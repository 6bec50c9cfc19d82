"""The cross-check against PyTorch's CUDA sanitizer, its table and exit code, with each case's
process faked (the cases themselves need a GPU: tests/gpu/test_gpu_torch_sanitizer.py)."""

from __future__ import annotations

import json
import subprocess
from types import SimpleNamespace

import pytest

from harness.studies import sanitizer_check


def fake_cases(monkeypatch, flag: dict[tuple[str, bool], bool], fail: str | None = None) -> None:
    def run(cmd, capture_output, text, timeout=None):
        name, waits = cmd[-2], cmd[-1] == "on"
        if name == fail:
            return SimpleNamespace(returncode=1, stdout="", stderr="Traceback\nRuntimeError: boom")
        backend = name.split("-")[1]
        row = {"name": name, "waits": waits, "backend": backend, "stale": "0/3",
               "findings": 0 if waits else 16, "sanitizer_flags": flag.get((name, waits), not waits)}
        return SimpleNamespace(returncode=0, stdout="noise\n" + json.dumps(row) + "\n", stderr="")

    monkeypatch.setattr(subprocess, "run", run)


def test_every_case_a_row_and_agreement_exits_zero(monkeypatch, capsys):
    # A full graph with the waits on: the analyser finds the race, the sanitizer cannot see it.
    fake_cases(monkeypatch, {("attention-full-none", True): False})
    assert sanitizer_check.run(3) == 0
    rows = capsys.readouterr().out.splitlines()[2:]
    assert len(rows) == len(sanitizer_check.CASES)
    assert "| attention-eager-nowaits | off | 0/3 | 16 | flags | yes |" in rows


def test_a_report_on_an_ordered_eager_case_is_a_disagreement(monkeypatch, capsys):
    fake_cases(monkeypatch, {("mamba-breakable-none", True): True})
    assert sanitizer_check.run(3) == 1
    assert "| mamba-breakable-none | on | 0/3 | 0 | flags | no |" in capsys.readouterr().out


def test_a_failed_case_says_which_and_exits_two_keeping_the_rows_before_it(monkeypatch, capsys):
    fake_cases(monkeypatch, {}, fail="mamba-eager-nowaits")
    assert sanitizer_check.run(3) == 2
    out, err = capsys.readouterr()
    assert "| attention-full-final_event | on |" in out and "mamba" not in out
    assert "mamba-eager-nowaits waits=True: failed: ['RuntimeError: boom']" in err


@pytest.mark.parametrize("name", [n for n, _ in sanitizer_check.CASES])
def test_every_case_is_a_default_scenario(name):
    from harness.input.scenario_file import default_files, load_files

    assert name in {s.name for s in load_files(default_files())}
