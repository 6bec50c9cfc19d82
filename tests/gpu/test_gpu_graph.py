"""The graph check on a real GPU: the captured graph read from the driver, against the op list.

Each has its twin: an event created before the capture gives a wait node, one never recorded
gives none; the correct layer-wise fence is clean and the mutant with uncreated events is
caught from the graph alone.
"""

from __future__ import annotations

import pytest

from harness.checkers.graph import compare_record
from harness.input.scenario_file import SCENARIO_DIR, default_files, load_files
from harness.records.graph_model import NodeKind
from harness.records.scenario import Evidence
from harness.records.trace import Kernel, Region, Wait
from harness.run.pipeline import run_scenario

pytestmark = pytest.mark.gpu

MATRIX = {s.name: s for s in load_files([SCENARIO_DIR / "mutants" / "kill_matrix.toml"])}
DEFAULT = {s.name: s for s in load_files(default_files())}


@pytest.fixture(scope="module")
def cuda():
    from harness.devices.cuda import CudaDevice

    return CudaDevice()


def _capture(cuda, created: bool):
    import torch

    x = torch.zeros(1024, device="cuda")
    event = cuda.Event(external=True, created=created)
    region = Region("k", 0, 0, 1024)

    def body():
        cuda.current_stream().wait_event(event)
        cuda.launch(lambda: x.add_(1).mul_(2), reads=(region,), writes=(region,), what="add_mul")

    return cuda.capture(body, warmup=0), event


def test_a_wait_on_a_created_external_event_is_a_wait_node_on_that_event(cuda):
    graph, event = _capture(cuda, created=True)
    model = graph.model()
    assert model.source == "cuda"
    assert [type(op) for op in graph.body] == [Wait, Kernel]
    waits = [n for n in model.nodes if n.kind is NodeKind.WAIT]
    assert [n.event for n in waits] == [event.id]
    assert compare_record(graph.body, model) == []
    # The step's span: its two kernels, both after the wait node.
    span = model.spans[1]
    assert len(span) == 2 and all(model.by_id[n].kind is NodeKind.KERNEL for n in span)
    assert all(waits[0].id in model.ancestors[n] for n in span)


def test_a_graph_read_many_times_does_not_crash_the_process(cuda):
    # The driver's cuFuncGetName answered invalid-handle for some kernels (an in-place add first
    # launched in a capture) and a thousand such calls segfaulted the process; the reader no longer
    # asks, so reading a thousand kernel nodes in one process is safe.
    graph, _ = _capture(cuda, created=True)
    for _ in range(500):
        graph._model = None  # read from the driver again
        names = [n.name for n in graph.model().nodes if n.kind is NodeKind.KERNEL]
    assert len(names) == 2, names


def test_a_wait_on_an_event_never_recorded_leaves_no_wait_node(cuda):
    graph, _ = _capture(cuda, created=False)
    model = graph.model()
    assert model.count(NodeKind.WAIT) == 0
    assert [type(op) for op in graph.body] == [Kernel]  # the op list agrees: no wait was enqueued
    assert compare_record(graph.body, model) == []


def test_the_never_recorded_events_mutant_is_caught_from_the_graph(cuda):
    r = run_scenario(MATRIX["mutant.layerwise_events_never_recorded"], cuda, replays=5)
    assert r.error is None, r.error
    assert r.graph is not None and r.graph.unavailable is None and r.graph.matched
    assert r.graph.graphs[0].source == "cuda" and r.graph.graphs[0].wait_nodes == 0
    assert Evidence.GRAPH in r.seal().evidence and r.met


def test_its_correct_twin_has_its_wait_nodes_and_no_finding(cuda):
    r = run_scenario(MATRIX["correct.layerwise_graph.gate"], cuda, replays=5)
    assert r.error is None, r.error
    assert r.graph is not None and r.graph.matched and not r.graph.findings
    assert r.graph.graphs[0].wait_nodes == 6 and r.met


@pytest.mark.parametrize("kind", ("attention", "mamba", "hybrid"))
def test_default_full_graphs_match_their_op_list_and_the_check_agrees_with_the_fence(cuda, kind):
    bare = run_scenario(DEFAULT[f"{kind}-full-none"], cuda, replays=3)
    fenced = run_scenario(DEFAULT[f"{kind}-full-final_event"], cuda, replays=3)
    for r in (bare, fenced):
        assert r.error is None, r.error
        assert r.graph is not None and r.graph.matched and r.graph.graphs[0].source == "cuda"
        assert all(n > 0 for _, n in r.graph.graphs[0].steps)
    assert bare.graph is not None and bare.graph.findings
    assert fenced.graph is not None and not fenced.graph.findings
