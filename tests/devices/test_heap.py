"""The start-up heap is frozen once per process, before the first scenario: each capture's
collection then walks only what scenarios made."""

from __future__ import annotations

import gc

from harness.devices import base
from harness.devices.sim import SimDevice
from harness.run.pipeline import run_scenario
from tests.support.builders import small_scenario


class _Cycle:
    other: object = None


def test_the_first_scenario_freezes_the_heap_once_and_scenarios_stay_collectable(monkeypatch):
    monkeypatch.setattr(base, "_heap_frozen", False)
    gc.unfreeze()
    run_scenario(small_scenario(), SimDevice(), replays=2)
    frozen = gc.get_freeze_count()
    assert frozen > 0
    run_scenario(small_scenario(), SimDevice(), replays=2)
    assert gc.get_freeze_count() == frozen  # once: a later scenario's objects are not frozen
    a, b = _Cycle(), _Cycle()
    a.other, b.other = b, a
    del a, b
    assert gc.collect() >= 2  # made after the freeze: still collected
