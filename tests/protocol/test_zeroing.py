"""Hazard load_before_zeroing (vllm-project/vllm#50696) on the harness's own load op, on the simulator:
the zeroing of the freshly allocated blocks and the load into them, with the gate holding the forward
stream before the zeroing. The harness's load op records its start event on the forward stream after
the zeroing, so its load stream's wait orders it (clean); the same load without that wait (schedule
no_start_wait) lands first and is wiped (the teeth). vLLM's own load: tests/engines/test_vllm_offload.py."""

from __future__ import annotations

import dataclasses

from harness.devices.sim import SimDevice
from harness.records.scenario import Expect, Fault, FaultKind, Hazard
from harness.run.pipeline import run_scenario
from tests.support.builders import small_scenario

ATTENTION = dataclasses.replace(small_scenario().model, layers="AAAA")


def zeroing(**changes):
    fields = dict(model=ATTENTION, hazard=Hazard.ZEROING, fence="final_event", fault=Fault(FaultKind.GATE),
                  expect=Expect.CLEAN)
    return small_scenario(**{**fields, **changes})


def test_a_load_ordered_after_the_forward_stream_lands_after_the_zeroing():
    r = run_scenario(zeroing(), SimDevice(), replays=3)
    assert r.error is None, r.error
    assert r.tally.stale_replays == 0 and not r.findings, [f.describe() for f in r.findings]


def test_a_load_not_ordered_after_the_forward_stream_is_wiped_by_the_zeroing():
    r = run_scenario(zeroing(schedule="no_start_wait", expect=Expect.RACE), SimDevice(), replays=3)
    assert r.error is None, r.error
    assert r.observed is Expect.RACE and r.tally.stale_replays == 3  # every replay: the gate decides it
    assert {f.what for f in r.findings} >= {"zero the freshly allocated blocks"}
    assert all(f.copy_region.pool in ("k", "v") for f in r.findings)
