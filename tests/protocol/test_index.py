"""A sparse-attention index beside each attention layer (`indexer`, the QSA indexer of Qwen4-Exp
models, sgl-project/sglang#39830): where its rows live, how the load-back restores them, that the
indexer's read races without its accessor's wait and is clean with it, and the verdict `wrong` for
a load op that every wait has let land and that still left slots unrestored."""

from __future__ import annotations

import dataclasses

import pytest

from harness.devices.sim import SimDevice
from harness.faults.plan import FaultPlan
from harness.input.scenario_file import parse_text
from harness.protocol.layout import index_regions, plan_layout, prefix_regions
from harness.protocol.loadback import plan_copies
from harness.protocol.pools import HostPool, HybridPool
from harness.records.errors import InputError, NotRestored
from harness.records.scenario import Backend, Expect, Fault, FaultKind, ModelShape, Request
from harness.records.trace import Pool, Region
from harness.report.results import scenario_entry
from harness.report.schema import SCENARIO, _check
from harness.run.pipeline import ScenarioResult, run_scenario
from harness.run.testbed import Testbed
from harness.run.verdict import decide
from tests.support.builders import small_scenario

# The report's layout shrunk: Mamba first, attention every fourth layer, pages of 16 holding 4 groups.
SHAPE = ModelShape(layers="MMMAMMMA", hidden=64, heads=2, kv_heads=1, head_dim=32, state=4, page_size=16,
                   indexer=4)
BATCH = (Request(48, 4), Request(16, 2))
DELAY = Fault(FaultKind.DELAY, us=1000)


def _scenario(**changes):
    return small_scenario(model=SHAPE, batch=BATCH, **changes)


