"""SimpleCPUOffloadConnector's worker as the write-back (vllm-project/vllm#45704, fixed by #46278 in
0.24.0), against an installed vllm, on the CPU simulator (`make test-vllm` runs it on 0.23.0, 0.24.0,
0.27.0 and 0.28.0; one release in process: `PYTHONPATH=.engines/vllm-0.23.0`).

The store's stream, its wait on the compute stream and its copies' srcAccessOrder are the worker's own;
the harness supplies the batched copy, the streams and events, the copy thread and the host memory.
Every scenario of scenarios/engine/vllm_simple_offload.toml must meet its expectation on the installed
release; each half of the fix removed must race where the release has it (teeth).
"""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from tests.support.vllm_release import need

need("vllm", "vllm is not importable here; `make test-vllm` installs each release (PYTHONPATH=.engines/vllm-VERSION)")
need("vllm.v1.simple_kv_offload.worker", "this release has no SimpleCPUOffloadConnector worker (0.19.0 on), or its "
     "import chain is not importable here")

from harness.devices.sim import SimDevice  # noqa: E402
from harness.engines import vllm_simple_offload  # noqa: E402
from harness.faults.plan import FaultPlan  # noqa: E402
from harness.input.scenario_file import SCENARIO_DIR, load_file  # noqa: E402
from harness.records.scenario import Expect, Fault  # noqa: E402
from harness.run.pipeline import run_scenario  # noqa: E402
from harness.run.testbed import Testbed  # noqa: E402

FILE = SCENARIO_DIR / "engine" / "vllm_simple_offload.toml"


def small(s):
    return s.with_overrides(model=dataclasses.replace(s.model, hidden=64, heads=2, kv_heads=1, head_dim=32))


SCENARIOS = [small(s) for s in load_file(FILE)]
BY_NAME = {s.name: s for s in SCENARIOS}
FIXED = BY_NAME["vllm.simple-offload-store.gate"].expect is Expect.CLEAN


def test_the_store_goes_through_the_connectors_own_worker():
    b = Testbed(BY_NAME["vllm.simple-offload-store.gate"], SimDevice())
    wb = b.writeback
    assert isinstance(wb, vllm_simple_offload.VllmSimpleOffload)
    worker = importlib.import_module(vllm_simple_offload.WORKER)
    assert isinstance(wb.worker, worker.SimpleCPUOffloadWorker)
    with b.dev.stream(b.forward):
        op = wb.write(FaultPlan(Fault()), b.bed.transfer)
    b.dev.synchronize()
    assert op.finish_event.query()
    # one copy a request per layer's K and V: the batch's pointer arrays, read back to runs of slots
    assert wb.copies == len(b.layout.requests) * 2 * 4
    assert len(wb.streams) == 2 and b.forward not in wb.streams  # the worker's load and store streams
    # the srcAccessOrder each release's stores read with: ANY before #46278, STREAM from it
    order = vllm_simple_offload.SRC_ACCESS_ORDER_STREAM if FIXED else vllm_simple_offload.SRC_ACCESS_ORDER_ANY
    assert wb.orders == {order}
    for a in range(4):
        for r in b.layout.requests:
            assert (b.bed.writeback.host.k[a][r.tokens.start : r.tokens.stop]
                    == b.pool.kv.k[a][r.new.start : r.new.stop]).all()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_every_simple_offload_scenario_meets_its_expectation_on_this_release(scenario):
    r = run_scenario(scenario, SimDevice(), replays=3)
    assert r.error is None, r.error
    assert r.observed is scenario.expect, (scenario.name, r.observed, r.tally.stale_replays)
    if scenario.expect is Expect.RACE:
        assert r.tally.stale_replays == 3 and r.findings, scenario.name
        assert {f.kind.value for f in r.findings} == {"store-before-compute"}
    else:
        assert r.tally.stale_replays == 0 and not r.findings


def test_the_stores_source_read_out_of_stream_order_races_even_behind_the_wait(monkeypatch):
    """The fix's other half: with the compute-done wait kept, stores whose source may be read out of
    stream order (srcAccessOrder ANY, as before #46278) still read the KV before the forward wrote it."""
    if not FIXED:
        pytest.skip("this release has neither half of the fix (before vllm-project/vllm#46278)")
    backend = importlib.import_module(vllm_simple_offload.BACKEND)
    monkeypatch.setattr(backend, "CU_MEMCPY_SRC_ACCESS_ORDER_STREAM", vllm_simple_offload.SRC_ACCESS_ORDER_ANY)
    r = run_scenario(BY_NAME["vllm.simple-offload-store.gate"], SimDevice(), replays=3)
    assert r.error is None and r.observed is Expect.RACE and r.tally.stale_replays == 3
