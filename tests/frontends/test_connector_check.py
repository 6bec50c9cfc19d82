"""fence-harness connector-check on the CPU simulator: a connector's declaration judged by running its
hooks through vLLM's own code (needs vllm importable: PYTHONPATH=.engines/vllm-0.17.0)."""

from __future__ import annotations

import importlib

import pytest

from tests.support.vllm_release import need

need("vllm", "vllm is not importable here; `make test-vllm` installs each release (PYTHONPATH=.engines/vllm-VERSION)")

from harness.engines import vllm as adapter  # noqa: E402
from harness.frontends.cli import main  # noqa: E402

EXAMPLES = "harness.engines.vllm_reference_connectors"
# Whether this release reads the declaration (vllm-project/vllm#31057), from its own base class.
CHECKS = hasattr(adapter.load().module(adapter.CONNECTOR).KVConnectorBase_V1, "requires_piecewise_for_cudagraph")


def check(capsys, name: str, *more: str) -> tuple[int, str]:
    code = main(["connector-check", name, "--device", "sim", "--replays", "2", *more])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_a_layerwise_connector_declaring_false_races(capsys):
    code, out = check(capsys, f"{EXAMPLES}:DeclaresFalse")
    assert code == 1 and "vLLM settled on FULL" in out and "race: DeclaresFalse" in out


def test_the_same_connector_declaring_true_is_honest_where_vllm_downgrades(capsys):
    code, out = check(capsys, f"{EXAMPLES}:DeclaresTrue")
    if CHECKS:
        assert code == 0 and "vLLM settled on PIECEWISE" in out and "honest: DeclaresTrue needs PIECEWISE" in out
    else:  # the release keeps FULL: the declaration is not read, and it races
        assert code == 1 and "does not read the declaration" in out


def test_a_connector_whose_wait_is_a_no_op_races_in_any_mode(capsys):
    code, out = check(capsys, f"{EXAMPLES}:NoWait")
    assert code == 1 and "race: NoWait" in out


def test_declaring_true_where_full_was_safe_is_a_cost_note(capsys):
    if not CHECKS:
        pytest.skip("this release keeps FULL whatever a connector declares")
    code, out = check(capsys, f"{EXAMPLES}:WaitsAtStart")
    assert code == 0 and "honest, at a cost" in out and "a FULL graph was clean too" in out


OFFLOADING = "vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector:OffloadingConnector"
# The CPU size each release's CPUOffloadingSpec reads (0.13.0 counts blocks, 0.14.0 on bytes); each
# reads its own key.
OFFLOAD_CONFIG = '{"cpu_bytes_to_use": 1048576, "num_cpu_blocks": 2048}'


def test_vllms_offloading_connector_is_honest_its_loads_being_asynchronous(capsys):
    """vLLM's own OffloadingConnector, made by vLLM's factory with the model's KVCacheConfig, its prefixes
    offloaded by earlier requests through its own store path, its metadata built by its own scheduler
    side: it does not wait per layer, and needs no PIECEWISE graph: its scheduler side answers that its
    loads are asynchronous, and vLLM runs a request's forward once the worker reports the load."""
    code, out = check(capsys, OFFLOADING, "--extra-config", OFFLOAD_CONFIG)
    assert code == 0, out
    assert "vLLM settled on FULL" in out
    assert "FULL (full): stale 0/2 replays, 0 findings, graph check 0 findings" in out
    assert "its loads: asynchronous (get_num_new_matched_tokens: load_kv_async for 6 of 6 requests)" in out
    # the teeth: the same FULL graph with the forward in its load's own step reads the pending load
    assert "FULL, each forward in its load's own step: stale 2/2 replays" in out
    assert "honest: OffloadingConnector's loads are asynchronous" in out
    assert "its hooks do not order a pending load" in out
    # its load does not wait on the compute stream before vllm-project/vllm#50696 (0.28.0)
    assert "write-after-write findings against the harness's poisoning" in out
    if CHECKS:
        assert "declares requires_piecewise_for_cudagraph False (the base class's answer)" in out


def test_the_offloading_connector_runs_vllms_own_code(capsys):
    from harness.engines import vllm_graphs, vllm_load
    from harness.frontends import connector_check as cc

    cls = cc.connector_class(OFFLOADING)
    vllm_graphs.checking(cls, {"cpu_bytes_to_use": 1 << 20, "num_cpu_blocks": 2048})
    try:
        from harness.devices.sim import SimDevice

        run = cc._run("vllm_check", 1, SimDevice())
    finally:
        vllm_graphs.checking(None)
    assert run.error is None and not run.race
    load = vllm_load.current()
    assert type(load.connector) is cls and type(load.scheduler.connector) is cls  # both roles vLLM's
    worker = load.connector.connector_worker.worker
    handlers = importlib.import_module("vllm.v1.kv_offload.worker.cpu_gpu")
    assert all(isinstance(h, handlers.SingleDirectionOffloadingHandler) for h in worker.handlers)
    hd = load.scheduler.handlers
    assert hd.stores > 0 and hd.loads > 0  # its store path at set-up, its loads each replay, as harness copies
    assert hd.streams, "vLLM's handlers made their streams themselves"


def test_a_connector_refusing_its_config_is_one_line_and_exit_2(capsys):
    code, out = check(capsys, OFFLOADING)  # no CPU size in kv_connector_extra_config
    assert code == 2 and "must be specified in kv_connector_extra_config" in out
    assert len([line for line in out.splitlines() if line.startswith("fence-harness:")]) == 1


@pytest.mark.parametrize("name, says", [
    ("harness.no_such_module:X", "cannot import 'harness.no_such_module'"),
    (f"{EXAMPLES}:NoSuchClass", "has no 'NoSuchClass'"),
    ("harness.engines.vllm_connector:Transfer", "is not a vLLM V1 KV connector"),
    ("no_colon", "expected package.module:ConnectorClass"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, name, says):
    code, out = check(capsys, name)
    assert code == 2 and says in out
    assert len([line for line in out.splitlines() if line.startswith("fence-harness:")]) == 1
