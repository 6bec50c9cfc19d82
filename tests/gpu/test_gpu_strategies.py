"""Fence strategies on a real GPU (skipped without CUDA): each correct one clean where none races."""

from __future__ import annotations

import pytest

from harness.input.scenario_file import default_files, load_files
from harness.protocol.fences import STRATEGIES
from harness.records.scenario import Fault, FaultKind
from harness.run.pipeline import run_scenario
from tests.support.replays import GATE_REPLAYS, SOAK_REPLAYS

pytestmark = pytest.mark.gpu

DEFAULT = {s.name: s for s in load_files(default_files())}


@pytest.fixture(scope="module")
def cuda():
    from harness.devices.cuda import CudaDevice

    return CudaDevice()


@pytest.fixture(scope="module")
def unfenced_gated(cuda):
    """The teeth, once per base scenario (every strategy shares them): unfenced, the same model
    and batch under the gate, and how many of its replays were stale."""
    runs: dict[str, int] = {}

    def stale(base: str) -> int:
        if base not in runs:
            bad = DEFAULT[base].with_overrides(fault=Fault(FaultKind.GATE))
            runs[base] = run_scenario(bad, cuda, replays=GATE_REPLAYS).tally.stale_replays
        return runs[base]

    return stale


@pytest.mark.parametrize("base", ["gate-full-none", "hybrid-full-none"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_correct_strategy_is_clean_where_none_races(cuda, unfenced_gated, strategy, base):
    s = DEFAULT[base]
    assert unfenced_gated(base) == GATE_REPLAYS  # unfenced, it races in every replay
    r = run_scenario(s.with_overrides(fence=strategy), cuda, replays=GATE_REPLAYS)
    assert r.error is None, r.error
    assert r.tally.stale_replays == 0 and not r.findings, (strategy, dict(r.tally.layer_counts))


@pytest.mark.nightly
def test_layerwise_graph_is_clean_over_1000_gated_replays(cuda):
    r = run_scenario(DEFAULT["gate-full-none"].with_overrides(fence="layerwise_graph"), cuda, replays=SOAK_REPLAYS)
    assert r.error is None and r.tally.replays == SOAK_REPLAYS and r.tally.stale_replays == 0
