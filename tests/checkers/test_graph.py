"""The graph check: hand-built graphs (each right one with a broken twin), the op list against the
graph, the spans a capture's frontiers give, and the simulator's graphs through the pipeline."""

from __future__ import annotations

import dataclasses

import pytest

from harness.checkers.graph import check_graphs, check_replays, compare_record
from harness.devices.sim import SimDevice, SimGraph
from harness.input.scenario_file import SCENARIO_DIR, load_files
from harness.records.graph_model import GraphModel, GraphNode, GraphSource, NodeKind, chain_model, spans_from_frontiers
from harness.records.races import RaceKind
from harness.records.scenario import Evidence
from harness.records.trace import Copy, FlagWait, FlagWrite, HostSync, Kernel, Record, Region, Replay, Trace, Wait
from harness.run.pipeline import run_scenario

LOAD, FWD, CAP = 1, 2, 9
GRAPH = 50
E_OLD, E_L0, E_L1 = 100, 101, 102  # an event recorded before the copy, layer 0's and layer 1's load events
K0 = Region("k", 0, 16, 272)
K1 = Region("k", 1, 16, 272)
NAMES = {LOAD: "load", FWD: "forward", CAP: "capture"}

READ_L0 = Kernel(CAP, (K0,), (), "L0 attention")
BODY = (Wait(CAP, E_L0, in_graph=True), READ_L0)


def story(body=BODY, *before) -> Trace:
    """Layer 0 and 1 loaded on the load stream (each copy followed by its event), then the replay."""
    ops = [Record(LOAD, E_OLD), Copy(LOAD, K0), Record(LOAD, E_L0), Copy(LOAD, K1), Record(LOAD, E_L1),
           *before, Replay(FWD, GRAPH, tuple(body))]
    return Trace(ops=ops, stream_names=dict(NAMES))


def graph(nodes, edges, spans) -> GraphModel:
    return GraphModel(GRAPH, tuple(nodes), tuple(edges), tuple(spans), "cuda")


WAIT = GraphNode(0, NodeKind.WAIT, "wait", E_L0)
KERNEL = GraphNode(1, NodeKind.KERNEL, "attention_kernel")
RIGHT = graph([WAIT, KERNEL], [(0, 1)], [(0,), (1,)])


# ---- the check: a wait node on the load event, reaching the reader ----------------------


def test_a_wait_node_on_the_load_event_that_reaches_the_reader_orders_it():
    assert check_replays(story(), {GRAPH: RIGHT}) == []


def test_missing_wait_node_is_found_naming_node_region_and_event():
    no_wait = graph([KERNEL], [], [(), (1,)])
    (f,) = check_replays(story(), {GRAPH: no_wait})
    assert (f.kind, f.node, f.kernel, f.step, f.access_region, f.copy_region, f.event) == (
        RaceKind.READ_AFTER_WRITE, 1, "attention_kernel", "L0 attention", K0, K0, E_L0)
    text = f.describe()
    assert "attention_kernel" in text and "k[L0, slots 16:272]" in text and "wait node on event 101" in text


@pytest.mark.parametrize("event", [E_OLD, 999], ids=["recorded-before-the-copy", "never-recorded"])
def test_wait_node_on_the_wrong_event_is_found(event):
    wrong = graph([dataclasses.replace(WAIT, event=event), KERNEL], [(0, 1)], [(0,), (1,)])
    (f,) = check_replays(story(), {GRAPH: wrong})
    assert f.node == 1 and f.event == E_L0


def test_wait_node_not_reaching_the_reader_is_found():
    apart = graph([WAIT, KERNEL], [], [(0,), (1,)])  # no edge: the kernel may run before the wait
    (f,) = check_replays(story(), {GRAPH: apart})
    assert f.node == 1


def test_a_later_layer_event_covers_an_earlier_copy_on_the_same_stream():
    later = graph([dataclasses.replace(WAIT, event=E_L1), KERNEL], [(0, 1)], [(0,), (1,)])
    assert check_replays(story(), {GRAPH: later}) == []


def test_a_wait_on_the_replay_stream_before_the_replay_orders_every_node():
    no_wait = graph([KERNEL], [], [(), (1,)])
    assert check_replays(story(BODY, Wait(FWD, E_L1)), {GRAPH: no_wait}) == []
    # ... but not one on another stream, nor one on an event recorded before the copy
    assert len(check_replays(story(BODY, Wait(LOAD, E_L1)), {GRAPH: no_wait})) == 1
    assert len(check_replays(story(BODY, Wait(FWD, E_OLD)), {GRAPH: no_wait})) == 1


