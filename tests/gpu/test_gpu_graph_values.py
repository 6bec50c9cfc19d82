"""The graph check of value waits on a real GPU: captured cuStreamWaitValue32 / WriteValue32 read
back from the driver as value nodes on the harness's flags, the op list matching the graph, the
correct fence clean and its two mutants caught from the graph alone (each with its twin)."""

from __future__ import annotations

import pytest

from harness.checkers.graph import compare_record
from harness.input.scenario_file import SCENARIO_DIR, load_files
from harness.records.graph_model import NodeKind
from harness.run.pipeline import run_scenario

pytestmark = pytest.mark.gpu

MATRIX = {s.name: s for s in load_files([SCENARIO_DIR / "mutants" / "kill_matrix.toml"])}


@pytest.fixture(scope="module")
def cuda():
    from harness.devices.cuda import CudaDevice

    return CudaDevice()


def test_a_captured_value_wait_and_write_are_value_nodes_on_their_flags(cuda):
    flags = cuda.Flags(2, 0)

    def body():
        flags.wait(0, 1)
        flags.write(1, 1)

    graph = cuda.capture(body, warmup=0)
    model = graph.model()
    kinds = [(n.kind, n.flags, n.value) for n in model.nodes if n.kind in (NodeKind.VALUE_WAIT, NodeKind.VALUE_WRITE)]
    assert kinds == [(NodeKind.VALUE_WAIT, (flags.ids[0],), 1), (NodeKind.VALUE_WRITE, (flags.ids[1],), 1)]
    assert compare_record(graph.body, model) == []


@pytest.mark.parametrize("name", ["correct.layerwise_value.gate", "correct.layerwise_value.captured_load.gate"])
def test_layerwise_value_graphs_match_and_are_clean(cuda, name):
    r = run_scenario(MATRIX[name], cuda, replays=3)
    assert r.error is None and r.graph is not None and r.graph.matched, r.error
    assert not r.graph.findings and any(g.value_wait_nodes for g in r.graph.graphs)


@pytest.mark.parametrize("name", ["mutant.value_flag_before_copies", "mutant.value_flag_not_rearmed"])
def test_the_value_mutants_are_caught_from_the_graph(cuda, name):
    r = run_scenario(MATRIX[name], cuda, replays=3)
    assert r.graph is not None and r.graph.matched, r.error
    assert r.graph.findings
