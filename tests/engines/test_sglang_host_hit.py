"""A full-length host-tier hit on a hybrid model with a sparse-attention index through the installed
SGLang's own hybrid load chain (sgl-project/sglang#39830), on the CPU simulator (`make test-engine`;
another release with `PYTHONPATH=.engines/sglang-VERSION`).

`scenarios/engine/sglang_host_hit.toml`: Gated-DeltaNet-style layers with attention every fourth
layer, the QSA indexer beside each attention layer, pages of 64. A release whose hybrid assembler
has the index's host pool (`QSAIndexerPoolHost`, 0.5.22 on) restores the index in each attention
layer's step and its accessor waits for it; one without (0.5.20, 0.5.21) restores the KV and the
Mamba state and leaves the index as it was: wrong with every load landed, before any replay.
"""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("sglang", reason="sglang is not installed here; `make test-engine` installs it")

from harness.devices.sim import SimDevice  # noqa: E402
from harness.engines import sglang as adapter  # noqa: E402
from harness.engines.sglang_pools import _qsa_pool_class  # noqa: E402
from harness.frontends.engine_matrix import SMALL  # noqa: E402
from harness.input.scenario_file import SCENARIO_DIR, load_file  # noqa: E402
from harness.protocol.layout import index_regions, plan_layout  # noqa: E402
from harness.records.errors import describe_regions  # noqa: E402
from harness.records.scenario import Expect  # noqa: E402
from harness.run.pipeline import run_scenario  # noqa: E402

FILE = SCENARIO_DIR / "engine" / "sglang_host_hit.toml"
SCENARIOS = [s.with_overrides(model=dataclasses.replace(s.model, **SMALL)) for s in load_file(FILE)]
REPLAYS = 3


def _named(name):
    return next(s for s in SCENARIOS if s.name.endswith(name))


def _assembler():
    return adapter.load().modules[adapter.ASSEMBLER]


def _restores_the_index() -> bool:
    return hasattr(_assembler(), "QSAIndexerPoolHost")


def _the_index_of_every_attention_layer(s) -> str:
    layout = plan_layout(s.model, s.batch)
    return describe_regions(tuple(r for lid in s.model.attention_layers for r in index_regions(layout, lid)))


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_every_host_hit_scenario_meets_its_expectation_on_this_release(scenario):
    r = run_scenario(scenario, SimDevice(), replays=REPLAYS)
    assert r.error is None, r.error
    assert r.observed is scenario.expect, (r.not_restored, dict(r.tally.layer_counts), len(r.findings))
    if scenario.expect is Expect.WRONG:
        # the KV and the Mamba state came back; the index of each attention layer did not, and no replay ran
        assert r.not_restored == _the_index_of_every_attention_layer(scenario)
        assert r.tally.replays == 0 and not r.findings
    elif scenario.expect is Expect.CLEAN:
        assert not r.findings  # clean in the data and in the happens-before analysis
    else:
        assert r.tally.stale_replays == r.tally.replays == REPLAYS and r.findings


def test_the_index_comes_back_through_the_engines_own_host_pool_as_the_kvs_sidecar(monkeypatch):
    if not _restores_the_index():
        pytest.skip(f"sglang {adapter.load().version} has no host pool for the index")
    m = adapter.load().modules
    controller = m[adapter.HYBRID].HybridCacheController
    # the class that defines the index host pool's per-layer load (its kernel is looked up in that module)
    index_host = next(c for c in _assembler().QSAIndexerPoolHost.__mro__ if "load_to_device_per_layer" in vars(c))
    loads, layers, sidecars = [], [], []
    original_load, original_layer = controller.load, index_host.load_to_device_per_layer

    def load(self, host_indices, *a, extra_pools=None, **k):
        loads.append(1)
        sidecars.extend((p.name.value, p.indices_from_pool and p.indices_from_pool.value)
                        for p in extra_pools or () if p.name.value == "indexer")
        return original_load(self, host_indices, *a, extra_pools=extra_pools, **k)

    def load_to_device_per_layer(self, device_pool, host_indices, device_indices, layer_id, *a, **k):
        if type(self).__name__ == "QSAIndexerPoolHost":
            layers.append(layer_id)
        return original_layer(self, device_pool, host_indices, device_indices, layer_id, *a, **k)

    monkeypatch.setattr(controller, "load", load)
    monkeypatch.setattr(index_host, "load_to_device_per_layer", load_to_device_per_layer)
    s = _named("qsa-breakable.delay")
    r = run_scenario(s, SimDevice(), replays=REPLAYS)
    assert r.error is None and r.observed is Expect.CLEAN, r.error
    assert sidecars == [("indexer", "kv")] * len(loads)  # each load op: the index rides on the KV rows
    # each load op: the index host pool once per attention layer, by the KV pool's own layer index
    assert layers == list(range(len(s.model.attention_layers))) * len(loads)


def test_the_index_accessor_with_its_wait_removed_reads_the_index_before_it_lands(monkeypatch):
    """The teeth of the engine's own wait: its `get_qsa_compressed_k_buffer` without
    `_wait_for_layer` (as it was before the index had a host pool) under the breakable runner."""
    if not _restores_the_index():
        pytest.skip(f"sglang {adapter.load().version} never restores the index: there is no load to wait for")
    monkeypatch.setattr(_qsa_pool_class(), "get_qsa_compressed_k_buffer",
                        lambda self, layer_id: self.qsa_compressed_k_buffer_pool[
                            self._transfer_full_attention_id(layer_id)])
    s = _named("qsa-breakable.delay")
    r = run_scenario(s, SimDevice(), replays=REPLAYS)
    assert r.error is None and r.observed is Expect.RACE, r.error
    assert r.tally.stale_replays == REPLAYS and r.findings
    assert set(r.tally.layer_counts) == set(s.model.attention_layers) and set(r.tally.pool_counts) == {"idx"}


def test_without_the_index_host_pool_exactly_the_index_is_left_unrestored(monkeypatch):
    """The teeth of the restore: this release's assembler with its index host pool taken away (as
    0.5.20 and 0.5.21 ship it) leaves exactly the index of every attention layer as it was."""
    if _restores_the_index():
        monkeypatch.delattr(_assembler(), "QSAIndexerPoolHost")
    s = _named("qsa-execute.gate")
    r = run_scenario(s, SimDevice(), replays=REPLAYS)
    assert r.error is None and r.observed is Expect.WRONG, r.error
    assert r.not_restored == _the_index_of_every_attention_layer(s)
