"""Load-back bookkeeping (`harness.protocol.loadback`) and pool layout / accessors (`harness.protocol.pools`)."""

from __future__ import annotations

import pytest

from harness.devices.sim import SimDevice
from harness.faults.plan import FaultPlan
from harness.protocol.accessors import kv_only, no_waits, per_layer
from harness.protocol.layout import PageAllocator, plan_layout
from harness.protocol.loadback import RING, LayerDoneCounter, SlotReusedEarly, plan_copies
from harness.protocol.schedules import start_loading
from harness.records.scenario import (
    Backend,
    DelayWhere,
    DType,
    Expect,
    Fault,
    FaultKind,
    ModelShape,
    Request,
    Scenario,
    kv_slots_needed,
)
from harness.records.trace import Copy, Delay, HostWait, Pool, Record, Region, Wait
from harness.run.testbed import Testbed

SHAPE = ModelShape(
    layers="AMAM", hidden=16, heads=2, kv_heads=1, head_dim=8, state=4, conv=3, expand=2,
    page_size=4, dtype=DType.FP32,
)
BATCH = (Request(prefix=5, new=3), Request(prefix=2, new=6))


def bench(batch=BATCH) -> Testbed:
    sc = Scenario("loadback", SHAPE, batch, Backend.EAGER, Expect.CLEAN)
    return Testbed(sc, SimDevice())


def waits(trace) -> list[Wait]:
    return [op for op in trace.ops if isinstance(op, Wait)]


def load(b: Testbed, fault: Fault = Fault(), schedule=None):
    """Run start_loading on the forward stream under a trace; returns (producer, ops)."""
    kwargs = {"schedule": schedule} if schedule else {}
    with b.dev.tracing() as t, b.dev.stream(b.forward):
        op = start_loading(b.dev, b.counter, b.load, plan_copies(b.layout, b.host, b.pool),
                           FaultPlan(fault), b.layout, **kwargs)
    return op.index, t.ops


# ---------------------------------------------------------------- LayerDoneCounter
def test_ring_of_three_producer_cycles():
    counter = LayerDoneCounter(SimDevice(), 2)
    assert RING == 3
    assert [counter.update_producer() for _ in range(4)] == [0, 1, 2, 0]


def test_wait_until_without_consumer_enqueues_nothing():
    dev = SimDevice()
    counter = LayerDoneCounter(dev, 2)
    assert counter.consumer_index == -1
    with dev.tracing() as t:
        counter.wait_until(0)
        counter.wait_until(1)
    assert waits(t) == []


def test_wait_until_with_consumer_enqueues_one_wait_for_that_event():
    dev = SimDevice()
    counter = LayerDoneCounter(dev, 3)
    counter.set_consumer(1)
    fwd = dev.Stream("forward")
    with dev.tracing() as t, dev.stream(fwd):
        counter.wait_until(2)
    assert waits(t) == [Wait(fwd.id, counter.events[1].load_events[2].id)]


def test_update_producer_raises_when_ring_wraps_onto_unfinished_load():
    dev = SimDevice()
    counter = LayerDoneCounter(dev, 1)
    load = dev.Stream("load")
    assert counter.update_producer() == 0
    with dev.stream(load):
        dev.delay(1e6)  # the load stream runs far ahead of the host clock
        counter.events[0].complete(0)
    assert not counter.events[0].finish_event.query()
    counter.update_producer()
    counter.update_producer()
    with pytest.raises(SlotReusedEarly):
        counter.update_producer()


def test_update_producer_reuses_set_once_its_load_finished():
    dev = SimDevice()
    counter = LayerDoneCounter(dev, 1)
    load = dev.Stream("load")
    counter.update_producer()
    with dev.stream(load):
        dev.delay(1e6)
        counter.events[0].complete(0)
    dev.synchronize()
    counter.update_producer()
    counter.update_producer()
    assert counter.update_producer() == 0


def test_start_loading_three_slow_loads_then_wrap_raises():
    b = bench()
    slow = FaultPlan(Fault(FaultKind.DELAY, 1e6))
    with b.dev.stream(b.forward):
        for _ in range(RING):
            start_loading(b.dev, b.counter, b.load, b.copies, slow, b.layout)
        with pytest.raises(SlotReusedEarly):
            start_loading(b.dev, b.counter, b.load, b.copies, slow, b.layout)


def test_complete_rejects_out_of_range_layer():
    counter = LayerDoneCounter(SimDevice(), 2)
    with pytest.raises(IndexError):
        counter.events[0].complete(2)