def test_a_host_sync_before_the_replay_orders_it():
    no_wait = graph([KERNEL], [], [(), (1,)])
    assert check_replays(story(BODY, HostSync()), {GRAPH: no_wait}) == []


def test_a_write_to_a_loaded_region_is_write_after_write():
    body = (Wait(CAP, E_L0, in_graph=True), Kernel(CAP, (), (K0,), "L0 mamba"))
    (f,) = check_replays(story(body), {GRAPH: graph([KERNEL], [], [(), (1,)])})
    assert f.kind is RaceKind.WRITE_AFTER_WRITE and "writes k[L0" in f.describe()


def test_every_node_of_a_step_must_be_ordered():
    # Two kernels for the step; the wait reaches only the first.
    second = GraphNode(2, NodeKind.MEMCPY, "memcpy")
    half = graph([WAIT, KERNEL, second], [(0, 1)], [(0,), (1, 2)])
    (f,) = check_replays(story(), {GRAPH: half})
    assert f.node == 2 and f.kernel == "memcpy"
    joined = graph([WAIT, KERNEL, second], [(0, 1), (1, 2)], [(0,), (1, 2)])
    assert check_replays(story(), {GRAPH: joined}) == []


def test_a_graph_with_no_model_is_not_checked_here():
    assert check_replays(story(), {}) == []


# ---- the op list against the graph ------------------------------------------------------


def test_the_record_matches_its_own_chain():
    assert compare_record(BODY, chain_model(GRAPH, BODY)) == []
    assert compare_record(BODY, RIGHT) == []


def test_a_recorded_wait_the_graph_lacks_is_a_mismatch():
    # The first layerwise_graph: the op list said the graph waits; the graph held no wait node.
    (m,) = compare_record(BODY, graph([KERNEL], [], [(), (1,)]))
    assert "op 0 waits on event 101" in m and "no node" in m


def test_a_wait_node_on_another_event_is_a_mismatch():
    (m,) = compare_record(BODY, graph([dataclasses.replace(WAIT, event=E_L1), KERNEL], [(0, 1)], [(0,), (1,)]))
    assert "waits on event 101" in m and "wait on event 102" in m


def test_a_wait_node_no_op_accounts_for_is_a_mismatch():
    body = (READ_L0,)
    stray = graph([WAIT, KERNEL], [(0, 1)], [(1,)])
    (m,) = compare_record(body, stray)
    assert "node 0 waits on event 101" in m and "no captured op" in m
    foreign = graph([dataclasses.replace(WAIT, event=None), KERNEL], [(0, 1)], [(1,)])
    assert "an event the harness did not make" in compare_record(body, foreign)[0]


def test_a_step_with_no_work_node_is_a_mismatch():
    (m,) = compare_record(BODY, graph([WAIT], [], [(0,), ()]))
    assert "L0 attention" in m


def test_a_count_of_ops_that_differs_is_a_mismatch():
    assert compare_record(BODY, graph([KERNEL], [], [(1,)]))


def test_a_mismatch_fails_the_check_in_one_line():
    body = BODY
    check = check_graphs(story(body), GraphSource({GRAPH: graph([KERNEL], [], [(), (1,)])}))
    assert not check.matched and "\n" not in check.mismatch_line()
    assert check.graphs[0].steps == (("L0 attention", 1),)


# ---- the spans of a capture, from its frontiers ------------------------------------------


def test_spans_from_frontiers_take_every_node_an_op_added():
    # op 0: a wait (0); op 1: two kernels forked and joined (1, 2 -> 3); op 2: none; op 3: one kernel (4)
    edges = [(0, 1), (0, 2), (1, 3), (2, 3), (3, 4)]
    frontiers = [(), (0,), (3,), (3,), (4,)]
    assert spans_from_frontiers(range(5), edges, frontiers) == ((0,), (1, 2, 3), (), (4,))


def test_spans_from_frontiers_need_no_order_from_the_driver():
    # The driver lists nodes in any order; ids are not capture order.
    edges = [(7, 3), (3, 5)]
    assert spans_from_frontiers([5, 3, 7], edges, [(), (7,), (5,)]) == ((7,), (3, 5))


def test_a_cycle_is_refused():
    with pytest.raises(ValueError, match="cycle"):
        spans_from_frontiers([0, 1], [(0, 1), (1, 0)], [(), (1,)])


