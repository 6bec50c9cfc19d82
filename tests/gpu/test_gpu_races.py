"""Races and fixes on a real GPU. Skipped with a reason where torch sees no CUDA device.

Each race test has its twin: the same scenario with the fence removed (or the
waits turned off) must read stale data, or the clean result proves nothing.
"""

from __future__ import annotations

import pytest

from harness.input.scenario_file import default_files, load_files
from harness.records.scenario import Backend, DelayWhere, Expect, Fault, FaultKind
from harness.run.pipeline import run_scenario
from tests.support.replays import GATE_REPLAYS, SOAK_REPLAYS

pytestmark = pytest.mark.gpu

DEFAULT = {s.name: s for s in load_files(default_files())}
KINDS = ("attention", "mamba", "hybrid")


@pytest.fixture(scope="module")
def cuda():
    from harness.devices.cuda import CudaDevice

    return CudaDevice()


# Every default scenario meeting its expectation is checked by `make gpu-test` through the pytest
# plugin (one item per scenario, `--harness-scenarios`), so it is not repeated here.


@pytest.mark.parametrize("kind", KINDS)
def test_full_graph_without_fence_reads_stale_and_the_last_layer_most(cuda, kind):
    # How often a delay races depends on the host's enqueue time: at 200 us before each copy,
    # H200 hosts here went from 0% to 100% of 300 replays between runs. At 1 ms (the default
    # set's) the load outlasts any launch gap seen. The gate (tests/gpu/test_gpu_injector.py) is
    # what makes it every replay. Here: it races, localised the way the copy order says.
    s = DEFAULT[f"{kind}-full-none"]
    assert s.fault.us == 1000 and s.backend is Backend.FULL and s.fence == "none"
    r = run_scenario(s, cuda, replays=100)
    assert r.error is None, r.error
    assert r.tally.stale_replays > 0
    layers = r.tally.layer_counts
    assert set(layers) <= set(range(s.model.num_layers))
    # The last layer's copy is the latest, so no layer is stale more often.
    assert layers[s.model.num_layers - 1] == max(layers.values()), dict(layers)


@pytest.mark.nightly  # the gate runs each *-full-final_event scenario as an item, at GATE_REPLAYS
@pytest.mark.parametrize("kind", KINDS)
def test_final_event_fence_is_clean_over_1000_replays(cuda, kind):
    s = DEFAULT[f"{kind}-full-final_event"]
    r = run_scenario(s, cuda, replays=SOAK_REPLAYS)
    assert r.error is None, r.error
    assert r.tally.replays == SOAK_REPLAYS
    assert r.tally.stale_replays == 0, dict(r.tally.layer_counts)
    # Teeth: the very same scenario without the fence is caught, every replay, under the gate
    # (a 200 us delay races only as often as the host's timing allows).
    gated = s.with_overrides(fence="none", expect=Expect.RACE, fault=Fault(FaultKind.GATE))
    bad = run_scenario(gated, cuda, replays=GATE_REPLAYS)
    assert bad.tally.stale_replays == GATE_REPLAYS


@pytest.mark.parametrize("kind", KINDS)
def test_breakable_waits_fire_and_stay_clean(cuda, kind):
    s = DEFAULT[f"{kind}-breakable-none"]
    r = run_scenario(s, cuda, replays=GATE_REPLAYS)
    assert r.error is None, r.error
    assert r.tally.stale_replays == 0, dict(r.tally.layer_counts)
    # Teeth: the same breakable runner with the accessors' waits off races (under a delay
    # long enough to outlast the eager ops' host launch time, as the eager controls use).
    long_first = Fault(FaultKind.DELAY, 10_000.0, DelayWhere.FIRST)
    bad = run_scenario(s.with_overrides(accessor="none", fault=long_first), cuda, replays=20)
    assert bad.tally.stale_replays > 0
