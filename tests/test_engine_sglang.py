"""The engine adapter against an installed sglang 0.5.23, on the CPU simulator (`make test-engine`).

The load op's bookkeeping is the engine's own LayerDoneCounter, the fence its own
PrefillCudaGraphRunner._wait_for_layer_loads; the reverted variant (that method a
no-op) must be caught on every full-backend race scenario, and breakable must stay
clean with the pool accessors waiting through the engine counter.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

pytest.importorskip("sglang", reason="sglang is not installed here; `make test-engine` installs it")

from harness.devices.sim import SimDevice  # noqa: E402
from harness.engines import sglang as adapter  # noqa: E402
from harness.frontends.cli import main  # noqa: E402
from harness.records.scenario import Backend, Expect, FaultKind  # noqa: E402
from harness.records.trace import Wait  # noqa: E402
from harness.run.pipeline import run_scenario
from harness.run.scenario_file import SCENARIO_DIR, load_file  # noqa: E402
from harness.run.testbed import Testbed  # noqa: E402

FILE = SCENARIO_DIR / "engine" / "sglang.toml"


def small(s):
    """The same scenario on a smaller model (same layer pattern): the CPU computes it."""
    shape = dataclasses.replace(s.model, hidden=64, heads=2, kv_heads=1, head_dim=32, state=4)
    return s.with_overrides(model=shape)


SCENARIOS = [small(s) for s in load_file(FILE)]


def test_the_engine_is_the_pinned_version_with_every_name_the_adapter_needs():
    eng = adapter.load()
    assert eng.version == "0.5.23"
    assert eng.controller.__name__ == adapter.CONTROLLER
    assert eng.runner_cls.__name__ == "PrefillCudaGraphRunner"


def test_the_counter_and_its_events_are_the_engines_on_the_harness_device():
    dev = SimDevice()
    b = Testbed(SCENARIOS[0], dev)
    assert type(b.counter).__module__ == adapter.CONTROLLER
    assert type(b.counter.events[0]).__module__ == adapter.CONTROLLER
    assert adapter.load().controller.device_module.dev is dev  # its events are the simulator's
    assert type(b.counter.events[0].load_events[0]).__module__ == "harness.devices.sim"


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_every_engine_scenario_meets_its_expectation(scenario):
    r = run_scenario(scenario, SimDevice(), replays=3)
    assert r.error is None, r.error
    assert r.observed is scenario.expect, (dict(r.tally.layer_counts), len(r.findings))
    if scenario.expect is Expect.CLEAN:
        assert not r.findings  # clean in the data and in the happens-before analysis
    elif scenario.fault.kind is FaultKind.GATE:
        assert r.tally.stale_replays == r.tally.replays


def test_the_reverted_fence_is_caught_on_every_full_backend_race_and_the_engine_fence_is_not():
    full = [s for s in SCENARIOS if s.backend is Backend.FULL]
    reverted = [s for s in full if s.fence == "engine_reverted"]
    assert {s.model.layers for s in reverted} == {"AAAA", "MMMM", "AMAM"}
    for s in reverted:
        assert run_scenario(s, SimDevice(), replays=3).tally.stale_replays > 0, s.name
        fixed = run_scenario(s.with_overrides(fence="engine", expect=Expect.CLEAN), SimDevice(), replays=3)
        assert fixed.tally.stale_replays == 0 and not fixed.findings, s.name


def test_breakable_accessor_waits_go_through_the_engine_counter():
    s = next(s for s in SCENARIOS if s.name == "sglang.hybrid-breakable")
    r = run_scenario(s, SimDevice(), replays=2)
    assert r.tally.stale_replays == 0
    waits = [op for op in r.trace.ops if isinstance(op, Wait)]
    assert waits  # the engine counter's wait_until enqueued them, eagerly between segments


def test_results_name_the_engine_and_its_version(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(FILE.read_text().replace("replays = 100", "replays = 2")
                    .replace('[models.attention]\nlayers = "AAAA"',
                             '[models.attention]\nlayers = "AA"\nhidden = 64\nheads = 2\nkv_heads = 1\nhead_dim = 32')
                    .replace('[models.mamba]\nlayers = "MMMM"',
                             '[models.mamba]\nlayers = "MM"\nhidden = 64\nheads = 2\nkv_heads = 1\nhead_dim = 32')
                    .replace('[models.hybrid]\nlayers = "AMAM"',
                             '[models.hybrid]\nlayers = "AM"\nhidden = 64\nheads = 2\nkv_heads = 1\nhead_dim = 32'))
    out = tmp_path / "out"
    assert main(["run", str(path), "--device", "sim", "--out", str(out)]) == 0
    doc = json.loads((out / "results.json").read_text())
    assert {json.dumps(e["engine"]) for e in doc["scenarios"]} == {'{"name": "sglang", "version": "0.5.23"}'}


def test_a_missing_engine_name_is_a_one_line_error_naming_it_and_the_version(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(adapter.NEEDED, adapter.CONTROLLER, ("LayerDoneCounter", "NoSuchThing"))
    adapter.load.cache_clear()
    try:
        path = tmp_path / "s.toml"
        path.write_text(FILE.read_text())
        assert main(["run", str(path), "--device", "sim", "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert f"{path}: defaults.engine: sglang 0.5.23 has no cache_controller.NoSuchThing" in err
    finally:
        adapter.load.cache_clear()


def test_an_engine_assertion_is_that_scenarios_error(monkeypatch):
    eng = adapter.load()

    def reused(self):
        raise AssertionError("Producer finish event should be ready before being reused.")

    monkeypatch.setattr(eng.controller.LayerDoneCounter, "update_producer", reused)
    r = run_scenario(SCENARIOS[0], SimDevice(), replays=2)
    assert r.error == "sglang assertion failed: Producer finish event should be ready before being reused."
