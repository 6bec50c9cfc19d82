"""vLLM's CPU offloading worker against an installed vllm, on the CPU simulator: its store as the
write-back (`make test-vllm` runs it on 0.13.0, 0.16.0 and 0.17.0) and, from 0.27.0, its load after a
pending zeroing of its blocks (0.27.0 and 0.28.0); one release in process: `PYTHONPATH=.engines/vllm-0.13.0`.

The store's and the load's streams and waits are vLLM's own (`SingleDirectionOffloadingHandler.transfer_async`);
the harness supplies the block copy, the streams and events, and the host memory. Every scenario of
scenarios/engine/vllm_offload.toml (the store) and vllm_offload_load.toml (the load) must meet its
expectation on the installed release; removing vLLM's wait on the compute stream must turn a clean
release into a race (teeth).
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
from harness.faults.plan import FaultPlan  # noqa: E402
from harness.input.scenario_file import SCENARIO_DIR, load_file  # noqa: E402
from harness.records.scenario import Expect, Fault  # noqa: E402
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


@old_worker
def test_the_store_goes_through_vllms_worker_and_handler():
    b = Testbed(BY_NAME["vllm.offload-store.gate"], SimDevice())
    wb = b.writeback
    assert isinstance(wb, vllm_offload.VllmOffload)
    assert isinstance(wb.handlers.gpu_to_cpu_handler, HANDLER)
    # vLLM's handler took the harness's device views as GPU memory and the host copy as its CPU tensors.
    assert wb.handlers.gpu_to_cpu_handler.src_tensors[0].is_cuda
    with b.dev.stream(b.forward):
        op = wb.write(FaultPlan(Fault()), b.bed.transfer)
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
            wb.write(FaultPlan(Fault()), b.bed.transfer)
    b.dev.synchronize()
    # The handler asks for the compute stream exactly where it waits on it (#31341), never before it.
    assert bool(calls) == (scenario.expect is Expect.CLEAN)


# ---- vllm-project/vllm#50696: the CPU-to-GPU load after a pending zeroing (0.27.0 on) -------------
LOAD_FILE = SCENARIO_DIR / "engine" / "vllm_offload_load.toml"
LOAD_SCENARIOS = [small(s) for s in load_file(LOAD_FILE)] if NEW_WORKER else []
LOAD_BY_NAME = {s.name: s for s in LOAD_SCENARIOS}


@new_worker
def test_the_load_goes_through_vllms_worker_and_handler():
    b = Testbed(LOAD_BY_NAME["vllm.offload-load-zeroing.gate"], SimDevice())
    load = b.engine_load
    assert isinstance(load, vllm_offload_load.VllmOffloadLoad)
    gw = importlib.import_module(vllm_offload_load.GPU_WORKER)
    assert isinstance(load.worker, gw.CPUOffloadingWorker)
    assert isinstance(load.handler, gw.SingleDirectionOffloadingHandler) and not load.handler.gpu_to_cpu
    with b.dev.stream(b.forward):
        op = b.start_load(FaultPlan(Fault()))
    b.dev.synchronize()
    assert op.finish_event.query() and load.end_event is not None and load.end_event.query()
    # one submit_load of both requests' prefixes: per layer's K and V, one run of slots a request
    assert load.copies == 4 * 2 * len(b.layout.requests)
    assert load.streams and b.forward not in load.streams, "vLLM's handler made the load's stream itself"
    for a in range(4):
        for r in b.layout.requests:
            rows = slice(r.host_offset, r.host_offset + len(r.prefix))
            assert torch.equal(b.pool.kv.k[a][r.prefix.start : r.prefix.stop], b.host.k[a][rows])
            assert torch.equal(b.pool.kv.v[a][r.prefix.start : r.prefix.stop], b.host.v[a][rows])


@new_worker
@pytest.mark.parametrize("scenario", LOAD_SCENARIOS, ids=[s.name for s in LOAD_SCENARIOS])
def test_every_offload_load_scenario_meets_its_expectation_on_this_release(scenario):
    """Before #50696 (0.27.0) the load lands before the zeroing and is wiped: the forward reads zeros
    (data) and the analysis finds the unordered writes; from 0.28.0 the load waits on the compute
    stream. The wait removed (transfer no_load_fence) races on every release."""
    r = run_scenario(scenario, SimDevice(), replays=3)
    assert r.error is None, r.error
    assert r.observed is scenario.expect, (scenario.name, r.tally.stale_replays, len(r.findings))
    if scenario.expect is Expect.RACE:
        assert "zero the freshly allocated blocks" in {f.what for f in r.findings}
        if scenario.fault.kind.value == "gate":
            assert r.tally.stale_replays == 3  # every replay: the gate decides it
    else:
        assert r.tally.stale_replays == 0 and not r.findings


# ---- the OffloadingConnector's store through CPUOffloadingWorker.submit_store (0.27.0 on) -------------
STORE_FILE = SCENARIO_DIR / "engine" / "vllm_offload_store.toml"
STORE_SCENARIOS = [small(s) for s in load_file(STORE_FILE)] if NEW_WORKER else []
STORE_BY_NAME = {s.name: s for s in STORE_SCENARIOS}


@new_worker
def test_the_store_goes_through_vllms_cpu_offloading_worker():
    from harness.engines import vllm_worker_store

    b = Testbed(STORE_BY_NAME["vllm.offload-worker-store.gate"], SimDevice())
    wb = b.writeback
    assert isinstance(wb, vllm_worker_store.VllmWorkerStore)
    gw = importlib.import_module(vllm_offload_load.GPU_WORKER)
    assert isinstance(wb.worker, gw.CPUOffloadingWorker)
    with b.dev.stream(b.forward):
        op = wb.write(FaultPlan(Fault()), b.bed.transfer)
    b.dev.synchronize()
    assert op.finish_event.query()
    assert wb.copies == 4 * 2 * len(b.layout.requests)  # per layer's K and V, one run of slots a request
    assert wb.streams and b.forward not in wb.streams


@new_worker
@pytest.mark.parametrize("scenario", STORE_SCENARIOS, ids=[s.name for s in STORE_SCENARIOS])
def test_every_worker_store_scenario_meets_its_expectation_on_this_release(scenario):
    r = run_scenario(scenario, SimDevice(), replays=3)
    assert r.error is None, r.error
    assert r.observed is scenario.expect, (scenario.name, r.observed, r.tally.stale_replays)
    if scenario.expect is Expect.RACE:
        assert r.tally.stale_replays == 3 and {f.kind.value for f in r.findings} == {"store-before-compute"}


@new_worker
def test_a_store_reading_its_source_out_of_stream_order_races_behind_the_wait(monkeypatch):
    """Why the worker asks for stream order on stores: with its wait on the compute stream kept, a store
    whose source may be read out of stream order reads the KV before the forward wrote it."""
    from harness.engines import vllm_worker_store

    real = vllm_worker_store.VllmWorkerStore._swap_blocks_batch

    def out_of_order(self, src, dst, sizes, *args, **kwargs):
        kwargs["is_src_access_order_any"] = True
        return real(self, src, dst, sizes, *args, **kwargs)

    monkeypatch.setattr(vllm_worker_store.VllmWorkerStore, "_swap_blocks_batch", out_of_order)
    r = run_scenario(STORE_BY_NAME["vllm.offload-worker-store.gate"], SimDevice(), replays=3)
    assert r.error is None and r.observed is Expect.RACE and r.tally.stale_replays == 3


@new_worker
@pytest.mark.parametrize("access_us", [1.0, 79.4, 5000.0])
def test_the_ground_truth_waits_for_the_zeroing_however_long_it_takes(access_us):
    """0.27.0's load is not ordered after the forward stream (from 0.28.0 it is), and the ground
    truth loads through it too: the host waits for the hazard's zeroing before the truth's load
    starts, so the truth holds the loaded prefix whatever the zeroing costs (at 79.4 us, the H200's
    calibration at 9c9e7d7, a truth that did not wait lost layer 0's K to the zeroing and the
    scenario came out `wrong`)."""
    scenario = LOAD_BY_NAME["vllm.offload-load-zeroing.gate"]
    dev = SimDevice()
    dev.costs = dataclasses.replace(dev.costs, access_us=access_us)
    r = run_scenario(scenario, dev, replays=1)
    assert r.error is None and r.verdict is not None and r.verdict.not_restored is None, r.verdict
    assert r.observed is scenario.expect  # a race on 0.27.0, clean from 0.28.0
