"""Replays checked in batches: one host synchronisation per batch, a verdict per replay.

On the simulator (CI): the verdicts stay each replay's own however many replays share a
batch; a batch waits for every stream before it looks; the load ops respect the engine's
ring of event sets; `pace = "idle"` checks one replay at a time. The oracle's bitwise
comparison of probes is checked on planted bf16 data of awkward row sizes.
"""

from __future__ import annotations

import pytest
import torch

from harness.devices.sim import SimDevice
from harness.model.arena import arena_layout
from harness.model.stack import ProbeSet
from harness.protocol.layout import plan_layout
from harness.records.scenario import (
    Backend,
    DType,
    Expect,
    Fault,
    FaultKind,
    Hazard,
    ModelShape,
    Pace,
    Request,
    Scenario,
)
from harness.run.oracle import Oracle
from harness.run.pipeline import run_scenario
from harness.run.replay import Replayer, ground_truth
from harness.run.testbed import Testbed
from tests.support.builders import SMALL_HYBRID, small_scenario
from tests.support.paths import PLUGINS

SHAPE = SMALL_HYBRID


@pytest.fixture
def odd_skip(monkeypatch) -> str:
    monkeypatch.syspath_prepend(str(PLUGINS))
    return "odd_replays_skip:schedule"


def scenario(**kw) -> Scenario:
    return small_scenario(**{**dict(name="batches", batch=(Request(32, 4), Request(16, 2)), expect=Expect.CLEAN,
                                  fence="final_event", replays=10), **kw})


def test_each_verdict_is_its_own_replays_in_a_shared_batch(odd_skip):
    verdicts = []
    r = run_scenario(scenario(schedule=odd_skip), SimDevice(), replays=21,
                     on_replay=lambda i, v: verdicts.append((i, v)))
    assert r.error is None
    assert [i for i, _ in verdicts] == list(range(21))
    assert [v.stale for _, v in verdicts] == [i % 2 == 1 for i in range(21)]
    assert all(v.layers == {1} for _, v in verdicts if v.stale)


@pytest.mark.parametrize("pace", list(Pace))
def test_a_replays_batch_is_as_its_pace_and_gate_say(pace):
    tb = Testbed(scenario(pace=pace), SimDevice())
    oracle = ground_truth(tb, 30.0)
    replay = Replayer(tb, tb.runner(Backend.FULL), 30.0, None, oracle)
    assert replay.observer.batch == (1 if pace is Pace.IDLE else 64)
    syncs = []
    dev = tb.dev
    real = dev.synchronize
    dev.synchronize = lambda *a: (syncs.append(1), real(*a))[1]  # type: ignore[method-assign]
    verdicts = list(replay.replays(range(130), Fault()))
    assert len(verdicts) == 130 and not any(v.stale for v in verdicts)
    assert len(syncs) == (130 if pace is Pace.IDLE else 3)  # 64 + 64 + 2


def test_a_gated_scenario_checks_one_replay_per_batch():
    s = scenario(fault=Fault(FaultKind.GATE), fence="none", expect=Expect.RACE)
    r = run_scenario(s, SimDevice(), replays=5)
    assert r.tally.stale_replays == 5  # the gate holds every replay's load until its forward ran


def test_a_copy_no_event_covers_is_still_seen_by_the_batch():
    # final_event_early records the final event before the last layer's copies: the fence lets the
    # forward run first, and the harness's look still waits for those copies (it joins every stream),
    # so the stale read shows in the data, replay by replay.
    s = scenario(schedule="final_event_early", fault=Fault(FaultKind.DELAY, 500.0), expect=Expect.RACE)
    r = run_scenario(s, SimDevice(), replays=12)
    assert r.tally.stale_replays == 12
    assert set(r.tally.layer_counts) == {3}


def test_the_host_waits_for_a_ring_slot_before_reusing_it():
    # With the host far ahead, a fourth load op would reuse the first's event set while that
    # op still runs: the engine asserts that never happens, so the testbed waits for it.
    s = scenario(fault=Fault(FaultKind.DELAY, 2000.0))
    r = run_scenario(s, SimDevice(), replays=8)
    assert r.error is None and r.tally.stale_replays == 0


def test_bf16_probes_are_compared_bit_for_bit_in_rows_of_any_width():
    shape = ModelShape(layers="AM", hidden=12, heads=2, kv_heads=1, head_dim=3, state=3, conv=3, expand=1,
                       page_size=1, dtype=DType.BF16)
    layout = plan_layout(shape, (Request(prefix=5, new=3),))
    arena = arena_layout(layout)
    truth = torch.randn(arena.size, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    oracle = Oracle(arena, truth)
    p = ProbeSet(layout, torch.device("cpu"))
    p.arena.copy_(truth)
    assert not oracle.judge(p.arena).stale
    p.k[0, 2, 0, 1] = float("nan")  # a row of 3 bf16 values: 6 bytes, compared as int16 words
    p.conv[0, 0, 1, 0] += 1.0
    v = oracle.judge(p.arena)
    r = layout.requests[0]
    assert v.stale_units == 2 and v.stale_reads == 2
    assert v.slots == {(0, "k", r.prefix.start + 2), (1, "conv", r.mamba_slot)}


def test_a_batchs_verdicts_are_handed_out_while_the_next_batch_runs(odd_skip):
    from harness.studies.checking_speed import checked_replayer

    r = checked_replayer(SimDevice(), scenario(schedule=odd_skip))
    enqueued: list[int] = []
    real = r.enqueue
    r.enqueue = lambda i, *a, **k: (enqueued.append(i), real(i, *a, **k))[1]  # type: ignore[method-assign]
    seen = [(len(enqueued), v.stale) for v in r.replays(range(130), Fault())]
    # Batch 0's verdicts once replay 64 is enqueued, batch 1's once replay 128 is, the last two at the
    # end; every one still its own replay's.
    assert [e for e, _ in seen] == [65] * 64 + [129] * 64 + [130] * 2
    assert [stale for _, stale in seen] == [i % 2 == 1 for i in range(130)]


def test_a_caller_that_stops_early_leaves_the_loop_at_row_zero(odd_skip):
    from harness.studies.checking_speed import checked_replayer

    r = checked_replayer(SimDevice(), scenario(schedule=odd_skip))
    gen = r.replays(range(130), Fault())
    assert [next(gen).stale for _ in range(3)] == [False, True, False]  # replay 64 is enqueued by now
    gen.close()
    assert r.observer.rows == 0
    assert [v.stale for v in r.replays(range(10), Fault())] == [i % 2 == 1 for i in range(10)]


@pytest.mark.parametrize("hazard", [Hazard.RAW, Hazard.STORE, Hazard.REUSE, Hazard.FORWARD_OVER_BACKUP,
                                    Hazard.STAGING])
def test_a_hazard_the_host_prepares_checks_one_replay_per_batch(hazard):
    # The host poisons a write-back's host copy and refills a staging buffer as it enqueues a replay:
    # a replay queued behind others would rewrite what the previous replay's copies and look still
    # read (on the simulator with calibrated costs, writeback-store-no_write_fence read right bytes
    # in a batch's later replays, where the GPU read poison in every one).
    tb = Testbed(scenario(hazard=hazard, transfer=None if hazard is Hazard.RAW else "engine"), SimDevice())
    oracle = ground_truth(tb, 30.0)
    replay = Replayer(tb, tb.runner(Backend.FULL), 30.0, None, oracle)
    assert replay.observer.batch == (64 if tb.hazard.prepares_on_device else 1)
    assert (replay.observer.batch == 1) == (hazard is not Hazard.RAW)
