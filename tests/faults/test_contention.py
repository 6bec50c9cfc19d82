"""The pressure fault on the CPU: its keys, the simulator's no-op that says so, and the life of its
process (ready, stopped, killed when it will not stop, never outliving its parent, a failure as its
scenario's error). The contention's effect on a race is a GPU matter (tests/gpu/test_gpu_pressure.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import harness.faults.contention as pressure_module
import harness.run.pipeline as pipeline
from harness.devices.sim import SimDevice
from harness.faults.contention import InProcess, OtherProcess, Quiet, Workload, contention
from harness.input.scenario_file import parse_text
from harness.records.errors import PressureError
from harness.records.scenario import CopyDirection, Fault, FaultKind, Pressure, PressureProcess
from harness.report.results import build_results
from harness.report.schema import validate
from harness.run.pipeline import run_scenario
from tests.support.paths import ROOT

TINY = (ROOT / "tests" / "data" / "tiny.toml").read_text()
CPU = torch.device("cpu")
SMALL = Pressure(gemm=128, copy_mib=1)  # what a CPU can run without stealing the test machine
PY = sys.executable


def _tiny(fence: str = "none", **fault) -> object:
    scenario = next(s for s in parse_text(TINY, "tiny.toml") if s.fence == fence)
    return scenario.with_overrides(fault=Fault(FaultKind.PRESSURE, pressure=Pressure(**fault)))


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie has exited; only its exit status is left to collect


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


# ---------------------------------------------------------------- the scenario keys


def test_keys_default_and_describe_themselves():
    text = TINY.replace('fault = { kind = "delay", us = 500 }',
                        'fault = { kind = "pressure", gemm = 4096, gemm_streams = 2, copy = "h2d" }')
    s = parse_text(text, "t.toml")[0]
    assert s.fault == Fault(FaultKind.PRESSURE, pressure=Pressure(4096, 2, 256, CopyDirection.H2D,
                                                                   PressureProcess.SEPARATE))
    assert s.fault.describe() == "pressure (GEMM 4096 on 2 streams, 256 MiB h2d copies, separate process)"
    bare = parse_text(TINY.replace('{ kind = "delay", us = 500 }', '{ kind = "pressure" }'), "t.toml")[0]
    assert bare.fault.pressure == Pressure()  # GEMM 8192, 256 MiB both ways, another process
    only_copies = Pressure(gemm=0, copy_mib=64, copy=CopyDirection.D2H, process=PressureProcess.SAME)
    assert only_copies.describe() == "64 MiB d2h copies, same process"


def test_other_faults_have_no_contention():
    assert type(contention(Fault(), CPU)).__name__ == "Contention"
    assert contention(Fault(FaultKind.DELAY, 5.0), CPU).stop() is None


# ---------------------------------------------------------------- the simulator


def test_on_the_simulator_it_does_nothing_and_says_so():
    quiet = run_scenario(_tiny("final_event"), SimDevice(), replays=3)
    assert quiet.error is None and quiet.met and quiet.tally.stale_replays == 0
    assert quiet.fault_mode is not None and quiet.fault_mode.startswith("pressure: none on the simulator")
    assert quiet.pressure is not None and quiet.pressure["mode"] == "none" and quiet.pressure["achieved"] is None
    assert "nothing contends" in quiet.pressure["why"]
    # The same verdict as with no fault at all, on both sides of the fence.
    racy = run_scenario(_tiny("none"), SimDevice(), replays=3)
    plain = next(s for s in parse_text(TINY, "tiny.toml") if s.fence == "none").with_overrides(fault=Fault())
    assert (racy.tally, racy.findings) == (run_scenario(plain, SimDevice(), replays=3).tally,
                                           run_scenario(plain, SimDevice(), replays=3).findings)
    doc = json.loads(json.dumps(build_results([quiet, racy], SimDevice().describe(), time.time(), time.time())))
    validate(doc)
    assert doc["scenarios"][0]["pressure"]["settings"]["copy"] == "both"


def test_a_cuda_device_gets_the_process_or_the_threads(monkeypatch):
    made = []
    monkeypatch.setattr(pressure_module, "OtherProcess", lambda spec, device: made.append(("other", spec)))
    monkeypatch.setattr(pressure_module, "InProcess", lambda spec, device: made.append(("same", spec)))
    cuda = torch.device("cuda", 0)  # a device name only: nothing is allocated on it here
    contention(Fault(FaultKind.PRESSURE, pressure=Pressure()), cuda)
    contention(Fault(FaultKind.PRESSURE, pressure=Pressure(process=PressureProcess.SAME)), cuda)
    assert [m[0] for m in made] == ["other", "same"]
    assert isinstance(contention(Fault(FaultKind.PRESSURE, pressure=Pressure()), CPU), Quiet)


# ---------------------------------------------------------------- the workload


def test_the_workload_runs_every_stream_and_counts_what_it_did():
    w = Workload(Pressure(gemm=128, gemm_streams=2, copy_mib=1, copy=CopyDirection.BOTH), CPU)
    w.start(timeout_s=30)
    time.sleep(0.3)
    achieved = w.stop()
    assert w.error is None and achieved.seconds > 0
    assert achieved.gemms >= 2 and achieved.copies >= 2  # two GEMM streams, two copy directions
    assert achieved.gemm_tflops > 0 and achieved.copy_gbps > 0
    assert not any(t.is_alive() for t in w._threads)


def test_a_workload_that_cannot_start_is_one_error(monkeypatch):
    def broken(self):
        raise RuntimeError("no memory for the operands\nmore detail")

    monkeypatch.setattr(Workload, "_gemm_item", broken)
    w = Workload(SMALL, CPU)
    with pytest.raises(PressureError, match="failed to start: RuntimeError: no memory for the operands$"):
        w.start(timeout_s=30)


def test_in_process_contention_starts_and_stops():
    handle = InProcess(SMALL, device=CPU)
    assert handle.ready(30) == "pressure (same process: GEMM 128 on 1 stream, 1 MiB both copies)"
    deadline = time.monotonic() + 30  # a loaded runner: give its threads the time to count a GEMM
    counts = handle._workload._counts
    while time.monotonic() < deadline and not any(n for k, n in counts.items() if k.startswith("gemm")):
        time.sleep(0.01)
    record = handle.stop()
    assert record is not None and record["mode"] == "same process" and record["achieved"]["gemms"] >= 1
    assert handle.failed is None and handle.stop() == record  # stopping twice is harmless


# ---------------------------------------------------------------- the separate process


def test_the_real_process_starts_contends_and_stops_cleanly():
    handle = OtherProcess(SMALL, device=CPU)
    pid = handle.pid
    mode = handle.ready(120)
    assert mode == f"pressure (separate process, pid {pid}: GEMM 128 on 1 stream, 1 MiB both copies)"
    time.sleep(0.5)
    record = handle.stop()
    assert record is not None and record["mode"] == "separate process" and record["pid"] == pid
    assert record["exit_code"] == 0 and handle.failed is None
    assert record["achieved"]["gemms"] >= 1 and record["achieved"]["copies"] >= 1
    assert not _alive(pid)


def _fake(code: str) -> OtherProcess:
    return OtherProcess(SMALL, device=CPU, argv=[PY, "-c", code])


def test_a_process_that_never_says_ready_is_killed_after_the_timeout():
    handle = _fake("import time, sys; print('loading', file=sys.stderr, flush=True); time.sleep(600)")
    t0 = time.monotonic()
    with pytest.raises(PressureError, match=r"was not ready within 1s: loading$"):
        handle.ready(1)
    assert time.monotonic() - t0 < 10 and not _alive(handle.pid)


def test_a_process_that_dies_before_ready_says_why():
    handle = _fake("import sys; print('CUDA error: out of memory', file=sys.stderr); sys.exit(3)")
    with pytest.raises(PressureError, match=r"exited with code 3 before it was ready: CUDA error: out of memory$"):
        handle.ready(30)
    assert handle.stop()["exit_code"] == 3


def test_a_process_that_says_something_else_is_killed():
    handle = _fake("import time; print('hello', flush=True); time.sleep(600)")
    with pytest.raises(PressureError, match="should say 'ready'"):
        handle.ready(30)
    assert not _alive(handle.pid)


def test_a_process_that_ignores_the_end_of_its_input_and_sigterm_is_killed(monkeypatch):
    monkeypatch.setattr(pressure_module, "STOP_GRACE_S", 0.5)
    handle = _fake("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                   "print('ready', flush=True); time.sleep(600)")
    handle.ready(30)
    record = handle.stop()
    assert record["exit_code"] == -signal.SIGKILL and record["achieved"] is None and not _alive(handle.pid)


def test_a_process_that_dies_while_the_replays_run_fails_its_scenario(monkeypatch):
    # The pipeline gets a process that is ready and then dies: the scenario ends as an error.
    code = ("import sys, time; print('ready', flush=True); time.sleep(0.2); "
            "print('lost the GPU', file=sys.stderr); sys.exit(7)")
    monkeypatch.setattr(pipeline, "contention", lambda fault, device: _fake(code))
    slow = []
    r = run_scenario(_tiny("final_event"), SimDevice(), replays=3, on_replay=lambda i, v: slow.append(time.sleep(0.2)))
    assert r.error == f"pressure process (pid {r.pressure['pid']}) died with code 7 while the replays ran: lost the GPU"
    assert not r.met and r.pressure["exit_code"] == 7


def test_an_interrupt_mid_scenario_stops_the_process(monkeypatch):
    handles = []

    def start(fault, device):
        handles.append(_fake("import sys; print('ready', flush=True); sys.stdin.read(); print('{}')"))
        return handles[0]

    def interrupt(i, verdict):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "contention", start)
    with pytest.raises(KeyboardInterrupt):
        run_scenario(_tiny("none"), SimDevice(), replays=3, on_replay=interrupt)
    assert not _alive(handles[0].pid)


def test_a_failed_start_ends_the_scenario_not_the_run(monkeypatch):
    monkeypatch.setattr(pipeline, "contention", lambda fault, device: _fake("import sys; sys.exit(1)"))
    r = run_scenario(_tiny("none"), SimDevice(), replays=3)
    assert r.error is not None and r.error.startswith("pressure process exited with code 1 before it was ready")
    assert r.verdict is not None and not r.met


def test_the_process_does_not_outlive_a_killed_parent():
    # A parent that starts the real process and is then SIGKILLed (no chance to stop it).
    code = ("import time, torch\n"
            "from harness.faults.contention import OtherProcess\n"
            "from harness.records.scenario import Pressure\n"
            "p = OtherProcess(Pressure(gemm=128, copy_mib=1), device=torch.device('cpu'))\n"
            "p.ready(120)\n"
            "print(p.pid, flush=True)\n"
            "time.sleep(600)\n")
    parent = subprocess.Popen([PY, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert _alive(child)
    finally:
        parent.kill()
        parent.wait()
    assert _gone_within(child, 15), f"pressure process {child} outlived its parent"


def test_the_reports_say_what_the_contention_did_or_that_there_was_none():
    from harness.report.html import render_html
    from harness.report.summary import render_summary

    quiet = run_scenario(_tiny("final_event"), SimDevice(), replays=2)
    doc = json.loads(json.dumps(build_results([quiet], SimDevice().describe(), time.time(), time.time())))
    text = render_summary(doc)
    assert "**Pressure**" in text
    assert ("| tiny-full-final_event | none | GEMM 8192 ×1, 256 MiB both | none on the simulator: it models no "
            "work but the scenario's, so nothing contends (ran quiet) |") in text
    gpu = json.loads(json.dumps(doc))
    gpu["scenarios"][0]["pressure"] = {
        "mode": "separate process", "settings": gpu["scenarios"][0]["pressure"]["settings"], "pid": 4242,
        "exit_code": 0, "achieved": {"seconds": 12.5, "gemms": 9000, "copies": 2100, "gemm_tflops": 412.0,
                                     "copy_gbps": 44.1}}
    validate(gpu)
    row = "| separate process | GEMM 8192 ×1, 256 MiB both | 412 TFLOP/s, 44.1 GB/s over 12.5 s |"
    assert row in render_summary(gpu)
    assert "<h2>Pressure</h2>" in render_html(gpu) and "412 TFLOP/s" in render_html(gpu)


def test_a_process_never_waited_for_is_stopped_at_once(monkeypatch):
    # Its scenario ended before the replays (an error while building): no end-of-file grace.
    monkeypatch.setattr(pressure_module, "STOP_GRACE_S", 30.0)
    handle = _fake("import time; time.sleep(600)")
    t0 = time.monotonic()
    record = handle.stop()
    assert time.monotonic() - t0 < 10 and record["exit_code"] == -signal.SIGTERM and not _alive(handle.pid)
