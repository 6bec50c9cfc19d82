"""The stream sanitizer's happens-before model on synthetic sequences (fake stream, event and
graph ids, as PyTorch's test_cuda_sanitizer.py drives its EventHandler). Every case that must
be silent has a twin, one edge short, that must report."""

from __future__ import annotations

import pytest

from harness.records.races import HOST, RaceKind
from harness.sanitizer.model import SanitizerModel, Site, Span, Use

MAIN, SIDE, CAP, FORK = 0, 0x100, 0x200, 0x300  # stream ids
GRAPH = "g"


def use(start: int, stop: int, write: bool, op: str = "op", space: str = "cuda:0", base: int = 0) -> Use:
    return Use(Span(space, start, stop), write, Site(op, "self", (f"test.py:{start} in {op}",)), base)


def R(start=0, stop=64, op="read", **kw):  # noqa: N802
    return [use(start, stop, False, op, **kw)]


def W(start=0, stop=64, op="write", **kw):  # noqa: N802
    return [use(start, stop, True, op, **kw)]


def kinds(m: SanitizerModel) -> list[str]:
    return [r.kind.value for r in m.races]


# ---- eager streams ------------------------------------------------------------------

@pytest.mark.parametrize("fenced", [True, False])
def test_a_read_after_a_side_stream_write_needs_a_wait(fenced):
    m = SanitizerModel()
    m.op(SIDE, W(op="copy_"))
    m.record(1, SIDE)
    if fenced:
        m.wait(1, MAIN)
    m.op(MAIN, R(op="mul"))
    assert kinds(m) == ([] if fenced else ["read-after-write"])


@pytest.mark.parametrize("fenced", [True, False])
def test_a_side_stream_write_after_a_read_needs_a_wait(fenced):
    m = SanitizerModel()
    m.op(MAIN, R(op="mul"))
    m.record(1, MAIN)
    if fenced:
        m.wait(1, SIDE)
    m.op(SIDE, W(op="copy_"))
    assert kinds(m) == ([] if fenced else ["write-after-read"])


def test_reads_do_not_race_and_disjoint_memory_does_not_race():
    m = SanitizerModel()
    m.op(SIDE, R(0, 64))
    m.op(MAIN, R(0, 64))
    m.op(SIDE, W(64, 128))
    m.op(MAIN, W(128, 192))
    assert m.races == []
    m.op(MAIN, W(120, 130))  # overlaps the side write's last bytes
    assert kinds(m) == ["write-after-write"]


def test_a_wait_covers_only_what_was_enqueued_before_the_record():
    m = SanitizerModel()
    m.record(1, SIDE)
    m.op(SIDE, W())  # after the record
    m.wait(1, MAIN)
    m.op(MAIN, R())
    assert kinds(m) == ["read-after-write"]


def test_a_wait_on_a_never_recorded_event_orders_nothing():
    m = SanitizerModel()
    m.op(SIDE, W())
    m.wait(7, MAIN)
    m.op(MAIN, R())
    assert kinds(m) == ["read-after-write"]


def test_a_reused_event_handle_forgets_its_old_record():
    m = SanitizerModel()
    m.op(SIDE, W())
    m.record(1, SIDE)
    m.forget_event(1)  # destroyed, the handle handed out again
    m.wait(1, MAIN)
    m.op(MAIN, R())
    assert kinds(m) == ["read-after-write"]


@pytest.mark.parametrize("sync", ["device", "stream", "event", None])
def test_host_synchronisation(sync):
    m = SanitizerModel()
    m.op(SIDE, W())
    m.record(1, SIDE)
    if sync == "device":
        m.host_sync()
    elif sync == "stream":
        m.stream_sync(SIDE)
    elif sync == "event":
        m.event_sync(1)
    m.op(MAIN, R())
    assert kinds(m) == ([] if sync else ["read-after-write"])


def test_a_stream_synchronize_covers_only_that_stream():
    m = SanitizerModel()
    m.op(SIDE, W())
    m.stream_sync(FORK)
    m.op(MAIN, R())
    assert kinds(m) == ["read-after-write"]


# ---- the host's own work on pinned memory -----------------------------------------

@pytest.mark.parametrize("seen", [True, False])
def test_the_host_refills_a_staging_buffer_a_copy_still_reads(seen):
    m = SanitizerModel()
    m.op(SIDE, R(op="copy_", space="host", base=1) + W(op="copy_"))  # H2D: pinned source, device target
    m.record(1, SIDE)
    if seen:
        m.event_sync(1)
    m.host_op(W(op="fill_", space="host", base=1))
    assert kinds(m) == ([] if seen else ["write-after-read"])
    if not seen:
        assert m.races[0].later.on_host and "the host saw nothing" in m.races[0].describe()


