"""One model of what executes: a replay is the captured op list, on the simulator as on a GPU.

The cases here were each found to go wrong when the simulator re-ran a graph's Python
on replay, or when the harness looked at the data before everything had landed. Each
runs on the simulator (CI) and, marked `gpu`, on CUDA (`make gpu-test`): both devices
must give the same answer.
"""

from __future__ import annotations

import json

import pytest

from harness.devices.sim import SimDevice
from harness.frontends.cli import main
from harness.records.races import RaceKind
from harness.records.scenario import Backend, Evidence, Expect, Fault, FaultKind, Hazard
from harness.run.pipeline import run_scenario
from harness.run.replay import Replayer, ground_truth, open_gate
from harness.run.testbed import Testbed
from tests.support.builders import SMALL_BATCH, SMALL_HYBRID, small_scenario

HYBRID, BATCH = SMALL_HYBRID, SMALL_BATCH
_CUDA = []


@pytest.fixture(params=["sim", pytest.param("cuda", marks=pytest.mark.gpu)])
def new_device(request):
    """new_device() -> a device: a fresh simulator, or the one CUDA device of this module."""
    if request.param == "sim":
        return SimDevice
    if not _CUDA:
        from harness.devices.cuda import CudaDevice

        _CUDA.append(CudaDevice())
    return lambda: _CUDA[0]


scenario = small_scenario


def replays_with_layer_events(dev, before_capture: bool, n: int = 5) -> tuple[int, int]:
    """A full graph whose accessors wait on per-layer external events re-recorded by every load
    op, handed to the accessors before or only after the capture; (stale replays, n)."""
    s = scenario(fault=Fault(FaultKind.GATE))
    tb = Testbed(s, dev)
    oracle = ground_truth(tb, 5.0)
    tb.set_waits(tb.accessor)
    events = [dev.Event(external=True) for _ in range(HYBRID.num_layers)]

    def hand_over() -> None:
        tb.pool.add_wait(lambda counter, layer_id, pool: events[layer_id].wait())
        tb.listeners.append(lambda layer: events[layer].record())

    if before_capture:
        hand_over()
    runner = tb.runner(Backend.FULL)
    if not before_capture:
        hand_over()  # the Python would wait now; the graph holds no wait
    gate, fault, _ = open_gate(tb, 5.0)
    replay = Replayer(tb, runner, 5.0, gate, oracle)
    stale = sum(replay(i, fault).stale for i in range(n))
    gate.close()
    return stale, n


def test_a_graph_captured_without_waits_stays_without_them_whatever_the_python_does_later(new_device):
    stale, n = replays_with_layer_events(new_device(), before_capture=False)
    assert stale == n  # as on the H200: 5 of 5 stale
    clean, _ = replays_with_layer_events(new_device(), before_capture=True)
    assert clean == 0  # the teeth: the same waits, captured, order every read


def test_write_after_read_is_stale_in_the_data(new_device):
    war = dict(hazard=Hazard.WAR, fence="final_event", fault=Fault(FaultKind.GATE))
    bad = run_scenario(scenario(schedule="no_start_wait", evidence=Evidence.DATA, **war), new_device(), replays=3)
    assert bad.tally.stale_replays == 3 and set(bad.tally.layer_counts) == {0, 1, 2, 3}
    assert any(f.kind is RaceKind.WRITE_AFTER_READ for f in bad.findings) and bad.met
    good = run_scenario(scenario(expect=Expect.CLEAN, **war), new_device(), replays=3)
    assert good.met and good.tally.stale_replays == 0 and not good.findings


def test_a_copy_no_event_covers_cannot_hide_from_the_observation(new_device, wayward):
    # The post-prefill Mamba state is collected once every stream has landed its work,
    # so a late copy that clobbers it shows in the data, and the analyser sees it too.
    late = dict(fence="final_event", schedule=f"{wayward}:late_state_copy", fault=Fault(FaultKind.DELAY, 100.0))
    r = run_scenario(scenario(evidence=Evidence.DATA, **late), new_device(), replays=3)
    assert r.met, r.verdict
    assert r.tally.final_state_replays == 3 and not r.tally.layer_counts  # reads were right
    assert any(f.kind is RaceKind.WRITE_AFTER_WRITE for f in r.findings)
    teeth = run_scenario(scenario(expect=Expect.CLEAN, fence="final_event", fault=Fault(FaultKind.DELAY, 100.0)),
                         new_device(), replays=3)
    assert teeth.met  # the engine's schedule alone is clean


def test_a_polling_fence_finishes_and_is_clean(new_device, wayward):
    fence = f"{wayward}:poll_until_loaded"
    r = run_scenario(scenario(fence=fence, expect=Expect.CLEAN, fault=Fault(FaultKind.DELAY, 1000.0)),
                     new_device(), replays=3)
    assert r.error is None and r.met, r.verdict
    assert r.tally.stale_replays == 0 and not r.findings  # a True query orders the host


def test_a_polling_fence_is_a_correct_variant_in_the_kill_matrix(wayward, tmp_path):
    path = tmp_path / "matrix.toml"
    path.write_text(f"""
[[scenario]]
name = "correct.polling"
model = {{ layers = "AMAM", hidden = 64, heads = 2, kv_heads = 1, head_dim = 32, state = 4 }}
batch = [{{ prefix = 48, new = 4 }}]
backend = "full"
fence = "{wayward}:poll_until_loaded"
fault = {{ kind = "delay", us = 1000 }}
replays = 3
expect = "clean"
""")
    assert main(["mutants", str(path), "--device", "sim", "--out", str(tmp_path / "out")]) == 0
    row = json.loads((tmp_path / "out" / "results.json").read_text())["mutants"]["matrix"][0]
    assert row["outcome"] == "clean"