# ---- the simulator: what CUDA does with a wait on an event not created yet ---------------


def _capture_wait(created: bool) -> SimGraph:
    dev = SimDevice()
    event = dev.Event(external=True, created=created)
    return dev.capture(lambda: dev.current_stream().wait_event(event), warmup=0)


def test_a_captured_wait_on_an_external_event_is_a_wait_node():
    g = _capture_wait(created=True)
    assert g.model().count(NodeKind.WAIT) == 1 and isinstance(g.body[0], Wait)


def test_a_captured_wait_on_an_event_never_recorded_is_dropped():
    g = _capture_wait(created=False)
    assert g.body == () and g.model().count(NodeKind.WAIT) == 0


def test_an_event_recorded_once_is_created():
    dev = SimDevice()
    event = dev.Event()
    assert not event.created
    event.record()
    assert event.created


# ---- the pipeline, on the simulator -----------------------------------------------------


def _matrix(name: str):
    (s,) = [s for s in load_files([SCENARIO_DIR / "mutants" / "kill_matrix.toml"]) if s.name == name]
    return s


def test_the_never_recorded_events_mutant_is_caught_by_the_graph_check():
    r = run_scenario(_matrix("mutant.layerwise_events_never_recorded"), SimDevice(), replays=2)
    assert r.error is None and r.met and Evidence.GRAPH in r.seal().evidence
    assert r.graph is not None and r.graph.matched and r.graph.findings
    assert all(g.wait_nodes == 0 for g in r.graph.graphs)


def test_its_correct_twin_is_clean_with_a_wait_node_per_accessor():
    r = run_scenario(_matrix("correct.layerwise_graph.gate"), SimDevice(), replays=2)
    assert r.error is None and r.met and r.graph is not None and not r.graph.findings
    (g,) = r.graph.graphs
    assert g.wait_nodes == 6  # AMAM: K and V accessors of each attention layer, one per Mamba layer


def test_a_graph_captured_before_the_counter_existed_is_caught_and_names_the_missing_wait():
    # sglang#38354: the graph replayed was captured before the accessors' waits were added.
    r = run_scenario(_matrix("mutant.counter_registered_after_capture"), SimDevice(), replays=2)
    assert r.error is None and r.met and Evidence.GRAPH in r.seal().evidence
    assert r.graph is not None and r.graph.matched and r.graph.findings
    replayed = [g for g in r.graph.graphs if g.wait_nodes == 0]
    assert replayed, [g.wait_nodes for g in r.graph.graphs]  # the early capture: no wait node
    said = " ".join(f.describe() for f in r.graph.findings)
    assert "nothing orders it after the H2D copy" in said and "no wait node on event" in said, said
    # The twin, the same waits added before the capture: a wait node per accessor, clean.
    twin = run_scenario(_matrix("correct.layerwise_graph.gate"), SimDevice(), replays=2)
    assert twin.met and not twin.graph.findings


class _DroppingSim(SimDevice):
    """A device whose graphs lack the wait nodes its op list records (the old layerwise_graph)."""

    def graph_source(self, trace):
        source = super().graph_source(trace)
        for gid, m in source.models.items():
            keep = tuple(n for n in m.nodes if n.kind is not NodeKind.WAIT)
            ids = {n.id for n in keep}
            source.models[gid] = dataclasses.replace(
                m, nodes=keep, edges=tuple(e for e in m.edges if set(e) <= ids),
                spans=tuple(tuple(n for n in s if n in ids) for s in m.spans))
        return source


def test_an_op_list_that_does_not_match_its_graph_is_the_scenarios_error():
    r = run_scenario(_matrix("correct.layerwise_graph.gate"), _DroppingSim(), replays=2)
    assert r.error is not None and "does not match the graph" in r.error and "\n" not in r.error
    assert not r.met


# ---- value waits: a value-wait node on a flag the load stream writes after the copy ----------

F0, F1 = 200, 201  # layer 0's and layer 1's flags
ARMED, LOADED = 0, 1
SCHED = FWD  # the scheduling stream is the forward's: the re-arm is ordered before the replay
VWAIT = GraphNode(0, NodeKind.VALUE_WAIT, "wait f200", flags=(F0,), value=LOADED)
VRIGHT = graph([VWAIT, KERNEL], [(0, 1)], [(0,), (1,)])
VBODY = (FlagWait(CAP, F0, LOADED, in_graph=True), READ_L0)