@pytest.mark.parametrize("seen", [True, False])
def test_the_host_reads_a_d2h_copy_target(seen):
    m = SanitizerModel()
    m.op(SIDE, W(op="copy_", space="host", base=1))
    if seen:
        m.stream_sync(SIDE)
    m.host_op(R(op="sum", space="host", base=1))
    assert kinds(m) == ([] if seen else ["read-after-write"])


def test_stream_work_after_host_work_is_ordered():
    m = SanitizerModel()
    m.host_op(W(space="host", base=1))
    m.op(SIDE, R(space="host", base=1))
    assert m.races == []


# ---- graphs: captured, not run; replayed at replay time ----------------------------

def capture(m: SanitizerModel, body, key=GRAPH, stream=CAP):
    m.capture_begin(key, stream)
    body()
    m.capture_end(key)


def test_captured_work_does_not_run_at_capture():
    m = SanitizerModel()
    m.op(SIDE, W(op="copy_"))  # unordered with the capture's read, but the read does not run now
    capture(m, lambda: m.op(CAP, R(op="mul")))
    assert m.races == []


@pytest.mark.parametrize("fenced", [True, False])
def test_a_replay_reads_after_a_side_stream_copy(fenced):
    """The acceptance case: an H2D copy on a side stream, a graph that reads its target."""
    m = SanitizerModel()
    capture(m, lambda: m.op(CAP, R(op="mul")))
    m.host_sync()
    m.op(SIDE, W(op="copy_"))
    m.record(1, SIDE)
    if fenced:
        m.wait(1, MAIN)
    m.replay(GRAPH, MAIN, ("test.py:1 in main",))
    assert kinds(m) == ([] if fenced else ["read-after-write"])
    if not fenced:
        race = m.races[0]
        assert race.later.graph == "graph 1 replay 0" and "replayed on stream 0" in race.later.where
        assert race.earlier.use.site.operator == "copy_" and race.earlier.where == "stream 0x100"
        assert "replayed at: test.py:1 in main" in race.describe()


def test_a_wait_before_capture_does_not_order_a_later_replay():
    m = SanitizerModel()
    m.op(SIDE, W())
    m.record(1, SIDE)
    m.wait(1, MAIN)  # orders the capture's... nothing: captured work runs at replay
    capture(m, lambda: m.op(CAP, R()))
    m.op(SIDE, W())  # the next copy
    m.replay(GRAPH, MAIN)
    assert kinds(m) == ["read-after-write"]


def test_the_replay_stream_waits_for_the_whole_graph():
    m = SanitizerModel()
    capture(m, lambda: m.op(CAP, W()))
    m.replay(GRAPH, MAIN)
    m.op(MAIN, R())
    assert m.races == []
    m.op(SIDE, R())  # no edge from MAIN's replay to SIDE
    assert kinds(m) == ["read-after-write"]


def test_launches_of_one_graph_are_ordered_after_each_other():
    m = SanitizerModel()
    capture(m, lambda: m.op(CAP, W()))
    m.replay(GRAPH, MAIN)
    m.replay(GRAPH, SIDE)  # another stream: CUDA orders a graph's launches
    assert m.races == []


def test_a_race_in_a_replay_loop_is_one_race_counted():
    m = SanitizerModel()
    capture(m, lambda: m.op(CAP, R()))
    for _ in range(5):
        m.op(SIDE, W())
        m.replay(GRAPH, MAIN)
        m.host_sync()
    assert len(m.races) == 1 and m.races[0].times == 5


@pytest.mark.parametrize("where", ["before the read", "after the read", "none"])
def test_an_external_wait_captured_in_the_graph_is_honoured_at_replay(where):
    m = SanitizerModel()
    m.record(9, SIDE)  # the external event exists before capture

    def body():
        if where == "before the read":
            m.wait(9, CAP)  # recorded outside the capture: a wait node
        m.op(CAP, R(op="mul"))
        if where == "after the read":
            m.wait(9, CAP)

    capture(m, body)
    m.op(SIDE, W(op="copy_"))
    m.record(9, SIDE)  # re-recorded after the copy, before replay: the node waits on this one
    m.replay(GRAPH, MAIN)
    assert kinds(m) == ([] if where == "before the read" else ["read-after-write"])


def test_an_external_wait_on_an_event_recorded_too_early():
    m = SanitizerModel()
    m.record(9, SIDE)
    capture(m, lambda: (m.wait(9, CAP), m.op(CAP, R())))
    m.record(9, SIDE)  # before the copy: the known-bad fence
    m.op(SIDE, W())
    m.replay(GRAPH, MAIN)
    assert kinds(m) == ["read-after-write"]


