"""vLLM's CPU offloading worker as the write-back, against an installed vllm, on the CPU simulator
(`make test-vllm` runs it on 0.13.0, 0.16.0 and 0.17.0; one release in process:
`PYTHONPATH=.engines/vllm-0.13.0`).

The store's stream and its waits are vLLM's own (`SingleDirectionOffloadingHandler.transfer_async`);
the harness supplies the block copy, the streams and events, and the host memory. Every scenario of
scenarios/engine/vllm_offload.toml must meet its expectation on the installed release; removing
vLLM's wait on the compute stream must turn a clean release into a race (teeth).
"""

from __future__ import annotations

import dataclasses
import importlib

import pytest
import torch

from tests.support.vllm_release import need

need("vllm", "vllm is not importable here; `make test-vllm` installs each release (PYTHONPATH=.engines/vllm-VERSION)")
from harness.engines import vllm_offload_load  # noqa: E402

# 0.27.0 on keeps the CPU offloading worker in kv_offload/cpu/gpu_worker.py (CPUOffloadingWorker),
# and the handler module the write-back drives (kv_offload/worker/cpu_gpu.py) is gone.
NEW_WORKER = vllm_offload_load.available()
if not NEW_WORKER:
    need("vllm.v1.kv_offload.worker.cpu_gpu",
         "vLLM's offloading worker is not importable here; the .[vllm] extra has its imports")

from harness.devices.sim import SimDevice  # noqa: E402
from harness.engines import vllm_offload  # noqa: E402
from harness.input.scenario_file import SCENARIO_DIR, load_file  # noqa: E402
from harness.records.scenario import Expect  # noqa: E402
from harness.run.pipeline import run_scenario  # noqa: E402
from harness.run.testbed import Testbed  # noqa: E402

FILE = SCENARIO_DIR / "engine" / "vllm_offload.toml"


def small(s):
    return s.with_overrides(model=dataclasses.replace(s.model, hidden=64, heads=2, kv_heads=1, head_dim=32))


# Their release expectations read the release through the vLLM adapter, which 0.27.0 on does not
# load here (its vllm.config needs Transformers 5, the .[vllm] extra pins 4).
SCENARIOS = [] if NEW_WORKER else [small(s) for s in load_file(FILE)]
BY_NAME = {s.name: s for s in SCENARIOS}
HANDLER = None if NEW_WORKER else importlib.import_module(vllm_offload.CPU_GPU).SingleDirectionOffloadingHandler
old_worker = pytest.mark.skipif(NEW_WORKER, reason="this release has no kv_offload/worker/cpu_gpu.py (0.27.0 on: "
                                "kv_offload/cpu/gpu_worker.py, driven by the load tests below)")
new_worker = pytest.mark.skipif(not NEW_WORKER, reason="this release has no kv_offload/cpu/gpu_worker.py "
                                "(CPUOffloadingWorker, 0.27.0 on)")


def vllm_offload_fault():
    from harness.records.scenario import Fault

    return Fault()


@old_worker
def test_the_store_goes_through_vllms_worker_and_handler():
    b = Testbed(BY_NAME["vllm.offload-store.gate"], SimDevice())
    wb = b.writeback
    assert isinstance(wb, vllm_offload.VllmOffload)
    assert isinstance(wb.handlers.gpu_to_cpu_handler, HANDLER)
    # vLLM's handler took the harness's device views as GPU memory and the host copy as its CPU tensors.
    assert wb.handlers.gpu_to_cpu_handler.src_tensors[0].is_cuda
    with b.dev.stream(b.forward):
        op = wb.write(vllm_offload.FaultPlan(vllm_offload_fault()), b.bed.transfer)
    b.dev.synchronize()
    assert op.finish_event.query()
    # one copy per request, per K and V, per layer: the mapping's runs are each request's new slots
    assert wb.copies == len(b.layout.requests) * 2 * 4
    assert wb.streams, "vLLM's handler made the store's stream itself"
    assert b.forward not in wb.streams


@old_worker
@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_every_offload_scenario_meets_its_expectation_on_this_release(scenario):
    r = run_scenario(scenario, SimDevice(), replays=3)
    assert r.error is None, r.error
    assert r.observed is scenario.expect, (scenario.name, r.observed, r.tally.stale_replays)
    if scenario.expect is Expect.RACE:
        assert r.tally.stale_replays == 3 and r.findings, scenario.name


