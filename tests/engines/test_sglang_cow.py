"""The installed SGLang's own deferred Mamba copy-on-write against its own HiCache load-back
(sgl-project/sglang#36743), on the CPU simulator (`make test-engine`).

`scenarios/engine/sglang_cow.toml`: the engine's `HybridReqToTokenPool.copy_mamba_state` right
after the batch's load op starts through the engine's hybrid chain. On 0.5.20-0.5.23 it waits on
the last Mamba layer's load event before `MambaPool.copy_from`, so the copy is clean; bound to the
first Mamba layer's event, or with its wait removed, it copies layers that have not landed.
"""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("sglang", reason="sglang is not installed here; `make test-engine` installs it")

from harness.devices.sim import SimDevice  # noqa: E402
from harness.engines import sglang as adapter  # noqa: E402
from harness.input.scenario_file import SCENARIO_DIR, load_file  # noqa: E402
from harness.records.scenario import Expect, FaultKind  # noqa: E402
from harness.run.pipeline import run_scenario  # noqa: E402

FILE = SCENARIO_DIR / "engine" / "sglang_cow.toml"
SMALL = dict(hidden=64, heads=2, kv_heads=1, head_dim=32, state=4)
SCENARIOS = [s.with_overrides(model=dataclasses.replace(s.model, **SMALL)) for s in load_file(FILE)]
REPLAYS = 3


def _named(name):
    return next(s for s in SCENARIOS if s.name == name)


def _memory():
    return adapter.load().modules[adapter.MEMORY]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_every_copy_on_write_scenario_meets_its_expectation_on_this_release(scenario):
    r = run_scenario(scenario, SimDevice(), replays=REPLAYS)
    assert r.error is None, r.error
    assert r.observed is scenario.expect, (dict(r.tally.layer_counts), len(r.findings))
    if scenario.expect is Expect.CLEAN:
        assert not r.findings  # clean in the data and in the happens-before analysis
    else:
        assert scenario.fault.kind is FaultKind.GATE and r.tally.stale_replays == r.tally.replays
        # bound to the first Mamba layer's event: exactly the later Mamba layers are stale
        assert set(r.tally.layer_counts) == set(scenario.model.mamba_layers[1:])


@pytest.mark.parametrize("name", ["sglang.cow-mamba.gate", "sglang.cow-hybrid.gate"])
def test_the_copy_is_the_engines_and_waits_on_the_last_mamba_layers_event(name, monkeypatch):
    mp = _memory()
    counter_cls = adapter.load().controller.LayerDoneCounter
    calls = {"copy_mamba_state": 0, "copy_from": 0}
    inside, waits = [], []
    original_state, original_copy, original_wait = (
        mp.HybridReqToTokenPool.copy_mamba_state, mp.MambaPool.copy_from, counter_cls.wait_until)

    def copy_mamba_state(self, *a, **k):
        calls["copy_mamba_state"] += 1
        inside.append(1)
        try:
            return original_state(self, *a, **k)
        finally:
            inside.pop()

    def copy_from(self, *a, **k):
        calls["copy_from"] += 1
        return original_copy(self, *a, **k)

    def wait_until(self, threshold):
        if inside and self.consumer_index >= 0:
            waits.append(threshold)  # the wait the engine's copy enqueues, a load op the consumer
        return original_wait(self, threshold)

    monkeypatch.setattr(mp.HybridReqToTokenPool, "copy_mamba_state", copy_mamba_state)
    monkeypatch.setattr(mp.MambaPool, "copy_from", copy_from)
    monkeypatch.setattr(counter_cls, "wait_until", wait_until)
    s = _named(name)
    r = run_scenario(s, SimDevice(), replays=REPLAYS)
    assert r.error is None and r.observed is Expect.CLEAN, r.error
    # every replay (and ground truth, and the traced replay): the engine's entry point, and its own copy in it
    assert calls["copy_mamba_state"] == calls["copy_from"] >= REPLAYS + 1
    # each time one wait, on the last Mamba layer's event
    assert waits == [s.model.mamba_layers[-1]] * calls["copy_mamba_state"]


def test_the_copy_with_its_wait_removed_races_in_every_mamba_layer(monkeypatch):
    """The shape #36743 describes (a whole-slot copy with no wait before it): the engine's own
    copy_mamba_state with its wait taken out is stale in every Mamba layer, every replay."""
    mp = _memory()

    def copy_mamba_state_without_wait(self, src_index, dst_index):
        if src_index.numel() == 0:
            return
        self.mamba_pool.copy_from(src_index, dst_index)

    monkeypatch.setattr(mp.HybridReqToTokenPool, "copy_mamba_state", copy_mamba_state_without_wait)
    s = _named("sglang.cow-mamba.gate")
    r = run_scenario(s, SimDevice(), replays=REPLAYS)
    assert r.error is None, r.error
    assert r.observed is Expect.RACE and r.tally.stale_replays == REPLAYS and r.findings
    assert set(r.tally.layer_counts) == set(s.model.mamba_layers)


def test_a_copy_that_never_copies_is_an_error_not_a_clean(monkeypatch):
    monkeypatch.setattr(_memory().HybridReqToTokenPool, "copy_mamba_state", lambda self, src, dst: None)
    r = run_scenario(_named("sglang.cow-hybrid.gate"), SimDevice(), replays=REPLAYS)
    assert r.observed is not Expect.CLEAN
    assert "copied 0 times, not once" in (r.error or "")


def test_too_few_mamba_slots_for_the_requests_own_is_an_error():
    s = _named("sglang.cow-hybrid.gate")
    s = s.with_overrides(model=dataclasses.replace(s.model, mamba_slots=4))
    r = run_scenario(s, SimDevice(), replays=REPLAYS)
    assert r.observed is not Expect.CLEAN
    assert "mamba_slots >= 5" in (r.error or "")