def value_story(*load: object, rearm: bool = True, previous: bool = True) -> Trace:
    """A previous load op left F0 LOADED (the host synchronized since); the scheduling stream
    re-arms it (unless not), the load stream runs `load` after the start event, then the replay."""
    ops: list = []
    if previous:
        ops += [FlagWrite(LOAD, (F0,), LOADED), HostSync()]
    if rearm:
        ops.append(FlagWrite(SCHED, (F0, F1), ARMED))
    ops += [Record(SCHED, E_OLD), Wait(LOAD, E_OLD), *load, Replay(FWD, GRAPH, VBODY)]
    return Trace(ops=ops, stream_names=dict(NAMES))


FLAG_AFTER_COPY = (Copy(LOAD, K0), FlagWrite(LOAD, (F0,), LOADED))


def test_a_value_wait_node_on_a_flag_written_after_the_copy_orders_the_reader():
    assert check_replays(value_story(*FLAG_AFTER_COPY), {GRAPH: VRIGHT}) == []
    assert check_replays(value_story(*FLAG_AFTER_COPY, previous=False), {GRAPH: VRIGHT}) == []


def test_a_value_node_is_released_by_the_flags_value_from_before_the_trace_only_where_it_reaches():
    # Nothing re-arms F0: what it held when the trace started decides (ARMED: only this op's write
    # releases the node; LOADED, or not known: the previous op's value may).
    t = value_story(*FLAG_AFTER_COPY, rearm=False, previous=False)
    t.flag_values = {F0: (ARMED,)}
    assert check_replays(t, {GRAPH: VRIGHT}) == []
    for values in ({F0: (ARMED, LOADED)}, {}):
        t.flag_values = values
        (f,) = check_replays(t, {GRAPH: VRIGHT})
        assert f.node == 1, values


def test_the_flag_written_before_the_copy_is_found():
    (f,) = check_replays(value_story(FlagWrite(LOAD, (F0,), LOADED), Copy(LOAD, K0)), {GRAPH: VRIGHT})
    assert (f.kind, f.node, f.copy_region) == (RaceKind.READ_AFTER_WRITE, 1, K0)


def test_a_flag_not_rearmed_still_holds_the_previous_ops_value_and_is_found():
    (f,) = check_replays(value_story(*FLAG_AFTER_COPY, rearm=False), {GRAPH: VRIGHT})
    assert f.node == 1 and f.copy_region == K0


def test_a_value_wait_on_the_wrong_flag_or_value_is_found():
    for node in (dataclasses.replace(VWAIT, flags=(F1,)), dataclasses.replace(VWAIT, value=ARMED),
                 dataclasses.replace(VWAIT, flags=())):  # () : an address that is none of the harness's flags
        (f,) = check_replays(value_story(*FLAG_AFTER_COPY), {GRAPH: graph([node, KERNEL], [(0, 1)], [(0,), (1,)])})
        assert f.node == 1, node


def test_a_value_wait_node_not_reaching_the_reader_is_found():
    (f,) = check_replays(value_story(*FLAG_AFTER_COPY), {GRAPH: graph([VWAIT, KERNEL], [], [(0,), (1,)])})
    assert f.node == 1


def test_the_simulators_chain_maps_flag_waits_and_writes_to_value_nodes():
    body = (FlagWait(CAP, F0, LOADED, True), FlagWrite(CAP, (F0, F1), ARMED), READ_L0)
    m = chain_model(GRAPH, body)
    assert [(n.kind, n.flags, n.value) for n in m.nodes[:2]] == [
        (NodeKind.VALUE_WAIT, (F0,), LOADED), (NodeKind.VALUE_WRITE, (F0, F1), ARMED)]
    assert compare_record(body, m) == []


@pytest.mark.parametrize("node, says", [
    (dataclasses.replace(VWAIT, flags=(F1,)), "waits until flag 200 reaches 1"),
    (dataclasses.replace(VWAIT, value=ARMED), "waits until flag 200 reaches 1"),
    (GraphNode(0, NodeKind.WAIT, "wait", E_L0), "waits until flag 200 reaches 1"),
    (dataclasses.replace(VWAIT, flags=()), "none of the harness's flags"),
    (GraphNode(0, NodeKind.MEM_OP, "CU_STREAM_MEM_OP_BARRIER"), "cannot read"),
])
def test_a_recorded_flag_wait_the_graph_does_not_hold_is_a_mismatch(node, says):
    found = compare_record(VBODY, graph([node, KERNEL], [(0, 1)], [(0,), (1,)]))
    assert found and any(says in m for m in found), found