def test_the_index_rows_are_the_prefixes_compressed_slots_after_the_kv():
    layout = plan_layout(SHAPE, BATCH)
    r0, r1 = layout.requests
    assert index_regions(layout, 3) == [Region(Pool.IDX, 3, r0.prefix.start // 4, r0.prefix.stop // 4),
                                        Region(Pool.IDX, 3, r1.prefix.start // 4, r1.prefix.stop // 4)]
    assert [r.pool for r in prefix_regions(layout, 3)] == ["k", "v", "k", "v", "idx", "idx"]
    assert index_regions(layout, 0) == index_regions(plan_layout(dataclasses.replace(SHAPE, indexer=0), BATCH), 3) \
        == []


def test_the_load_back_copies_each_requests_index_rows_from_its_host_rows():
    dev = SimDevice()
    layout = plan_layout(SHAPE, BATCH)
    host, pool = HostPool(dev, layout, 0), HybridPool(dev, layout)
    (copies,) = plan_copies(layout, host, pool)[3]
    index = [c for c in copies if c.region.pool == Pool.IDX]
    r1 = layout.requests[1]
    first = r1.host_offset // 4  # the host's index rows follow the requests' prefixes, as the KV rows do
    assert [c.source for c in index] == [Region("host_idx", 3, 0, 12), Region("host_idx", 3, first, first + 4)]
    assert index[1].dst.data_ptr() == pool.kv.idx[0, r1.prefix.start // 4].data_ptr()
    assert index[1].src.data_ptr() == host.idx[0, first].data_ptr()


def test_an_unfenced_full_graph_reads_the_index_stale_and_the_final_event_orders_it():
    r = run_scenario(_scenario(fault=Fault(FaultKind.GATE)), SimDevice(), replays=3)
    assert r.error is None and r.observed is Expect.RACE and r.tally.stale_replays == 3
    assert "idx" in r.tally.pool_counts
    r = run_scenario(_scenario(fence="final_event", expect=Expect.CLEAN, fault=Fault(FaultKind.GATE)), SimDevice(),
                     replays=3)
    assert r.error is None and r.observed is Expect.CLEAN and not r.findings


def test_the_indexer_read_needs_its_own_accessors_wait():
    """Breakable with every accessor waiting is clean; with every one but the index's, the indexer
    reads the attention layers' index before their copies land (the KV waits come after it)."""
    breakable = dict(backend=Backend.BREAKABLE, fault=DELAY)
    r = run_scenario(_scenario(expect=Expect.CLEAN, **breakable), SimDevice(), replays=3)
    assert r.error is None and r.observed is Expect.CLEAN and not r.findings
    r = run_scenario(_scenario(accessor="no_index_wait", **breakable), SimDevice(), replays=3)
    assert r.error is None and r.observed is Expect.RACE and r.tally.stale_replays == 3 and r.findings
    assert set(r.tally.layer_counts) == set(SHAPE.attention_layers)
    assert set(r.tally.pool_counts) == {"idx"}


def test_without_an_index_the_model_reads_and_copies_as_before():
    plain = dataclasses.replace(SHAPE, indexer=0)
    layout = plan_layout(plain, BATCH)
    dev = SimDevice()
    assert all(c.region.pool in ("k", "v") for c in plan_copies(layout, HostPool(dev, layout, 0),
                                                                HybridPool(dev, layout))[3][0])
    r = run_scenario(small_scenario(model=plain, batch=BATCH, backend=Backend.BREAKABLE, fault=DELAY,
                                    accessor="no_index_wait"), SimDevice(), replays=2)
    assert r.observed is Expect.CLEAN  # no index: the policy waits wherever the engine's does


@pytest.mark.parametrize("model, batch, message", [
    ('{ layers = "MM", indexer = 4 }', "[{ prefix = 16, new = 2 }]", "model has none"),
    ('{ layers = "AM", page_size = 16, indexer = 3 }', "[{ prefix = 48, new = 2 }]", "multiple of indexer"),
    ('{ layers = "AM", page_size = 16, indexer = 4 }', "[{ prefix = 18, new = 2 }]", "whole groups of indexer"),
])
def test_a_scenario_file_refuses_an_index_that_cannot_be(model, batch, message):
    text = f'[[scenario]]\nname = "x"\nmodel = {model}\nbatch = {batch}\nbackend = "full"\nexpect = "race"\n'
    with pytest.raises(InputError, match=message):
        parse_text(text, "x.toml")


def test_tensor_parallelism_refuses_an_index():
    text = ('[[scenario]]\nname = "x"\nmodel = { layers = "AA", indexer = 4 }\nbatch = [{ prefix = 16, new = 2 }]\n'
            'backend = "full"\nexpect = "race"\ntp = 2\n')
    with pytest.raises(InputError, match="indexer"):
        parse_text(text, "x.toml")


# ---------------------------------------------------------------- the verdict `wrong`


def test_the_restore_check_names_what_a_landed_engine_load_left_unrestored():
    """The check asks only where an engine's load chain ran the load op; with it claimed and nothing
    loaded, every slot the plan restores is named (poisoned, so not its host data)."""
    tb = Testbed(_scenario(), SimDevice())
    with tb.dev.stream(tb.forward):
        tb.hazard.prepare(tb.bed)
    tb.dev.synchronize(5.0)
    assert tb.unrestored() == ()  # the harness's own load op is the plan itself: not asked
    tb.engine_loaded = True
    assert set(tb.unrestored()) == set(tb.bed.targets)
    with tb.dev.stream(tb.forward):
        tb.start_load(FaultPlan(Fault()))
    tb.dev.synchronize(5.0)
    assert tb.unrestored() == ()


def test_wrong_is_its_own_verdict_met_only_where_expected():
    not_restored = "idx[L3, slots 4:16]"
    wrong = decide(_scenario(expect=Expect.WRONG), 0, 0, not_restored=not_restored)
    assert wrong.met and wrong.observed is Expect.WRONG and wrong.evidence == ()
    assert wrong.describe() == "wrong (not restored)"
    clean = decide(_scenario(expect=Expect.CLEAN), 0, 0, not_restored=not_restored)
    assert not clean.met and not_restored in (clean.shortfall() or "")
    assert "every slot was restored" in (decide(_scenario(expect=Expect.WRONG), 0, 0).shortfall() or "")
    errored = decide(_scenario(expect=Expect.WRONG), 0, 0, error="boom", not_restored=not_restored)
    assert errored.observed is None and not errored.met


def test_a_wrong_scenarios_results_entry_says_which_slots():
    r = ScenarioResult(_scenario(expect=Expect.WRONG), not_restored=str(NotRestored((Region("idx", 3, 4, 16),))))
    entry = scenario_entry(r)
    assert (entry["expect"], entry["observed"], entry["met"]) == ("wrong", "wrong", True)
    assert entry["not_restored"] == "not restored: idx[L3, slots 4:16]"
    _check(entry, SCENARIO, "scenarios[0]", "results.json")  # the schema takes the new outcome
