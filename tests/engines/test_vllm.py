"""The vLLM adapter against an installed vllm, on the CPU simulator (`make engine-matrix` runs it on
0.16.0 and 0.17.0; one release in process: `PYTHONPATH=.engines/vllm-0.17.0`).

The connector's hooks are called by vLLM's own `unified_attention`; the graph mode is what vLLM's
own VllmConfig settles on. Every scenario must meet its file's expectation on the installed release;
the downgrade disabled must race on every release (teeth).
"""

from __future__ import annotations

import dataclasses

import pytest

from tests.support.vllm_release import need

need("vllm", "vllm is not importable here; `make test-vllm` installs each release (PYTHONPATH=.engines/vllm-VERSION)")

from harness.devices.sim import SimDevice  # noqa: E402
from harness.engines import vllm as adapter  # noqa: E402
from harness.engines import vllm_load  # noqa: E402
from harness.engines.vllm_connector import LayerwiseConnector  # noqa: E402
from harness.input.scenario_file import SCENARIO_DIR, load_file  # noqa: E402
from harness.records.scenario import Backend, Expect, FaultKind  # noqa: E402
from harness.run.pipeline import run_scenario  # noqa: E402
from harness.run.replay import armed  # noqa: E402
from harness.run.testbed import Testbed  # noqa: E402

FILE = SCENARIO_DIR / "engine" / "vllm.toml"


def small(s):
    return s.with_overrides(model=dataclasses.replace(s.model, hidden=64, heads=2, kv_heads=1, head_dim=32))


SCENARIOS = [small(s) for s in load_file(FILE)]
BY_NAME = {s.name: s for s in SCENARIOS}
# Whether this release checks the declaration: read from vLLM's own base class, not its version.
CHECKS = hasattr(adapter.load().module(adapter.CONNECTOR).KVConnectorBase_V1, "requires_piecewise_for_cudagraph")


def test_the_connector_is_made_by_vllm_and_is_a_v1_connector():
    b = Testbed(SCENARIOS[0], SimDevice())
    base = adapter.load().module(adapter.CONNECTOR).KVConnectorBase_V1
    load = b.engine_load
    assert isinstance(load, vllm_load.VllmLoad)
    assert type(load.connector) is LayerwiseConnector and isinstance(load.connector, base)
    assert adapter.load().module(adapter.TRANSFER).get_kv_transfer_group() is load.connector
    assert set(load.connector.kv_caches) == {f"model.layers.{i}.self_attn.attn" for i in range(4)}


@pytest.mark.parametrize("declares", [False, True])
def test_the_graph_mode_is_vllms_own_decision(declares):
    eng = adapter.load()
    config = eng.connector_config(LayerwiseConnector, {"requires_piecewise": declares})
    assert eng.decided_mode(config) == ("PIECEWISE" if declares and CHECKS else "FULL")


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_every_vllm_scenario_meets_its_expectation_on_this_release(scenario):
    r = run_scenario(scenario, SimDevice(), replays=3)
    assert r.error is None, r.error
    assert r.observed is scenario.expect, (dict(r.tally.layer_counts), len(r.findings))
    if scenario.expect is Expect.CLEAN:
        assert not r.findings and r.graph is not None and not r.graph.findings
    elif scenario.fault.kind is FaultKind.GATE:
        assert r.tally.stale_replays == r.tally.replays  # under the gate: every replay
        assert r.graph is not None and r.graph.findings  # and the graph check sees it


def test_the_declaration_expects_what_the_release_ships():
    s = BY_NAME["vllm.layerwise-true.gate"]
    assert s.expect is (Expect.CLEAN if CHECKS else Expect.RACE)


def test_the_downgrade_disabled_races_where_it_would_be_clean():
    s = BY_NAME["vllm.layerwise-true.gate"]
    off = run_scenario(s.with_overrides(fence="vllm_layerwise_piecewise_nodowngrade"), SimDevice(), replays=3)
    assert off.error is None and off.observed is Expect.RACE and off.tally.stale_replays == 3
    on = run_scenario(s, SimDevice(), replays=3)
    assert (on.observed is Expect.CLEAN) is CHECKS


def test_under_piecewise_vllm_calls_the_hooks_around_every_attention_layer():
    if not CHECKS:
        pytest.skip("this release keeps FULL for a connector declaring True")
    b = Testbed(BY_NAME["vllm.layerwise-true.delay"], SimDevice())
    _, runner = armed(b, 30.0)
    assert b.fence.mode == "PIECEWISE" and b.fence.backend is Backend.BREAKABLE
    t = b.engine_load.transfer
    with b.dev.stream(b.forward):
        b.start_load(_plan())
        b.fence.runner.run()
    names = [f"model.layers.{i}.self_attn.attn" for i in range(4)]
    assert t.hooks == ["start_load_kv"] + [f"{h}:{n}" for n in names for h in ("wait_for_layer_load", "save_kv_layer")]
    b.dev.synchronize(30.0)