# ---------------------------------------------------------------- start_loading
def expected_layer_ops(b: Testbed, layer: int, producer: int) -> list:
    L = b.load.id
    # Each copy also names the host rows it reads (the host pool's own regions).
    if SHAPE.layers[layer] == "A":
        copies = [
            Copy(L, Region(pool, layer, r.prefix.start, r.prefix.stop),
                 source=Region(f"host_{pool}", layer, r.host_offset, r.host_offset + len(r.prefix)))
            for r in b.layout.requests
            for pool in (Pool.K, Pool.V)
        ]
    else:
        first, last = b.layout.requests[0].mamba_slot, b.layout.requests[-1].mamba_slot
        n = len(b.layout.requests)
        copies = [Copy(L, Region(pool, layer, first, last + 1), source=Region(f"host_{pool}", layer, 0, n))
                  for pool in (Pool.CONV, Pool.SSM)]
    return copies + [Record(L, b.counter.events[producer].load_events[layer].id)]


def test_start_loading_enqueues_start_handshake_then_per_layer_copies_and_record():
    b = bench()
    producer, ops = load(b)
    events = b.counter.events[producer]
    start = events.start_event.id
    # The ring's reuse check polls the set's final event first: a True query orders the host.
    expected = [HostWait(events.finish_event.id), Record(b.forward.id, start), Wait(b.load.id, start)]
    for layer in range(SHAPE.num_layers):
        expected += expected_layer_ops(b, layer, producer)
    assert ops == expected


def test_start_loading_copies_host_data_into_the_pools():
    b = bench()
    with b.dev.stream(b.forward):
        start_loading(b.dev, b.counter, b.load, plan_copies(b.layout, b.host, b.pool), FaultPlan(Fault()), b.layout)
    b.dev.synchronize()
    for a, _lid in enumerate(SHAPE.attention_layers):
        for r in b.layout.requests:
            rows = slice(r.host_offset, r.host_offset + len(r.prefix))
            assert b.pool.kv.k[a, r.prefix.start : r.prefix.stop].equal(b.host.k[a, rows])
            assert b.pool.kv.v[a, r.prefix.start : r.prefix.stop].equal(b.host.v[a, rows])
    for m, _lid in enumerate(SHAPE.mamba_layers):
        for i, r in enumerate(b.layout.requests):
            assert b.pool.mamba.conv[m, r.mamba_slot].equal(b.host.conv[m, i])
            assert b.pool.mamba.ssm[m, r.mamba_slot].equal(b.host.ssm[m, i])


def test_plan_copies_one_list_per_layer_with_views_of_the_pools():
    b = bench()
    plan = plan_copies(b.layout, b.host, b.pool)
    assert [len(layer) for layer in plan] == [1, 1, 1, 1]  # one chunk a layer
    assert [len(layer[0]) for layer in plan] == [4, 2, 4, 2]  # A: K,V x 2 requests; M: conv, ssm
    for layer in plan:
        for c in layer[0]:
            assert c.dst.shape == c.src.shape
    kv_k = b.pool.kv.k
    first = plan[0][0][0]
    assert first.dst.data_ptr() == kv_k[0, b.layout.requests[0].prefix.start].data_ptr()


def test_start_loading_skips_kv_copies_of_requests_without_prefix():
    b = bench((Request(prefix=0, new=3), Request(prefix=2, new=2)))
    _, ops = load(b)
    kv = [op.dst for op in ops if isinstance(op, Copy) and op.dst.pool in (Pool.K, Pool.V)]
    r1 = b.layout.requests[1]
    assert kv == [
        Region(pool, lid, r1.prefix.start, r1.prefix.stop)
        for lid in SHAPE.attention_layers
        for pool in (Pool.K, Pool.V)
    ]


def delays_before_layers(ops) -> dict[int, float]:
    """Layer -> the Delay seen right before that layer's first copy."""
    found, pending = {}, None
    for op in ops:
        if isinstance(op, Delay):
            pending = op.us
        elif isinstance(op, Copy) and pending is not None:
            found[op.dst.layer] = pending
            pending = None
        elif isinstance(op, Record) and pending is not None:
            pytest.fail("a Delay not followed by a copy")
    return found


def test_delay_each_puts_a_delay_before_every_layer():
    b = bench()
    _, ops = load(b, Fault(FaultKind.DELAY, 30.0, DelayWhere.EACH))
    assert delays_before_layers(ops) == {layer: 30.0 for layer in range(SHAPE.num_layers)}
    assert all(op.stream == b.load.id for op in ops if isinstance(op, Delay))


def test_delay_first_puts_one_delay_before_layer_zero():
    b = bench()
    _, ops = load(b, Fault(FaultKind.DELAY, 30.0, DelayWhere.FIRST))
    assert delays_before_layers(ops) == {0: 30.0}
    assert isinstance(ops[3], Delay)  # right after the reuse check and the start handshake


