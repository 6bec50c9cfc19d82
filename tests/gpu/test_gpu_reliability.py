"""A real out-of-memory on the GPU: one scenario's error, memory released, the next one runs."""

from __future__ import annotations

import pytest

from harness.input.scenario_file import default_files, load_files
from harness.records.scenario import (
    Backend,
    Expect,
    Fault,
    FaultKind,
    ModelShape,
    Request,
    Scenario,
)
from harness.run.pipeline import run_scenario

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cuda():
    from harness.devices.cuda import CudaDevice

    return CudaDevice()


def test_a_real_out_of_memory_is_that_scenarios_error_and_the_next_scenario_runs(cuda):
    import torch

    normal = {s.name: s for s in load_files(default_files())}["hybrid-full-final_event"]
    # Needs about 2 GiB of KV pool (16 layers x 32,768 tokens x 2 x 8 x 128 x 2 bytes).
    big = Scenario("oom", ModelShape(layers="A" * 16, hidden=1024, heads=8, kv_heads=8, head_dim=128),
                   (Request(32768, 32),), Backend.FULL, Expect.CLEAN, fence="final_event",
                   fault=Fault(FaultKind.DELAY, 100.0))
    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated()
    free, _ = torch.cuda.mem_get_info()
    hog = torch.empty(free - 512 * 2**20, dtype=torch.uint8, device="cuda")  # leave 512 MiB
    try:
        r = run_scenario(big, cuda, replays=2)
    finally:
        del hog
    assert r.error is not None and r.error.startswith("out of device memory"), r.error
    assert "\n" not in r.error and not r.met
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() <= baseline + 64 * 2**20  # what the scenario built is gone
    after = run_scenario(normal, cuda, replays=20)
    assert after.error is None and after.met
