"""The engine adapter against an installed sglang, on the CPU simulator (`make test-engine`).

The replay entry point is the release's own PrefillCudaGraphRunner.execute, the load op's
bookkeeping its own LayerDoneCounter. Every engine scenario must meet the expectation its
file gives for the installed release; the variant with the engine's waits dropped must be
caught on every release (teeth); and each guard against a false clean must end its scenario.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from packaging.version import Version

pytest.importorskip("sglang", reason="sglang is not installed here; `make test-engine` installs it")

from harness.devices.sim import SimDevice  # noqa: E402
from harness.engines import sglang as adapter  # noqa: E402
from harness.frontends.cli import main  # noqa: E402
from harness.input.scenario_file import SCENARIO_DIR, load_file  # noqa: E402
from harness.records.scenario import Backend, Expect, FaultKind  # noqa: E402
from harness.records.trace import Wait  # noqa: E402
from harness.run.pipeline import run_scenario  # noqa: E402
from harness.run.testbed import Testbed  # noqa: E402

FILE = SCENARIO_DIR / "engine" / "sglang.toml"


def small(s):
    """The same scenario on a smaller model (same layer pattern): the CPU computes it."""
    shape = dataclasses.replace(s.model, hidden=64, heads=2, kv_heads=1, head_dim=32, state=4)
    return s.with_overrides(model=shape)


SCENARIOS = [small(s) for s in load_file(FILE)]
FIXED = Version(adapter.load().version) >= Version("0.5.23")  # as the file says: checked below


def test_the_engine_has_every_name_the_adapter_needs():
    eng = adapter.load()
    assert eng.controller.__name__ == adapter.CONTROLLER
    assert eng.runner_cls.__name__ == "PrefillCudaGraphRunner"


def test_the_counter_and_its_events_are_the_engines_on_the_harness_device():
    dev = SimDevice()
    b = Testbed(SCENARIOS[0], dev)
    assert type(b.counter).__module__ == adapter.CONTROLLER
    assert type(b.counter.events[0]).__module__ == adapter.CONTROLLER
    assert adapter.load().controller.device_module.dev is dev  # its events are the simulator's
    assert type(b.counter.events[0].load_events[0]).__module__ == "harness.devices.sim"


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_every_engine_scenario_meets_its_expectation_on_this_release(scenario):
    r = run_scenario(scenario, SimDevice(), replays=3)
    assert r.error is None, r.error
    assert r.observed is scenario.expect, (dict(r.tally.layer_counts), len(r.findings))
    if scenario.expect is Expect.CLEAN:
        assert not r.findings  # clean in the data and in the happens-before analysis
    elif scenario.fault.kind is FaultKind.GATE:
        assert r.tally.stale_replays == r.tally.replays


def test_the_execute_scenarios_expect_what_the_release_ships():
    execute = [s for s in SCENARIOS if s.fence == "engine_execute"]
    assert {s.model.layers for s in execute} == {"AAAA", "MMMM", "AMAM"}
    assert {s.expect for s in execute} == {Expect.CLEAN if FIXED else Expect.RACE}


def test_the_engines_waits_dropped_is_caught_and_the_same_call_with_them_is_as_expected():
    s = next(s for s in SCENARIOS if s.fence == "engine_execute_nowait" and s.fault.kind is FaultKind.DELAY)
    assert run_scenario(s, SimDevice(), replays=3).tally.stale_replays == 3
    waited = run_scenario(s.with_overrides(fence="engine_execute"), SimDevice(), replays=3)
    assert (waited.tally.stale_replays == 0 and not waited.findings) is FIXED


def _by_layers(layers):
    return next(s for s in SCENARIOS if s.model.layers == layers)


@pytest.mark.parametrize("layers, kv_pool", [("AAAA", "MHATokenToKVPool"), ("MMMM", "HybridLinearKVPool"),
                                             ("AMAM", "HybridLinearKVPool")])
def test_the_pools_are_the_engines_and_their_tensors_back_the_copies(layers, kv_pool):
    b = Testbed(_by_layers(layers), SimDevice())
    mp = adapter.load().modules[adapter.MEMORY]
    assert type(b.pool.engine_kv_pool) is getattr(mp, kv_pool)
    engine_tensors = [*b.pool.kv.k, *b.pool.kv.v]
    if "M" in layers:
        assert type(b.pool.req_pool) is mp.HybridReqToTokenPool
        assert type(b.pool.req_pool.mamba_pool) is mp.MambaPool
        engine_tensors += [b.pool.req_pool.mamba_pool.mamba_cache.conv[0],
                           b.pool.req_pool.mamba_pool.mamba_cache.temporal]
    storages = {t.untyped_storage().data_ptr() for t in engine_tensors}
    copies = [c for layer in b.copies for chunk in layer for c in chunk]
    assert copies and all(c.dst.untyped_storage().data_ptr() in storages for c in copies)


def test_the_engines_policy_registers_its_counter_and_a_mutant_runs_on_the_harness_side():
    from harness.protocol.accessors import kv_only, per_layer

    b = Testbed(_by_layers("AMAM"), SimDevice())
    b.set_waits(per_layer)
    assert b.pool.engine_kv_pool.layer_transfer_counter is b.counter
    assert b.pool.req_pool.layer_transfer_counter is b.counter
    b.set_waits(kv_only)  # the engine's own waits off: the mutant is not masked by them
    assert b.pool.engine_kv_pool.layer_transfer_counter is None and b.pool.req_pool.layer_transfer_counter is None


@pytest.mark.parametrize("layers", ["AAAA", "MMMM", "AMAM"])
def test_the_models_reads_go_through_the_engines_accessors_and_their_waits(layers, monkeypatch):
    mp = adapter.load().modules[adapter.MEMORY]
    calls = []
    for cls, name in ((mp.MHATokenToKVPool, "get_key_buffer"), (mp.HybridLinearKVPool, "get_key_buffer"),
                      (mp.HybridReqToTokenPool, "mamba2_layer_cache")):
        original = getattr(cls, name)

        def spy(self, layer_id, *a, _original=original, _name=f"{cls.__name__}.{name}", **k):
            calls.append((_name, layer_id))
            return _original(self, layer_id, *a, **k)

        monkeypatch.setattr(cls, name, spy)
    counter_cls = adapter.load().controller.LayerDoneCounter
    waits = []
    wait_until = counter_cls.wait_until
    monkeypatch.setattr(counter_cls, "wait_until", lambda self, i: (waits.append(i), wait_until(self, i))[1])
    s = _by_layers(layers).with_overrides(backend=Backend.EAGER, fence="none")
    r = run_scenario(s, SimDevice(), replays=2)
    assert r.error is None and r.tally.stale_replays == 0
    expected = {("HybridReqToTokenPool.mamba2_layer_cache" if k == "M" else
                 ("MHATokenToKVPool" if layers == "AAAA" else "HybridLinearKVPool") + ".get_key_buffer", lid)
                for lid, k in enumerate(layers)}
    assert expected <= set(calls)  # (the hybrid KV pool then asks its own full-attention pool)
    assert set(waits) == set(range(len(layers)))  # each layer's wait: the engine counter's, from its accessor


def test_breakable_accessor_waits_go_through_the_engine_counter():
    s = next(s for s in SCENARIOS if s.backend is Backend.BREAKABLE)
    r = run_scenario(s, SimDevice(), replays=2)
    assert r.tally.stale_replays == 0
    waits = [op for op in r.trace.ops if isinstance(op, Wait)]
    assert waits  # the engine counter's wait_until enqueued them, eagerly between segments


def _execute_then(monkeypatch, before=None, after=None):
    cls = adapter.load().runner_cls
    original = cls.execute

    def execute(self, batch, **kw):
        if before:
            before(self)
        out = original(self, batch, **kw)
        if after:
            after(self)
        return out

    monkeypatch.setattr(cls, "execute", execute)


def test_a_host_sync_between_load_start_and_replay_is_an_error_not_a_clean(monkeypatch):
    _execute_then(monkeypatch, before=lambda runner: runner.device_module.dev.synchronize())
    r = run_scenario(SCENARIOS[0], SimDevice(), replays=2)
    assert r.error is not None and "host synchronised" in r.error and r.observed is None


def test_a_second_replay_or_none_is_an_error(monkeypatch):
    _execute_then(monkeypatch, after=lambda runner: next(iter(runner.backend._graphs.values())).replay())
    r = run_scenario(SCENARIOS[0], SimDevice(), replays=2)
    assert r.error is not None and "2 times, not once" in r.error


def test_an_execute_that_never_loads_the_batch_is_an_error(monkeypatch):
    cls = adapter.load().runner_cls

    def execute(self, batch, **kw):
        next(iter(self.backend._graphs.values())).replay()

    monkeypatch.setattr(cls, "execute", execute)
    r = run_scenario(SCENARIOS[0], SimDevice(), replays=2)
    assert r.error is not None and "load_batch 0 times" in r.error


def test_results_name_the_engine_and_its_version(tmp_path):
    path = tmp_path / "s.toml"
    text = FILE.read_text().replace("replays = 100", "replays = 2")
    for name, layers in (("attention", "AA"), ("mamba", "MM"), ("hybrid", "AM")):
        small_model = f'layers = "{layers}"\nhidden = 64\nheads = 2\nkv_heads = 1\nhead_dim = 32'
        text = text.replace(f'[models.{name}]\nlayers = "{layers * 2}"', f"[models.{name}]\n{small_model}")
    path.write_text(text)
    out = tmp_path / "out"
    assert main(["run", str(path), "--device", "sim", "--out", str(out)]) == 0
    doc = json.loads((out / "results.json").read_text())
    version = adapter.load().version
    assert {json.dumps(e["engine"]) for e in doc["scenarios"]} == {json.dumps({"name": "sglang", "version": version})}


def test_a_missing_engine_name_is_a_one_line_error_naming_it_and_the_version(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(adapter.NEEDED, adapter.CONTROLLER, ("LayerDoneCounter", "NoSuchThing"))
    adapter.load.cache_clear()
    try:
        path = tmp_path / "s.toml"
        path.write_text(FILE.read_text())
        assert main(["run", str(path), "--device", "sim", "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert f"{path}: defaults.engine: sglang " in err and "has no cache_controller.NoSuchThing" in err
    finally:
        adapter.load.cache_clear()


def test_a_release_no_range_covers_is_a_one_line_error(tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_text(FILE.read_text().replace('expect_by_release = { "<0.5.23" = "race", ">=0.5.23" = "clean" }',
                                             'expect_by_release = { "<0.0.1" = "race" }'))
    assert main(["run", str(path), "--device", "sim", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no range covers it" in err and "scenario[0].expect_by_release" in err


def test_an_engine_assertion_is_that_scenarios_error(monkeypatch):
    eng = adapter.load()

    def reused(self):
        raise AssertionError("Producer finish event should be ready before being reused.")

    monkeypatch.setattr(eng.controller.LayerDoneCounter, "update_producer", reused)
    r = run_scenario(SCENARIOS[0], SimDevice(), replays=2)
    assert r.error == "sglang assertion failed: Producer finish event should be ready before being reused."


def test_an_engine_module_missing_on_this_path_is_that_scenarios_error_in_one_line(monkeypatch):
    # On CUDA, sglang 0.5.22's MambaPool imports a module at construction that a pack recorded on
    # the CPU lacked: the run must go on, with that scenario's error, not end in a traceback.
    from harness.engines import sglang_pools

    def build(self, *args, **kwargs):
        raise ModuleNotFoundError("No module named 'sglang.srt.mem_cache.mamba_slot_fused'\nmore detail")

    monkeypatch.setattr(sglang_pools.EnginePools, "__init__", build)  # reached through the adapter
    r = run_scenario(SCENARIOS[0], SimDevice(), replays=2)
    assert r.error == "sglang raised ModuleNotFoundError: No module named 'sglang.srt.mem_cache.mamba_slot_fused'"
    assert not r.met


# ---- the engine's own load chain (attention-only models) ---------------------------------------

def _attention():
    return next(s for s in SCENARIOS if s.model.layers == "AAAA" and s.fence == "engine_execute"
                and s.fault.kind is FaultKind.DELAY)


def test_the_attention_load_op_is_the_engines_chain_and_only_its_copy_kernel_is_the_harnesss(monkeypatch):
    from harness.protocol.layout import prefix_regions
    from harness.records.trace import Copy

    eng = adapter.load()
    calls: dict[str, int] = {}
    for mod, cls, name in ((adapter.CONTROLLER, "HiCacheController", "load"),
                           (adapter.CONTROLLER, "HiCacheController", "start_loading"),
                           (adapter.TRANSFER, "L2TransferEngine", "submit_host_to_device"),
                           (adapter.HOST_MHA, "MHATokenToKVPoolHost", "load_to_device_per_layer"),
                           (adapter.CONTROLLER, "LayerLoadingEvent", "complete")):
        klass = getattr(eng.modules[mod], cls)
        original = getattr(klass, name)

        def spy(self, *a, _original=original, _key=f"{cls}.{name}", **k):
            calls[_key] = calls.get(_key, 0) + 1
            return _original(self, *a, **k)

        monkeypatch.setattr(klass, name, spy)
    s = _attention()
    b = Testbed(s, SimDevice())
    assert b.engine_load is not None and b.counter is b.engine_load.controller.layer_done_counter
    assert b.load is b.engine_load.controller.l2_transfer_engine.host_to_device_stream
    r = run_scenario(s, SimDevice(), replays=2)
    assert r.error is None
    loads = calls["HiCacheController.start_loading"]
    assert loads >= 2 and calls["HiCacheController.load"] == loads == calls["L2TransferEngine.submit_host_to_device"]
    layers = s.model.num_layers
    assert calls["MHATokenToKVPoolHost.load_to_device_per_layer"] == loads * layers
    assert calls["LayerLoadingEvent.complete"] == loads * layers  # the engine's on_layer_done
    layout = b.layout
    copied = {op.dst for op in r.trace.ops if isinstance(op, Copy)}
    assert copied == {reg for lid in range(layers) for reg in prefix_regions(layout, lid)}


def test_the_engines_host_pool_holds_the_harnesss_host_data():
    import torch

    b = Testbed(_attention(), SimDevice())
    hp = b.engine_load.host_pool
    assert type(hp).__name__ == "MHATokenToKVPoolHost" and hp.layout == "layer_first"
    n = b.layout.total_prefix
    assert torch.equal(hp.k_buffer[:, :n], b.host.k) and torch.equal(hp.v_buffer[:, :n], b.host.v)


def test_the_copy_kernel_is_what_fills_the_pools(monkeypatch):
    from harness.engines.sglang_load import EngineLoad

    monkeypatch.setattr(EngineLoad, "transfer_kv_direct", lambda self, *a, **k: None)
    r = run_scenario(_attention(), SimDevice(), replays=2)  # ground truth loads through the same chain
    assert r.observed is Expect.WRONG and r.tally.replays == 0  # left unrestored with every load landed
    assert r.not_restored is not None and r.not_restored.startswith("k[L0, slots")


def test_a_host_sync_in_the_engines_load_chain_is_an_error_not_a_clean(monkeypatch):
    cls = adapter.load().modules[adapter.HOST_MHA].MHATokenToKVPoolHost
    original = cls.load_to_device_per_layer

    def synced(self, *a, **k):
        original(self, *a, **k)
        adapter.load().controller.device_module.dev.synchronize()

    monkeypatch.setattr(cls, "load_to_device_per_layer", synced)
    r = run_scenario(_attention(), SimDevice(), replays=2)
    assert r.error is not None and "host synchronised" in r.error and r.observed is None


def test_the_kernel_copies_each_run_of_consecutive_rows_once():
    from harness.engines.sglang_load import _runs

    assert _runs([0, 1, 2, 7, 8], [16, 17, 18, 32, 34]) == [(0, 16, 3), (7, 32, 1), (8, 34, 1)]
    assert _runs([5, 4, 3], [0, 1, 2]) == [(5, 0, 1), (4, 1, 1), (3, 2, 1)]
    assert _runs([], []) == []


@pytest.mark.parametrize("layers, chain", [("AAAA", "EngineLoad"), ("AMAM", "HybridLoad")])
def test_each_kernel_call_is_planned_once_and_replayed_with_the_same_copies(layers, chain, monkeypatch):
    # The compiled kernel spends no host time per row; a stand-in rebuilding its runs and views on
    # every load op would hold the host long enough to hide the race at serving shapes.
    from harness.engines import sglang_hybrid_load, sglang_load

    klass = getattr(sglang_hybrid_load if chain == "HybridLoad" else sglang_load, chain)
    kernel = "transfer_kv_direct" if chain == "EngineLoad" else "transfer_kv_per_layer_direct_pf_lf"
    calls: dict[str, int] = {}
    _spy(monkeypatch, calls, klass, "_plan")
    _spy(monkeypatch, calls, klass, kernel)
    s = _execute(layers)
    r = run_scenario(s, SimDevice(), replays=3)
    assert r.error is None, r.error
    kernel_calls, planned = calls[f"{chain}.{kernel}"], calls[f"{chain}._plan"]
    assert kernel_calls >= 3 * planned  # at least three load ops made the same calls
    assert 0 < planned <= 2 * s.model.num_layers  # one per distinct call: per layer (and pool group)


@pytest.mark.parametrize("layers", ["MMMM", "AMAM"])
def test_the_hybrid_kernel_issues_each_calls_pages_as_one_batch(layers, monkeypatch):
    # sglang-kernel 0.4.9's page-first kernel enqueues a call's page copies with one
    # cudaMemcpyBatchAsync; a copy a page from Python would hold the host far longer than it does.
    from harness.engines.sglang_hybrid_load import HybridLoad

    batches: list[int] = []
    original = SimDevice.copy_batch_async

    def spy(self, copies):
        batches.append(len(copies))
        original(self, copies)

    monkeypatch.setattr(SimDevice, "copy_batch_async", spy)
    calls: dict[str, int] = {}
    _spy(monkeypatch, calls, HybridLoad, "transfer_kv_per_layer_direct_pf_lf")
    r = run_scenario(_execute(layers), SimDevice(), replays=2)
    assert r.error is None, r.error
    assert len(batches) == calls["HybridLoad.transfer_kv_per_layer_direct_pf_lf"] > 0
    assert all(n > 0 for n in batches) and max(batches) > 1  # a call's pages in one batch


@pytest.mark.parametrize("layers", ["AAAA", "AMAM"])
def test_the_engines_host_pools_are_destroyed_when_their_chain_is_dropped(layers, monkeypatch):
    import gc

    destroyed: list[str] = []
    eng = adapter.load()
    for mod, cls in ((adapter.HOST_MHA, "MHATokenToKVPoolHost"), (adapter.HOST_MAMBA, "MambaPoolHost")):
        klass = getattr(eng.modules[mod], cls)
        monkeypatch.setattr(klass, "destroy", lambda self, _c=cls: destroyed.append(_c), raising=False)
    b = Testbed(_execute(layers), SimDevice())
    want = sorted(type(p).__name__ for p in (getattr(b.engine_load, n, None)
                                              for n in ("host_pool", "kv_host", "mamba_host")) if p is not None)
    assert destroyed == []
    del b
    gc.collect()
    assert sorted(destroyed) == want


def test_an_allocation_the_layout_did_not_place_is_an_error():
    import torch

    from harness.engines.sglang_load import Allocator
    from harness.records.errors import EngineContractBroken

    with pytest.raises(EngineContractBroken, match="asked for 3 slots"):
        Allocator(None, torch.arange(4)).alloc(3)


# ---- the engine's own hybrid load chain (models with Mamba layers) ------------------------------

def _execute(layers, kind=FaultKind.DELAY):
    return next(s for s in SCENARIOS if s.model.layers == layers and s.fence == "engine_execute"
                and s.fault.kind is kind)


def _spy(monkeypatch, calls, klass, name):
    original = getattr(klass, name)

    def spy(self, *a, _original=original, _key=f"{klass.__name__}.{name}", **k):
        calls[_key] = calls.get(_key, 0) + 1
        return _original(self, *a, **k)

    monkeypatch.setattr(klass, name, spy)


@pytest.mark.parametrize("layers", ["MMMM", "AMAM"])
def test_a_mamba_or_hybrid_load_op_is_the_engines_hybrid_chain_and_only_its_copy_kernel_is_the_harnesss(
        layers, monkeypatch):
    from harness.protocol.layout import prefix_regions
    from harness.records.trace import Copy

    m = adapter.load().modules
    calls: dict[str, int] = {}
    for klass, name in ((m[adapter.HYBRID].HybridCacheController, "load"),
                        (m[adapter.HYBRID].HybridCacheController, "start_loading"),
                        (m[adapter.TRANSFER].L2TransferEngine, "submit_host_to_device"),
                        (m[adapter.HOST_MHA].MHATokenToKVPoolHost, "load_to_device_per_layer"),
                        (m[adapter.HOST_MAMBA].MambaPoolHost, "load_to_device_per_layer"),
                        (m[adapter.CONTROLLER].LayerLoadingEvent, "complete")):
        _spy(monkeypatch, calls, klass, name)
    s = _execute(layers)
    b = Testbed(s, SimDevice())
    assert type(b.engine_load.controller) is m[adapter.HYBRID].HybridCacheController
    assert type(b.engine_load.group) is m[adapter.HOST_GROUP].HostPoolGroup
    assert b.counter is b.engine_load.controller.layer_done_counter
    assert b.load is b.engine_load.controller.l2_transfer_engine.host_to_device_stream
    r = run_scenario(s, SimDevice(), replays=2)
    assert r.error is None
    loads = calls["HybridCacheController.start_loading"]
    assert loads >= 2 and calls["HybridCacheController.load"] == loads
    assert calls["L2TransferEngine.submit_host_to_device"] == loads
    shape = s.model
    assert calls["MambaPoolHost.load_to_device_per_layer"] == loads * len(shape.mamba_layers)
    assert calls.get("MHATokenToKVPoolHost.load_to_device_per_layer", 0) == loads * len(shape.attention_layers)
    assert calls["LayerLoadingEvent.complete"] == loads * shape.num_layers  # the engine's on_layer_done
    # every slot a layer loads, and nothing else, written by the kernel's copies
    written = {(op.dst.pool, op.dst.layer, i) for op in r.trace.ops if isinstance(op, Copy)
               for i in range(op.dst.start, op.dst.stop)}
    assert written == {(reg.pool, reg.layer, i) for lid in range(shape.num_layers)
                       for reg in prefix_regions(b.layout, lid) for i in range(reg.start, reg.stop)}


@pytest.mark.parametrize("layers", ["MMMM", "AMAM"])
def test_the_engines_hybrid_host_pools_hold_the_harnesss_host_data_and_a_load_lands_it_in_the_pools(layers):
    import torch

    from harness.faults.plan import FaultPlan

    b = Testbed(_execute(layers), SimDevice())
    el, host, layout = b.engine_load, b.host, b.layout
    m = adapter.load().modules
    assert type(el.mamba_host) is m[adapter.HOST_MAMBA].MambaPoolHost and el.mamba_host.layout == "page_first_direct"
    n = len(layout.requests)
    (conv,) = el.mamba_host.conv_buffer
    assert torch.equal(conv[:n, :, 0].transpose(0, 1), host.conv)
    assert torch.equal(el.mamba_host.temporal_buffer[:n, :, 0].transpose(0, 1), host.ssm)
    if "A" in layers:
        assert type(el.kv_host) is m[adapter.HOST_MHA].MHATokenToKVPoolHost and el.kv_host.layout == "page_first_direct"
    else:
        assert el.kv_host is None  # no attention layer: no KV to load
    b.start_load(FaultPlan(_execute(layers).fault))
    b.dev.synchronize()
    for a, lid in enumerate(layout.shape.attention_layers):
        for r in layout.requests:
            rows = slice(r.host_offset, r.host_offset + len(r.prefix))
            assert torch.equal(b.pool.kv.k[b.pool.kv.layer_index[lid], r.prefix.start:r.prefix.stop], host.k[a, rows])
            assert torch.equal(b.pool.kv.v[b.pool.kv.layer_index[lid], r.prefix.start:r.prefix.stop], host.v[a, rows])
    for mi, lid in enumerate(layout.shape.mamba_layers):
        idx = b.pool.mamba.layer_index[lid]
        assert torch.equal(b.pool.mamba.conv[idx, layout.mamba_rows], host.conv[mi])
        assert torch.equal(b.pool.mamba.ssm[idx, layout.mamba_rows], host.ssm[mi])


def test_the_hybrid_copy_kernel_is_what_fills_the_pools(monkeypatch):
    from harness.engines.sglang_hybrid_load import HybridLoad

    monkeypatch.setattr(HybridLoad, "transfer_kv_per_layer_direct_pf_lf", lambda self, *a, **k: None)
    r = run_scenario(_execute("AMAM"), SimDevice(), replays=2)  # ground truth loads through the same chain
    assert r.observed is Expect.WRONG and r.tally.replays == 0
    assert r.not_restored is not None and {"k[L0", "conv[L1"} <= {part.split(",")[0] for part in
                                                                   r.not_restored.split(", ")}


@pytest.mark.parametrize("layers", ["MMMM", "AMAM"])
def test_the_engines_waits_dropped_from_the_hybrid_chain_are_caught(layers):
    s = next(s for s in SCENARIOS if s.model.layers == layers and s.fence == "engine_execute_nowait"
             and s.fault.kind is FaultKind.GATE)
    r = run_scenario(s, SimDevice(), replays=3)
    assert r.error is None and r.tally.stale_replays == 3 and r.findings


def test_a_prefix_of_part_of_a_page_is_an_error_of_the_hybrid_chain():
    from harness.records.scenario import Request

    s = _execute("AMAM")
    s = s.with_overrides(batch=(Request(prefix=100, new=8),))
    r = run_scenario(s, SimDevice(), replays=2)
    assert r.error is not None and "whole pages of 16 tokens" in r.error and r.observed is None


@pytest.mark.parametrize("layers, controller", [("AAAAAAAA", "HiCacheController"),
                                                ("AMAMAMAM", "HybridCacheController")])
def test_the_serving_shapes_are_unfaulted_8192_token_prefixes_loaded_through_the_engines_chain(layers, controller):
    import torch

    from harness.faults.plan import FaultPlan

    (s,) = [s for s in load_file(SCENARIO_DIR / "engine" / "serving.toml") if s.model.layers == layers]
    assert (s.model.hidden, s.model.num_layers, s.fault.kind, s.fence) == (1024, 8, FaultKind.NONE, "engine_execute")
    assert [r.prefix for r in s.batch] == [8192] and s.engine == "sglang"
    b = Testbed(small(s), SimDevice())  # the same 8,192-token prefix, on a model the CPU holds
    assert type(b.engine_load.controller).__name__ == controller
    b.start_load(FaultPlan(s.fault))
    b.dev.synchronize()
    (r,) = b.layout.requests
    for a, lid in enumerate(b.layout.shape.attention_layers):  # the whole prefix landed, every attention layer
        assert torch.equal(b.pool.kv.k[b.pool.kv.layer_index[lid], r.prefix.start:r.prefix.stop], b.host.k[a])