@old_worker
def test_a_release_with_the_wait_is_clean_and_races_without_it(monkeypatch):
    """The teeth: vLLM's wait on the compute stream removed by patching its handler's module (the
    compute stream as the handler sees it is idle); a release that was clean must race."""
    scenario = BY_NAME["vllm.offload-store.gate"]
    if scenario.expect is not Expect.CLEAN:
        pytest.skip("this release has no wait on the compute stream to remove (before vllm-project/vllm#31341)")
    assert run_scenario(scenario, SimDevice(), replays=3).observed is Expect.CLEAN
    monkeypatch.setattr(vllm_offload.StreamsOf, "current_stream", lambda self, *a: self._o.idle)
    r = run_scenario(scenario, SimDevice(), replays=3)
    assert r.observed is Expect.RACE and r.tally.stale_replays == 3


@old_worker
def test_a_release_before_the_fix_enqueues_no_wait_on_the_compute_stream():
    scenario = BY_NAME["vllm.offload-store.gate"]
    calls = []
    b = Testbed(scenario, SimDevice())
    wb = b.writeback
    assert isinstance(wb, vllm_offload.VllmOffload)
    real = vllm_offload.StreamsOf.current_stream

    def noted(self, *a):
        calls.append(1)
        return real(self, *a)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(vllm_offload.StreamsOf, "current_stream", noted)
        with b.dev.stream(b.forward):
            wb.write(vllm_offload.FaultPlan(vllm_offload_fault()), b.bed.transfer)
    b.dev.synchronize()
    # The handler asks for the compute stream exactly where it waits on it (#31341), never before it.
    assert bool(calls) == (scenario.expect is Expect.CLEAN)


# ---- vllm-project/vllm#50696: the CPU-to-GPU load after a pending zeroing (0.27.0 on) -------------
def _load_has_the_fix() -> bool:
    import vllm
    from packaging.version import Version

    return Version(vllm.__version__).release >= (0, 28, 0)


@new_worker
def test_the_load_goes_through_vllms_worker_and_handler():
    o = vllm_offload_load.VllmOffloadLoad(SimDevice(), layers=2, blocks=8)
    gw = importlib.import_module(vllm_offload_load.GPU_WORKER)
    assert isinstance(o.worker, gw.CPUOffloadingWorker)
    assert isinstance(o.handler, gw.SingleDirectionOffloadingHandler) and not o.handler.gpu_to_cpu
    with o.dev.stream(o.dev.Stream("forward")):
        end = o.submit_load([2, 3, 4, 6], [0, 1, 2, 3])
    o.dev.synchronize()
    assert end.query()
    assert o.copies == 2 * 2  # per layer: the runs 2-4 and 6
    assert o.streams, "vLLM's handler made the load's stream itself"
    for lid in range(2):
        assert torch.equal(o.caches[lid][[2, 3, 4, 6]], o.host[lid][:4])


@new_worker
@pytest.mark.parametrize("fault", ["gate", "delay"])
def test_a_zeroing_then_vllms_load_meets_the_release(fault):
    """Before #50696 (0.27.0) the zeroing lands after the load: the forward reads zeros (data) and
    the analysis finds the unordered writes; from 0.28.0 the load waits on the compute stream."""
    r = vllm_offload_load.zero_then_load(SimDevice(), fault)
    if _load_has_the_fix():
        assert not r.race, (r.stale_blocks, r.findings)
    else:
        assert r.stale_blocks == 2 * 6 and r.findings
        assert {f.what for f in r.findings} == {"zero the freshly allocated blocks"}


@new_worker
def test_without_fault_only_the_analysis_sees_the_unfixed_load():
    r = vllm_offload_load.zero_then_load(SimDevice(), "none")
    assert r.stale_blocks == 0  # safe by timing
    assert bool(r.findings) is not _load_has_the_fix()


@new_worker
def test_removing_vllms_wait_on_the_compute_stream_races():
    """The teeth: the compute stream as the handler sees it is idle; every release races."""
    r = vllm_offload_load.zero_then_load(SimDevice(), "gate", waits_on_compute=False)
    assert r.stale_blocks == 2 * 6 and r.findings