def test_a_full_graph_replays_no_hook():
    b = Testbed(BY_NAME["vllm.layerwise-false.delay"], SimDevice())
    _, runner = armed(b, 30.0)
    assert runner.backend is Backend.FULL and b.fence.mode == "FULL"
    t = b.engine_load.transfer
    with b.dev.stream(b.forward):
        b.start_load(_plan())
        runner.run()
    assert t.hooks == ["start_load_kv"]  # the graph's replay ran no Python: no wait, no save
    b.dev.synchronize(30.0)


def test_a_model_with_mamba_layers_is_refused():
    s = dataclasses.replace(SCENARIOS[0].model, layers="AMAM")
    r = run_scenario(SCENARIOS[0].with_overrides(model=s), SimDevice(), replays=1)
    assert r.error is not None and "attention layers only" in r.error


def _plan():
    from harness.faults.plan import FaultPlan
    from harness.records.scenario import Fault

    return FaultPlan(Fault())


# ---- vLLM's platform: the harness's, on a GPU host as on the CPU (harness/engines/vllm.py)


def test_every_module_of_vllm_reads_the_harness_platform():
    import sys

    adapter.use_harness_platform(adapter.load())  # what each VllmConfig of a scenario does first
    platforms = sys.modules[adapter.PLATFORMS]
    assert platforms.current_platform is adapter._platform and platforms._current_platform is adapter._platform
    assert platforms.current_platform.support_static_graph_mode()
    assert "vllm.platforms.cuda" not in sys.modules  # vLLM's CUDA platform: its compiled ops, never imported
    held = {name: type(m.__dict__["current_platform"]).__name__ for name, m in list(sys.modules.items())
            if name.startswith("vllm") and "current_platform" in getattr(m, "__dict__", {})}
    # Modules a test imported before the adapter loaded may hold vLLM's "no device found" platform.
    assert held and set(held.values()) <= {"HarnessPlatform", "UnspecifiedPlatform"}


def test_a_platform_vllm_resolved_for_a_device_is_refused_loudly(monkeypatch):
    import sys
    import types

    from harness.records.errors import EngineContractBroken

    adapter.load()

    class CudaPlatform:  # what vLLM resolves on a GPU host when the harness's platform is not set first
        pass

    early = types.ModuleType("vllm.platforms")
    early._current_platform = CudaPlatform()  # type: ignore[attr-defined]
    with pytest.raises(EngineContractBroken, match="resolved its own platform \\(CudaPlatform\\)"):
        adapter.install_platform(early)
    bound = types.ModuleType("vllm.harness_test_bound")
    bound.current_platform = CudaPlatform()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, bound.__name__, bound)
    with pytest.raises(EngineContractBroken, match="vllm.harness_test_bound holds the platform CudaPlatform"):
        adapter.check_platform()
    monkeypatch.delitem(sys.modules, bound.__name__)
    monkeypatch.setitem(sys.modules, "vllm.platforms.cuda", types.ModuleType("vllm.platforms.cuda"))
    with pytest.raises(EngineContractBroken, match="imported its CUDA platform"):
        adapter.check_platform()


# ---- the serving shape (scenarios/engine/vllm_serving.toml): GPU only


def test_the_serving_shape_is_an_unfaulted_8192_token_prefix_under_full_on_the_gpu_only():
    (s,) = load_file(SCENARIO_DIR / "engine" / "vllm_serving.toml")
    m = s.model
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.head_dim, m.dtype.value) == ("AAAAAAAA", 1024, 8, 8, 128, "bf16")
    assert [(r.prefix, r.new) for r in s.batch] == [(8192, 32)] and s.fault.kind is FaultKind.NONE
    assert (s.engine, s.backend, s.fence, s.devices) == ("vllm", Backend.FULL, "vllm_layerwise", ("cuda",))
    # FULL kept for a connector declaring False on every release: no wait in a replay, a race that the
    # analysis finds whatever the timing, so no evidence is demanded of the data.
    assert s.expect is Expect.RACE and s.evidence is None
    r = run_scenario(small(s).with_overrides(devices=None), SimDevice(), replays=1)
    assert r.error is None and r.observed is Expect.RACE and r.findings, (r.error, len(r.findings))


def test_engine_matrix_on_the_simulator_skips_the_serving_shape_and_says_why(tmp_path, capsys):
    from harness.frontends.cli import main

    serving = SCENARIO_DIR / "engine" / "vllm_serving.toml"
    # Alone, nothing is left to run on the simulator: an error, never a release that met everything.
    assert main(["engine-matrix", "--in-process", str(serving), "--device", "sim", "--out", str(tmp_path / "a")]) == 2
    assert "none runs on sim" in capsys.readouterr().err
    assert main(["engine-matrix", "--in-process", str(serving), str(FILE), "--small", "--device", "sim",
                 "--replays", "1", "--out", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "skipped 1 of scenarios/engine/vllm_serving.toml: they run only on cuda" in out
    assert "vllm.layerwise-false.gate" in out and "vllm.serving" not in out.replace("vllm_serving.toml", "")