def test_a_value_node_no_op_accounts_for_is_a_mismatch():
    (m,) = compare_record((READ_L0,), graph([VWAIT, KERNEL], [(0, 1)], [(1,)]))
    assert "node 0 waits until flag 200 reaches 1" in m and "no captured op" in m


def test_a_recorded_flag_write_must_be_a_value_write_node_on_its_flags():
    body = (FlagWrite(CAP, (F0,), LOADED),)
    right = GraphNode(0, NodeKind.VALUE_WRITE, "w", flags=(F0,), value=LOADED)
    assert compare_record(body, graph([right], [], [(0,)])) == []
    for wrong in (dataclasses.replace(right, value=ARMED), dataclasses.replace(right, flags=(F1,)),
                  GraphNode(0, NodeKind.KERNEL, "fill")):  # write_all is a fill kernel on CUDA: unreadable
        assert compare_record(body, graph([wrong], [], [(0,)])), wrong


# ---- a load graph (captured_load): its copies, records and flag writes, replayed on the load stream


LOAD_BODY = (Copy(CAP, K0), Record(CAP, E_L0), FlagWrite(CAP, (F0,), LOADED))


def load_graph_story(load_body=LOAD_BODY) -> Trace:
    ops = [FlagWrite(SCHED, (F0, F1), ARMED), Record(SCHED, E_OLD), Wait(LOAD, E_OLD),
           Replay(LOAD, GRAPH + 1, tuple(load_body)), Replay(FWD, GRAPH, VBODY)]
    return Trace(ops=ops, stream_names=dict(NAMES))


def load_models(load_body=LOAD_BODY, edges=None):
    m = chain_model(GRAPH + 1, load_body, "cuda")
    if edges is not None:
        m = dataclasses.replace(m, edges=tuple(edges))
    return {GRAPH: VRIGHT, GRAPH + 1: m}


def test_a_load_graphs_copy_orders_a_forward_that_waits_on_its_flag():
    assert check_replays(load_graph_story(), load_models()) == []
    assert compare_record(LOAD_BODY, load_models()[GRAPH + 1]) == []


def test_a_load_graph_that_writes_its_flag_before_the_copy_is_found():
    body = (FlagWrite(CAP, (F0,), LOADED), Copy(CAP, K0), Record(CAP, E_L0))
    (f,) = check_replays(load_graph_story(body), load_models(body))
    assert f.graph == GRAPH and f.copy_region == K0 and f.event == E_L0 and f.copy_stream == "load"


def test_a_load_graph_is_no_reader_and_its_copies_count_without_a_model_too():
    # With no model of either graph nothing is checked; with the forward's only, the load graph's
    # op list stands in for it (its copies, records and flag writes), and orders the reader.
    assert check_replays(load_graph_story(), {}) == []
    assert check_replays(load_graph_story(), {GRAPH: VRIGHT}) == []
    body = (FlagWrite(CAP, (F0,), LOADED), Copy(CAP, K0))
    assert check_replays(load_graph_story(body), {GRAPH: VRIGHT})


def test_a_load_graph_whose_edges_do_not_order_the_flag_write_after_the_copy_is_a_mismatch():
    found = compare_record(LOAD_BODY, load_models(edges=[(1, 2)])[GRAPH + 1])  # the copy hangs loose
    assert len(found) == 2 and all("not ordered after copy op 0" in m for m in found), found


# ---- the CUDA reader's batch mem-op nodes, from their decoded operations (pure) -----------------

ADDR = {0x1000: F0, 0x1004: F1}
W32, V32 = "CU_STREAM_MEM_OP_WAIT_VALUE_32", "CU_STREAM_MEM_OP_WRITE_VALUE_32"
GEQ, BARRIER = "CU_STREAM_WAIT_VALUE_GEQ", "CU_STREAM_WRITE_VALUE_DEFAULT"


