"""Value waits on a real GPU (skipped without CUDA): captured as graph nodes, they hold a replay until
the flag is written; `layerwise_value` is clean over 1,000 gated replays; its mutants read stale data."""

from __future__ import annotations

import time

import pytest
import torch

from harness.input.scenario_file import SCENARIO_DIR, default_files, load_files
from harness.protocol.fences import ARMED, LOADED
from harness.records.scenario import Fault, FaultKind
from harness.records.trace import Region
from harness.run.pipeline import run_scenario
from tests.support.replays import GATE_REPLAYS, SOAK_REPLAYS

pytestmark = pytest.mark.gpu

DEFAULT = {s.name: s for s in load_files(default_files())}
MATRIX = {s.name: s for s in load_files([SCENARIO_DIR / "mutants" / "kill_matrix.toml"])}


@pytest.fixture(scope="module")
def cuda():
    from harness.devices.cuda import CudaDevice

    return CudaDevice()


def test_a_captured_value_wait_holds_the_replay_until_the_flag_is_written(cuda):
    flags = cuda.Flags(1, LOADED)  # loaded: the capture's warm-up passes
    dst = torch.zeros(1 << 20, device=cuda.torch_device)
    out = torch.zeros_like(dst)
    fwd, load = cuda.Stream("forward"), cuda.Stream("load")
    region = Region("k", 0, 0, 1)

    def body() -> None:
        flags.wait(0, LOADED)
        cuda.launch(lambda: out.copy_(dst), reads=[region])

    with cuda.stream(fwd):
        graph = cuda.capture(body)
        flags.write_all(ARMED)
        start = cuda.Event()
        start.record()
        graph.replay()
        done = cuda.Event()
        done.record()
    time.sleep(0.05)
    assert not done.query()  # the graph's wait node holds it: the flag is armed
    with cuda.stream(load):
        start.wait()
        dst.fill_(3.0)
        flags.write(0, LOADED)
    cuda.synchronize(10.0)
    assert done.query() and torch.all(out == 3.0)


@pytest.mark.nightly  # the gate runs correct.layerwise_value.gate as a kill-matrix item
def test_layerwise_value_is_clean_over_1000_gated_replays(cuda):
    base = DEFAULT["gate-full-none"]
    bad = run_scenario(base.with_overrides(fault=Fault(FaultKind.GATE)), cuda, replays=GATE_REPLAYS)
    assert bad.tally.stale_replays == GATE_REPLAYS  # the teeth
    r = run_scenario(base.with_overrides(fence="layerwise_value"), cuda, replays=SOAK_REPLAYS)
    assert r.error is None and r.tally.replays == SOAK_REPLAYS and r.tally.stale_replays == 0 and not r.findings


@pytest.mark.parametrize("name", ["mutant.value_flag_before_copies", "mutant.value_flag_not_rearmed"])
def test_the_value_wait_mutants_read_stale_data_on_the_gpu(cuda, name):
    r = run_scenario(MATRIX[name], cuda, replays=GATE_REPLAYS)
    assert r.error is None and r.tally.stale_replays > 0 and r.met, (r.tally.stale_replays, r.error)
