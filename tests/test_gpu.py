"""Races and fixes on a real GPU. Skipped with a reason where torch sees no CUDA device.

Each race test has its twin: the same scenario with the fence removed (or the
waits turned off) must read stale data, or the clean result proves nothing.
"""

from __future__ import annotations

import pytest

from harness.pipeline import run_scenario
from harness.scenario import Backend, DelayWhere, Expect, Fault, FaultKind
from harness.scenario_file import default_files, load_files

pytestmark = pytest.mark.gpu

DEFAULT = {s.name: s for s in load_files(default_files())}
KINDS = ("attention", "mamba", "hybrid")


@pytest.fixture(scope="module")
def cuda():
    from harness.devices.cuda import CudaDevice

    return CudaDevice()


@pytest.mark.parametrize("name", sorted(DEFAULT))
def test_default_scenario_meets_expectation(cuda, name):
    r = run_scenario(DEFAULT[name], cuda)
    assert r.error is None, r.error
    assert r.observed == r.scenario.expect, (
        f"{name}: expected {r.scenario.expect}, observed {r.observed} "
        f"({r.tally.stale_replays}/{r.tally.replays} stale, layers {dict(r.tally.layer_counts)})"
    )


@pytest.mark.parametrize("kind", KINDS)
def test_full_graph_without_fence_reads_stale_nearly_always(cuda, kind):
    s = DEFAULT[f"{kind}-full-none"]
    assert s.fault.us == 200 and s.backend is Backend.FULL and s.fence == "none"
    r = run_scenario(s, cuda, replays=300)
    assert r.error is None, r.error
    assert r.tally.stale_rate >= 0.99, f"{r.tally.stale_replays}/{r.tally.replays} stale"
    # Localised per layer: the last layer's copy is the latest, so it is always stale.
    layers = r.tally.layer_counts
    assert set(layers) <= set(range(s.model.num_layers))
    assert layers[s.model.num_layers - 1] >= 0.99 * r.tally.replays, dict(layers)


@pytest.mark.parametrize("kind", KINDS)
def test_final_event_fence_is_clean_over_1000_replays(cuda, kind):
    s = DEFAULT[f"{kind}-full-final_event"]
    r = run_scenario(s, cuda, replays=1000)
    assert r.error is None, r.error
    assert r.tally.replays == 1000
    assert r.tally.stale_replays == 0, dict(r.tally.layer_counts)
    # Teeth: the very same scenario without the fence must be caught.
    bad = run_scenario(s.with_overrides(fence="none", expect=Expect.RACE), cuda, replays=50)
    assert bad.tally.stale_replays > 0


@pytest.mark.parametrize("kind", KINDS)
def test_breakable_waits_fire_and_stay_clean(cuda, kind):
    s = DEFAULT[f"{kind}-breakable-none"]
    r = run_scenario(s, cuda, replays=500)
    assert r.error is None, r.error
    assert r.tally.stale_replays == 0, dict(r.tally.layer_counts)
    # Teeth: the same breakable runner with the accessors' waits off races (under a delay
    # long enough to outlast the eager ops' host launch time, as the eager controls use).
    long_first = Fault(FaultKind.DELAY, 10_000.0, DelayWhere.FIRST)
    bad = run_scenario(s.with_overrides(accessor="none", fault=long_first), cuda, replays=20)
    assert bad.tally.stale_replays > 0