@pytest.mark.parametrize("ops, kind, flags, value", [
    ([(W32, 0x1000, 1, GEQ)], NodeKind.VALUE_WAIT, (F0,), 1),
    ([(W32, 0x2000, 1, GEQ)], NodeKind.VALUE_WAIT, (), 1),  # not the harness's: a mismatch, named
    ([(W32, 0x1000, 1, "CU_STREAM_WAIT_VALUE_EQ")], NodeKind.MEM_OP, (), None),
    ([(V32, 0x1000, 1, BARRIER), (V32, 0x1004, 1, BARRIER)], NodeKind.VALUE_WRITE, (F0, F1), 1),
    ([(V32, 0x1000, 1, "CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER")], NodeKind.MEM_OP, (), None),
    ([(V32, 0x1000, 1, BARRIER), (V32, 0x1004, 2, BARRIER)], NodeKind.MEM_OP, (), None),
    ([(W32, 0x1000, 1, GEQ), (V32, 0x1004, 1, BARRIER)], NodeKind.MEM_OP, (), None),
    ([("CU_STREAM_MEM_OP_BARRIER", 0, 0, "")], NodeKind.MEM_OP, (), None),
])
def test_a_batch_mem_op_node_maps_to_a_value_node_only_when_it_is_one(ops, kind, flags, value):
    from harness.devices.cuda_graph import mem_op_node

    n = mem_op_node(3, ops, ADDR)
    assert (n.id, n.kind, n.flags, n.value) == (3, kind, flags, value)


def _filled_params(count, listed=()):
    """Node parameters as `cuGraphBatchMemOpNodeGetParams` fills them: the C struct in memory, its
    array of `count` unions, and (as cuda-bindings gives it) a `paramArray` listing `listed` only."""
    import ctypes
    from types import SimpleNamespace

    from harness.devices.cuda_graph import MEM_OP_PARAMS_BYTES, _BatchMemOpNodeParams

    array = (ctypes.c_uint8 * (MEM_OP_PARAMS_BYTES * max(count, 1)))()
    struct = _BatchMemOpNodeParams(None, count, ctypes.addressof(array) if count else None, 0)
    keep = (array, struct)
    return SimpleNamespace(count=count, paramArray=list(listed), getPtr=lambda: ctypes.addressof(struct),
                           keep=keep), ctypes.addressof(array)


class _Bindings:
    """The one constructor `param_array` calls: wraps memory in place (`_ptr`), as cuda-bindings does."""

    @staticmethod
    def CUstreamBatchMemOpParams(_ptr):  # noqa: N802
        return ("wrapped", _ptr)


def test_a_filled_in_node_s_operations_are_read_from_its_own_memory():
    # cuda-bindings lists no operations for a struct the driver filled in: read them in place.
    from harness.devices.cuda_graph import MEM_OP_PARAMS_BYTES, param_array

    params, array = _filled_params(3)
    assert param_array(_Bindings, params) == [("wrapped", array + k * MEM_OP_PARAMS_BYTES) for k in range(3)]


def test_operations_the_bindings_list_are_taken_as_listed():
    from harness.devices.cuda_graph import param_array

    params, _ = _filled_params(2, listed=["a", "b"])
    assert param_array(_Bindings, params) == ["a", "b"]
    empty, _ = _filled_params(0)
    assert param_array(_Bindings, empty) == []


# ---- the pipeline on the simulator: value waits, their mutants, the captured load op ----------


@pytest.mark.parametrize("name", ["correct.layerwise_value.gate", "correct.layerwise_value.captured_load.gate"])
def test_layerwise_value_is_clean_in_the_graph_check(name):
    r = run_scenario(_matrix(name), SimDevice(), replays=2)
    assert r.error is None and r.met and r.graph is not None and r.graph.matched and not r.graph.findings
    assert any(g.value_wait_nodes for g in r.graph.graphs)


@pytest.mark.parametrize("name", ["mutant.value_flag_before_copies", "mutant.value_flag_not_rearmed"])
def test_the_value_mutants_are_caught_by_the_graph_check(name):
    r = run_scenario(_matrix(name), SimDevice(), replays=2)
    assert r.error is None and r.met and r.graph is not None and r.graph.matched and r.graph.findings


def test_a_captured_copy_with_no_work_node_is_a_mismatch():
    (m,) = compare_record((Copy(CAP, K0),), graph([GraphNode(0, NodeKind.RECORD, "r", E_L0)], [], [(0,)]))
    assert "op 0 (Copy) is device work" in m


def test_a_finding_under_a_value_wait_names_its_flag_and_the_write_that_may_release_it():
    (f,) = check_replays(value_story(*FLAG_AFTER_COPY, rearm=False), {GRAPH: VRIGHT})
    assert f.flags == (F0,) and "value waits above it (flag 200)" in f.describe() and "re-armed" in f.describe()