def forked(m: SanitizerModel, external_wait: bool):
    """CAP forks FORK (which reads X) and waits externally on 9 before it reads Y; FORK joins back."""
    def body():
        m.record(1, CAP)
        m.wait(1, FORK)  # FORK joins the capture
        m.op(FORK, R(0, 64, "read_x"))
        m.record(2, FORK)
        if external_wait:
            m.wait(9, CAP)
        m.op(CAP, R(64, 128, "read_y"))
        m.wait(2, CAP)

    m.record(9, SIDE)
    capture(m, body)
    assert not m.capturing(FORK) and not m.capturing(CAP)


@pytest.mark.parametrize("external_wait", [True, False])
def test_an_external_wait_orders_only_the_nodes_after_it(external_wait):
    m = SanitizerModel()
    forked(m, external_wait)
    m.op(SIDE, W(0, 128, "copy_"))
    m.record(9, SIDE)
    m.replay(GRAPH, MAIN)
    found = sorted(r.later.use.site.operator for r in m.races)
    assert found == (["read_x"] if external_wait else ["read_x", "read_y"])
    fork_side = next(r for r in m.races if r.later.use.site.operator == "read_x")
    assert "stream 0x300 as captured" in fork_side.later.where


def test_an_internal_edge_orders_the_forked_branch_inside_the_graph():
    m = SanitizerModel()

    def body():
        m.op(CAP, W(op="fill_"))
        m.record(1, CAP)
        m.wait(1, FORK)
        m.op(FORK, R(op="sum"))
        m.record(2, FORK)
        m.wait(2, CAP)

    capture(m, body)
    m.replay(GRAPH, MAIN)
    m.replay(GRAPH, MAIN)
    assert m.races == []


@pytest.mark.parametrize("external", [True, False])
def test_an_external_record_in_the_graph_is_re_recorded_by_each_replay(external):
    m = SanitizerModel()
    if external:
        m.external_event(5)
    capture(m, lambda: (m.op(CAP, R(op="mul")), m.record(5, CAP)))
    m.replay(GRAPH, MAIN)
    m.wait(5, SIDE)  # the next copy waits for the graph's read
    m.op(SIDE, W(op="copy_"))
    assert kinds(m) == ([] if external else ["write-after-read"])


def test_ops_on_a_stream_outside_the_capture_run_at_once():
    m = SanitizerModel()
    m.capture_begin(GRAPH, CAP)
    m.op(SIDE, W())  # runs now
    m.op(MAIN, R())  # runs now, unordered with it
    m.capture_end(GRAPH)
    assert kinds(m) == ["read-after-write"]


def test_a_replay_of_a_graph_it_never_saw_captured_is_counted():
    m = SanitizerModel()
    m.replay("other", MAIN)
    assert m.unknown_replays == 1 and m.races == []


# ---- the real graph's edges in place of the captured wait records -----------------

@pytest.mark.parametrize("edges,races", [(frozenset({9}), []), (frozenset(), ["read-after-write"]), (None, [])])
def test_graph_edges_replace_the_captured_waits(edges, races):
    asked = []

    def graph_edges(key, index, op):
        asked.append((key, index, op.uses[0].site.operator))
        return edges

    m = SanitizerModel(graph_edges=graph_edges)
    m.record(9, SIDE)
    capture(m, lambda: (m.wait(9, CAP), m.op(CAP, R(op="mul"))))  # the record says: ordered
    m.op(SIDE, W())
    m.record(9, SIDE)
    m.replay(GRAPH, MAIN)
    assert kinds(m) == races
    assert asked == [(GRAPH, 1, "mul")]


def test_graph_edges_can_find_a_wait_the_record_lacks():
    m = SanitizerModel(graph_edges=lambda key, index, op: frozenset({9}))
    m.record(9, SIDE)
    capture(m, lambda: m.op(CAP, R()))  # no captured wait
    m.op(SIDE, W())
    m.record(9, SIDE)
    m.replay(GRAPH, MAIN)
    assert m.races == []


# ---- bookkeeping --------------------------------------------------------------------

def test_freed_memory_forgets_its_accesses():
    m = SanitizerModel()
    m.op(SIDE, W(base=0x10))
    m.free(0x10)
    m.op(MAIN, R(base=0x10))
    assert m.races == []


def test_history_stays_short_in_a_loop():
    m = SanitizerModel()
    capture(m, lambda: m.op(CAP, R()))
    for _ in range(200):
        m.op(SIDE, W())
        m.record(1, SIDE)
        m.wait(1, MAIN)
        m.replay(GRAPH, MAIN)
        m.op(MAIN, R())
        m.record(2, MAIN)
        m.wait(2, SIDE)
    assert m.races == []
    assert len(m._history[0]) <= 3


def test_the_host_stream_is_never_a_real_one():
    m = SanitizerModel()
    assert m.name(HOST) == "the host" and m.name(0).startswith("stream 0")
    assert RaceKind("read-after-write") is RaceKind.READ_AFTER_WRITE


