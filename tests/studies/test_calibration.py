"""`fence-harness calibrate` (harness.studies.calibration): the measuring, run on the simulator,
gives back the simulator's own costs; the fit is pure; the committed calibration is what the
simulator runs with, and a GPU made it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness.devices.sim import SimDevice
from harness.records.device_settings import CALIBRATION, SimCosts
from harness.records.errors import InputError
from harness.studies import calibration as cal
from tests.support.paths import ROOT

COSTS = SimCosts(bandwidth_gbps=40.0, copy_latency_us=3.0, launch_us=6.0, replay_us=4.0, access_us=50.0,
                 kernel_us=15.0, poll_us=1.0)


def test_copies_measured_on_the_simulator_give_back_its_latency_and_bandwidth():
    points = cal.measure_copies(SimDevice(COSTS), sizes=(512, 64 << 10, 4 << 20), rounds=1)
    latency, bandwidth = cal.fit_copies(points)
    assert latency == pytest.approx(COSTS.copy_latency_us, rel=1e-3)
    assert bandwidth == pytest.approx(COSTS.bandwidth_gbps, rel=1e-3)


def test_kernels_measured_on_the_simulator_give_back_its_kernel_costs():
    dev = SimDevice(COSTS)
    shapes = cal.FORWARD_SHAPES[:2]
    kernels = cal.measure_kernels(dev, shapes, rounds=1)
    assert {k.us for k in kernels if k.access} == {COSTS.access_us}
    assert {k.us for k in kernels if not k.access} == {COSTS.kernel_us}
    forwards = cal.measure_forwards(dev, shapes, repeats=1)
    # A graph replay on the simulator is its kernels back to back, after the host has launched it
    # (from the marker before it: a few host enqueues and the graph's launch).
    for f in forwards:
        waited = f.us - (COSTS.access_us * f.access_ops + COSTS.kernel_us * f.other_ops)
        assert 0 < waited <= 3 * COSTS.launch_us + COSTS.replay_us
    access, other = cal.fit_kernels(kernels, forwards)
    assert access / other == pytest.approx(COSTS.access_us / COSTS.kernel_us)


def test_the_kernel_costs_keep_the_eager_ratio_at_the_graph_replays_level():
    kernels = [cal.KernelPoint("s", "a", True, 30.0), cal.KernelPoint("s", "b", False, 10.0)]
    forwards = [cal.ForwardPoint("s", 2, 4, 70.0)]  # eager would add up to 2*30 + 4*10 = 100
    access, other = cal.fit_kernels(kernels, forwards)
    assert (access, other) == pytest.approx((21.0, 7.0))
    with pytest.raises(ValueError, match="both kinds"):
        cal.fit_kernels(kernels[:1], forwards)


def test_a_copy_line_needs_two_sizes_and_holds_its_latency_at_zero_or_above():
    with pytest.raises(ValueError, match="two sizes"):
        cal.fit_copies([cal.CopyPoint(512, 4.0)])
    # Times that would put the line below zero at no bytes: the latency stays at zero.
    latency, bandwidth = cal.fit_copies([cal.CopyPoint(1000, 0.5), cal.CopyPoint(1_000_000, 1000.0)])
    assert latency == 0.0 and bandwidth > 0


def test_the_launch_cost_is_the_replays_enqueue_less_its_graph_launch_shared_by_its_ops():
    copies = [cal.CopyPoint(1000, 4.0), cal.CopyPoint(1_001_000, 24.0)]
    kernels = [cal.KernelPoint("s", "a", True, 30.0), cal.KernelPoint("s", "b", False, 10.0)]
    forwards = [cal.ForwardPoint("s", 2, 4, 100.0)]
    host = [cal.HostPoint(w, 1.0) for w in ("copy", "kernel", "record", "query")]
    host += [cal.HostPoint("replay", 5.0), cal.HostPoint("enqueue", 205.0)]
    f = cal.fit(copies, kernels, forwards, host, enqueues=20)
    assert f.costs.launch_us == pytest.approx(10.0)
    assert f.costs.replay_us == 5.0 and f.costs.poll_us == 1.0
    assert f.costs.copy_latency_us == pytest.approx(3.98, abs=0.01) and f.costs.bandwidth_gbps == pytest.approx(50.0)
    assert f.forward_error == 0.0


def test_the_enqueues_of_a_replay_are_counted_on_the_simulator():
    # hybrid-4: the start event, each layer's copies and event, the graph's launch apart, and the rest.
    assert cal.enqueues_per_replay(cal.FORWARD_SHAPES[2]) > cal.enqueues_per_replay(cal.FORWARD_SHAPES[3]) > 0


def test_the_committed_calibration_is_what_the_simulator_runs_with_and_a_gpu_made_it():
    doc = json.loads(CALIBRATION.read_text())
    assert SimCosts().__dict__ == doc["costs"]
    env = doc["environment"]
    assert env["device"] == "cuda" and env["gpu"] and env["driver"] and env["git_commit"], env
    assert doc["command"][:2] == ["fence-harness", "calibrate"]
    # The costs are the fit of the points beside them: nobody edited one without the other.
    refit = cal.fit([cal.CopyPoint(**p) for p in doc["copies"]], [cal.KernelPoint(**p) for p in doc["kernels"]],
                    [cal.ForwardPoint(**{k: v for k, v in p.items() if k != "predicted_us"}) for p in doc["forwards"]],
                    [cal.HostPoint(**p) for p in doc["host"]], doc["enqueues_per_replay"])
    assert refit.costs == SimCosts()


def test_calibrate_without_a_gpu_is_one_line_and_exit_2():
    out = subprocess.run([sys.executable, "-m", "harness", "calibrate"], cwd=ROOT, capture_output=True, text=True,
                         env={"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"}, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "no CUDA device" in out.stderr


def test_only_the_copy_latency_may_be_zero():
    assert SimCosts.from_settings(["copy_latency_us=0"]).copy_latency_us == 0.0
    with pytest.raises(InputError, match="positive"):
        SimCosts.from_settings(["launch_us=0"])