def test_a_custom_schedule_controls_the_load_op():
    def late_layer_two(op):
        op.wait_start()
        for layer in range(op.num_layers):
            if layer == 2:
                op.dev.delay(7.0)
            op.copy_layer(layer)
            op.complete(layer)

    b = bench()
    _, ops = load(b, schedule=late_layer_two)
    assert delays_before_layers(ops) == {2: 7.0}


def test_no_fault_no_delay():
    b = bench()
    _, ops = load(b, Fault())
    assert not any(isinstance(op, Delay) for op in ops)


# ---------------------------------------------------------------- pools
def test_plan_layout_page_aligned_contiguous_and_skips_page_zero():
    batch = (Request(prefix=5, new=3), Request(prefix=2, new=7), Request(prefix=4, new=4))
    layout = plan_layout(SHAPE, batch)
    page = SHAPE.page_size
    assert layout.kv_slots == kv_slots_needed(SHAPE, batch)
    used = set()
    for r, req in zip(layout.requests, batch, strict=False):
        assert r.prefix.start % page == 0
        assert r.prefix.start >= page  # page 0 is padding
        assert (len(r.prefix), len(r.new)) == (req.prefix, req.new)
        assert r.prefix.stop == r.new.start  # prefix then new, contiguous
        slots = set(r.prefix) | set(r.new)
        assert not slots & used
        used |= slots
    assert max(used) < layout.kv_slots


def test_plan_layout_mamba_slot_zero_reserved_and_rows_cumulative():
    layout = plan_layout(SHAPE, BATCH)
    assert [r.mamba_slot for r in layout.requests] == [1, 2]
    assert layout.mamba_slots == 3
    assert [r.host_offset for r in layout.requests] == [0, 5]
    assert [r.tokens for r in layout.requests] == [range(0, 3), range(3, 9)]
    assert (layout.total_new, layout.total_prefix) == (9, 7)


def test_page_allocator_alloc_is_page_aligned_and_never_page_zero():
    alloc = PageAllocator(16, 4)
    a, b = alloc.alloc(5), alloc.alloc(3)
    assert a == range(4, 9)
    assert b == range(12, 15)
    with pytest.raises(MemoryError):
        alloc.alloc(1)


def test_page_allocator_rejects_unaligned_pool():
    with pytest.raises(ValueError):
        PageAllocator(10, 4)


def accessor_waits(b: Testbed) -> list[Wait]:
    b.counter.set_consumer(0)
    with b.dev.tracing() as t, b.dev.stream(b.forward):
        b.pool.kv.get_key_buffer(0)
        b.pool.kv.get_value_buffer(0)
        b.pool.mamba_layer_cache(1)
    return waits(t)


def test_accessors_do_not_wait_without_counter():
    b = bench()
    b.pool.set_waits(None, [])
    assert accessor_waits(b) == []


def test_accessors_do_not_wait_under_the_none_policy():
    b = bench()
    b.pool.set_waits(b.counter, [no_waits])
    assert accessor_waits(b) == []


def test_accessors_wait_on_their_layer_event_when_counter_set():
    b = bench()
    b.pool.set_waits(b.counter, [per_layer])
    ev = b.counter.events[0].load_events
    f = b.forward.id
    assert accessor_waits(b) == [Wait(f, ev[0].id), Wait(f, ev[0].id), Wait(f, ev[1].id)]


def test_kv_only_policy_waits_in_the_kv_accessors_but_not_the_mamba_one():
    b = bench()
    ev = b.counter.events[0].load_events
    b.pool.set_waits(b.counter, [kv_only])
    assert accessor_waits(b) == [Wait(b.forward.id, ev[0].id)] * 2
    b.pool.set_waits(b.counter, [per_layer])
    assert len(accessor_waits(b)) == 3


def test_bare_mamba_pool_accessor_never_waits():
    b = bench()
    b.pool.set_waits(b.counter, [per_layer])
    b.counter.set_consumer(0)
    with b.dev.tracing() as t:
        b.pool.mamba.layer_cache(1)
    assert waits(t) == []


def test_a_load_op_tells_a_plugin_its_page_size_layer_kinds_and_events():
    b = bench()
    with b.dev.stream(b.forward):
        op = start_loading(b.dev, b.counter, b.load, b.copies, FaultPlan(Fault()), b.layout)
    assert op.page_size == SHAPE.page_size == 4
    assert op.layer_kinds == ("attention", "mamba", "attention", "mamba")
    events = b.counter.events[op.index]
    assert op.finish_event is events.finish_event and op.load_events == events.load_events
    assert op.start_event is events.start_event and op.stream is b.load