def test_the_capture_is_readable_in_the_order_graph_edges_are_asked_about():
    m = SanitizerModel()
    m.record(9, SIDE)
    capture(m, lambda: (m.wait(9, CAP), m.op(CAP, R(op="mul")), m.record(3, CAP)))
    kinds_ = [type(op).__name__ for op in m.captured(GRAPH)]
    assert kinds_ == ["CapturedWait", "CapturedOp", "CapturedRecord"]
    assert m.captured(GRAPH)[0].external and m.captured("other") == ()


def test_a_graph_captured_again_under_the_same_key_is_a_new_graph():
    m = SanitizerModel()
    capture(m, lambda: m.op(CAP, W()))
    m.replay(GRAPH, MAIN)
    capture(m, lambda: m.op(CAP, R()))  # the same key and stream: the old graph is gone
    m.replay(GRAPH, SIDE)  # not ordered after the old graph's launch on MAIN
    assert kinds(m) == ["read-after-write"]


# ---- the caching allocator: a block freed while another stream still uses it -------------

BLOCK = 0x1000


def block_read_on_the_side(m: SanitizerModel, *, recorded: bool = False, joined: bool = False) -> None:
    """A block allocated on MAIN and filled there, read on SIDE, then freed (`del`) on MAIN; with
    `recorded`, `record_stream(SIDE)` first; with `joined`, MAIN waits for SIDE before the free."""
    m.allocate(BLOCK, MAIN)
    m.op(MAIN, W(BLOCK, BLOCK + 64, op="fill_", base=BLOCK))
    m.record(1, MAIN)
    m.wait(1, SIDE)
    m.op(SIDE, R(BLOCK, BLOCK + 64, op="mm", base=BLOCK))
    if recorded:
        m.record_stream(BLOCK, SIDE)
    if joined:
        m.record(2, SIDE)
        m.wait(2, MAIN)
    m.free(BLOCK)


@pytest.mark.parametrize("recorded", [False, True])
def test_a_block_freed_while_a_side_stream_reads_it_races_with_its_next_owner(recorded):
    m = SanitizerModel()
    block_read_on_the_side(m, recorded=recorded)
    m.allocate(BLOCK, MAIN)  # the allocator hands it out again on the stream it belongs to
    m.op(MAIN, W(BLOCK, BLOCK + 64, op="copy_", base=BLOCK))
    if recorded:  # the allocator reuses it only once the side stream's work at the free is done
        assert m.races == []
        return
    (race,) = m.races
    assert race.kind is RaceKind.WRITE_AFTER_READ
    assert (race.earlier.use.site.operator, race.later.use.site.operator) == ("mm", "copy_")
    assert "freed" in race.describe() and "record_stream" in race.describe()


def test_a_block_freed_after_its_stream_waited_for_the_reader_is_reused_safely():
    m = SanitizerModel()
    block_read_on_the_side(m, joined=True)
    m.allocate(BLOCK, MAIN)
    m.op(MAIN, W(BLOCK, BLOCK + 64, base=BLOCK))
    assert m.races == []


def test_the_next_owner_inherits_only_where_it_overlaps_the_old_block():
    m = SanitizerModel()
    block_read_on_the_side(m)
    inner = BLOCK + 32  # a block split from the freed one
    m.allocate(inner, MAIN)
    m.op(MAIN, W(inner + 32, inner + 64, base=inner))  # past the old block's end
    assert m.races == []
    m.op(MAIN, W(inner, inner + 16, base=inner))  # inside it
    assert kinds(m) == ["write-after-read"]


def test_a_block_is_handed_out_again_only_on_the_stream_it_was_allocated_on():
    m = SanitizerModel()
    block_read_on_the_side(m)
    m.allocate(BLOCK, FORK)  # another stream's pool: this memory came from a fresh segment
    m.op(FORK, W(BLOCK, BLOCK + 64, base=BLOCK))
    assert m.races == []


def test_a_host_synchronize_before_the_reuse_orders_the_old_reader():
    m = SanitizerModel()
    block_read_on_the_side(m)
    m.host_sync()
    m.allocate(BLOCK, MAIN)
    m.op(MAIN, W(BLOCK, BLOCK + 64, base=BLOCK))
    assert m.races == [] and m._released == {}


def test_the_old_owners_pending_accesses_go_to_one_new_owner_and_on_with_it():
    m = SanitizerModel()
    block_read_on_the_side(m)
    m.allocate(BLOCK, MAIN)
    m.op(MAIN, R(BLOCK, BLOCK + 64, base=BLOCK))  # a read: no race with the old read, which it takes on
    m.free(BLOCK)  # freed again: the old reader is still pending on it
    m.allocate(BLOCK, MAIN)
    m.op(MAIN, W(BLOCK, BLOCK + 64, base=BLOCK))
    assert kinds(m) == ["write-after-read"]
