"""fence-harness soak on the CPU simulator: what it draws, what it counts, its exit codes."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from harness.frontends import session, soak
from harness.frontends.cli import main
from harness.records.errors import DeviceLost
from harness.records.scenario import Backend, Evidence, Expect, Fault, FaultKind
from harness.run.pipeline import ScenarioResult

REAL_DRAW = soak.draw


def run_soak(out: Path, *args: str) -> int:
    return main(["soak", "--device", "sim", "--seed", "3", "--out", str(out), *args])


def section(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())["soak"]


def test_draws_are_reproducible_correct_and_varied():
    draws = [soak.draw(7, i) for i in range(300)]
    assert draws == [soak.draw(7, i) for i in range(300)]
    assert soak.draw(8, 0) != draws[0]
    for s in draws:
        assert s.expect is Expect.CLEAN and s.model.heads % s.model.kv_heads == 0
        assert set(s.model.layers) <= {"A", "M"} and 1 <= len(s.model.layers) <= 4
        assert 1 <= len(s.batch) <= 3
        # The correct variants: the fenced full graph, or breakable with the accessors' waits.
        assert (s.backend, s.fence, s.accessor) in {
            (Backend.FULL, "final_event", "per_layer"), (Backend.BREAKABLE, "none", "per_layer")}
    assert {s.fault.kind for s in draws} == {FaultKind.GATE, FaultKind.JITTER, FaultKind.CHUNKED}
    assert {s.backend for s in draws} == {Backend.FULL, Backend.BREAKABLE}
    assert set(Counter(s.model.layers for s in draws)) >= {"A", "M", "AM", "MA"}
    t = soak.twin(draws[0])
    assert t.expect is Expect.RACE and (t.fence, t.accessor) in {("none", "per_layer"), ("none", "none")}
    assert t.evidence is Evidence.DATA  # a twin shows the race in the data


def test_a_short_soak_is_clean_and_writes_its_section(tmp_path, capsys):
    out = tmp_path / "soak"
    assert run_soak(out, "--minutes", "0.1", "--twin-every", "2") == 0
    printed = capsys.readouterr().out
    s = section(out)
    assert s["seed"] == 3 and s["scenarios"] >= 2 and s["twins"] >= 1
    assert s["false_positives"] == 0 and s["errors"] == 0
    assert s["replays"] == 4 * (s["scenarios"] + s["twins"]) and s["replays_per_s"] > 0
    assert s["missed_races"].get("gate", 0) == 0
    assert "replays/s" in printed and "false positives 0" in printed
    assert "partial" not in json.loads((out / "results.json").read_text())


def test_a_false_positive_fails_the_soak_and_is_kept_in_the_results(tmp_path, monkeypatch, capsys):
    # A "correct" variant that is not: no fence under a gate races in every replay.
    monkeypatch.setattr(soak, "draw", lambda seed, i: REAL_DRAW(seed, i).with_overrides(
        backend=Backend.FULL, fence="none", fault=Fault(FaultKind.GATE)))
    out = tmp_path / "soak"
    assert run_soak(out, "--minutes", "0.001") == 1
    s = section(out)
    assert s["false_positives"] >= 1 and s["failures"][0] == "soak-3-0"
    doc = json.loads((out / "results.json").read_text())
    assert doc["scenarios"][0]["name"] == "soak-3-0" and doc["scenarios"][0]["stale_replays"] == 4
    assert capsys.readouterr().out.startswith("soak: device sim, seed 3")


def test_a_gate_twin_that_does_not_race_fails_the_soak(tmp_path, monkeypatch):
    monkeypatch.setattr(soak, "draw", lambda seed, i: REAL_DRAW(seed, i).with_overrides(
        fault=Fault(FaultKind.GATE)))
    monkeypatch.setattr(soak, "twin", lambda s: s.with_overrides(name=f"{s.name}-twin", expect=Expect.RACE))
    out = tmp_path / "soak"
    assert run_soak(out, "--minutes", "0.001", "--twin-every", "1") == 1
    s = section(out)
    assert s["missed_races"] == {"total": s["twins"], "gate": s["twins"]} and s["twins"] >= 1
    assert s["failures"][0] == "soak-3-0-twin"


def test_a_jitter_twin_that_does_not_race_is_only_counted(tmp_path, monkeypatch):
    monkeypatch.setattr(soak, "draw", lambda seed, i: REAL_DRAW(seed, i).with_overrides(
        fault=Fault(FaultKind.JITTER, us=1.0)))
    monkeypatch.setattr(soak, "twin", lambda s: s.with_overrides(name=f"{s.name}-twin", expect=Expect.RACE))
    out = tmp_path / "soak"
    assert run_soak(out, "--minutes", "0.001", "--twin-every", "1") == 0
    s = section(out)
    assert s["missed_races"] == {"total": s["twins"], "jitter": s["twins"]} and s["twins"] >= 1
    assert s["failures"] == [] and json.loads((out / "results.json").read_text())["scenarios"] == []


def fail_on_call(n: int, error, monkeypatch) -> None:
    """The n-th scenario the soak runs raises error(scenario) instead."""
    calls = []

    def run_one(s, dev, replays, timeout_s, until=None, counted=True, _run=session.run_one):
        calls.append(s)
        if len(calls) == n:
            raise error(s)
        return _run(s, dev, replays, timeout_s, until, counted)

    monkeypatch.setattr(session, "run_one", run_one)


def lost(s):
    r = ScenarioResult(s, error="device lost: CUDA error: unspecified launch failure")
    return DeviceLost(f"{s.name}: {r.error}", r)


def test_an_interrupted_soak_writes_what_it_counted_as_partial(tmp_path, monkeypatch, capsys):
    fail_on_call(3, lambda s: KeyboardInterrupt(), monkeypatch)
    out = tmp_path / "soak"
    assert run_soak(out, "--minutes", "5") == 130
    assert capsys.readouterr().err.strip() == (
        f"fence-harness: interrupted (SIGINT); partial results of 2 scenarios: {out / 'results.json'}")
    doc = json.loads((out / "results.json").read_text())
    assert doc["partial"] is True and doc["interrupted"] == "SIGINT" and doc["soak"]["scenarios"] == 2


def test_a_soak_interrupted_before_anything_finished_writes_nothing(tmp_path, monkeypatch, capsys):
    fail_on_call(1, lambda s: KeyboardInterrupt(), monkeypatch)
    out = tmp_path / "soak"
    assert run_soak(out, "--minutes", "5") == 130
    assert "no scenario finished" in capsys.readouterr().err
    assert not out.exists()


def test_a_lost_device_ends_the_soak_with_exit_2(tmp_path, monkeypatch, capsys):
    fail_on_call(2, lost, monkeypatch)
    out = tmp_path / "soak"
    assert run_soak(out, "--minutes", "5") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "soak-3-1: device lost: CUDA error" in err[0]
    doc = json.loads((out / "results.json").read_text())
    assert doc["interrupted"] == "device-lost" and doc["soak"]["errors"] == 1
    assert doc["scenarios"][0]["error"].startswith("device lost")


def test_soak_on_cuda_without_cuda_is_exit_2(tmp_path, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["soak", "--device", "cuda", "--minutes", "0.01", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no CUDA device" in err
    assert not (tmp_path / "results.json").exists()


@pytest.mark.slow
def test_a_two_minute_soak_on_the_simulator(tmp_path, request):
    if "slow" not in (request.config.option.markexpr or ""):
        pytest.skip("a two-minute soak: select it with -m slow")
    out = tmp_path / "soak"
    assert run_soak(out, "--minutes", "2") == 0
    s = section(out)
    assert s["false_positives"] == 0 and s["errors"] == 0 and s["missed_races"].get("gate", 0) == 0
    assert s["elapsed_s"] >= 120 and s["twins"] >= s["scenarios"] // 4
