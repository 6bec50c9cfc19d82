"""fence-harness connector-check on the CPU simulator: a connector's declaration judged by running its
hooks through vLLM's own code (needs vllm importable: PYTHONPATH=.engines/vllm-0.17.0)."""

from __future__ import annotations

import pytest

from tests.support.vllm_release import need

need("vllm", "vllm is not importable here; `make test-vllm` installs each release (PYTHONPATH=.engines/vllm-VERSION)")

from harness.engines import vllm as adapter  # noqa: E402
from harness.frontends.cli import main  # noqa: E402

EXAMPLES = "harness.engines.vllm_reference_connectors"
# Whether this release reads the declaration (vllm-project/vllm#31057), from its own base class.
CHECKS = hasattr(adapter.load().module(adapter.CONNECTOR).KVConnectorBase_V1, "requires_piecewise_for_cudagraph")


def check(capsys, name: str) -> tuple[int, str]:
    code = main(["connector-check", name, "--device", "sim", "--replays", "2"])
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


def test_vllms_offloading_connector_cannot_run_on_the_simulator(capsys):
    # With vLLM's serving packages (openai-harmony, llguidance, xgrammar ...) its module imports and its
    # worker cannot be built here (docs/engines.md says why); without them (the .[vllm] extra alone) its
    # module does not import. Either is one line, exit 2, never a verdict.
    code, out = check(capsys, "vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector:OffloadingConnector")
    assert code == 2 and ("did not run on the harness's device" in out or "cannot import" in out)


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
