"""The pressure fault on a real GPU (skipped without CUDA): the contention runs, from another process
or this one, and stops; a correct fence stays clean under it; the unfenced graph at 2,048 cached
tokens races significantly more often under it than on a quiet GPU."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from harness.faults.contention import contention
from harness.input.scenario_file import SCENARIO_DIR, load_file
from harness.records.rates import Rate, exact_test
from harness.records.scenario import Fault, FaultKind, Pressure, PressureProcess
from harness.run.pipeline import run_scenario
from tests.support.replays import GATE_REPLAYS

pytestmark = pytest.mark.gpu

NATURAL = {s.name: s for s in load_file(SCENARIO_DIR / "natural.toml")}


@pytest.fixture(scope="module")
def cuda():
    from harness.devices.cuda import CudaDevice

    return CudaDevice()


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("process", list(PressureProcess))
def test_the_contention_runs_on_the_gpu_and_stops(cuda, process):
    handle = contention(Fault(FaultKind.PRESSURE, pressure=Pressure(process=process)), cuda.torch_device)
    mode = handle.ready()
    assert mode is not None and mode.startswith(f"pressure ({process.value} process")
    time.sleep(1.0)  # an H200 does hundreds of GEMMs and copies in that
    record = handle.stop()
    assert record is not None and handle.failed is None
    achieved = record["achieved"]
    # An H200 does hundreds of bf16 TFLOP/s and tens of GB/s each way over PCIe 5; a share of that
    # is contention enough (the GEMMs and copies also contend with each other).
    assert achieved["gemms"] > 10 and achieved["gemm_tflops"] > 20, achieved
    assert achieved["copies"] > 10 and achieved["copy_gbps"] > 5, achieved
    if process is PressureProcess.SEPARATE:
        assert record["exit_code"] == 0 and not _alive(record["pid"])
    torch.cuda.synchronize()


@pytest.mark.parametrize("name", ["natural-mha8-2k-pressure-full-layerwise_graph",
                                  "natural-mha8-2k-idle-pressure-full-final_event"])
def test_a_correct_fence_is_clean_under_pressure(cuda, name):
    r = run_scenario(NATURAL[name], cuda, replays=GATE_REPLAYS)
    assert r.error is None, r.error
    assert r.tally.stale_replays == 0 and not r.findings, dict(r.tally.layer_counts)
    assert r.pressure is not None and r.pressure["achieved"]["gemms"] > 0


def test_pressure_makes_the_unfenced_race_show_at_2048_tokens(cuda):
    # At the idle pace: queued, the quiet replays race already (the load gets no head start).
    # 60 each: measured on an H200, 0 of 100 quiet and 57 of 100 busy; at those rates 60 replays
    # a side make the difference significant (Fisher's exact test) with a wide margin.
    n = 60
    quiet = run_scenario(NATURAL["natural-mha8-2k-idle-full-none"], cuda, replays=n)
    busy = run_scenario(NATURAL["natural-mha8-2k-idle-pressure-full-none"], cuda, replays=n)
    assert quiet.error is None and busy.error is None, (quiet.error, busy.error)
    q, b = Rate(quiet.tally.stale_replays, n), Rate(busy.tally.stale_replays, n)
    assert b.value > q.value and exact_test(q, b).significant, (q, b)
