"""Stream clocks on short record / wait / sync stories with fake stream ids."""

from harness.checkers.clocks import StreamClocks

LOAD, FWD, OTHER = 1, 2, 3


def test_same_stream_is_ordered():
    c = StreamClocks()
    copy = c.stamp(LOAD)
    assert c.ordered(LOAD, copy)


def test_other_stream_is_unordered_without_a_wait():
    c = StreamClocks()
    copy = c.stamp(LOAD)
    assert not c.ordered(FWD, copy)


def test_record_then_wait_orders_work_before_the_record_only():
    c = StreamClocks()
    before = c.stamp(LOAD)
    event = c.record(LOAD)
    after = c.stamp(LOAD)
    c.wait(FWD, event)
    assert c.ordered(FWD, before)
    assert not c.ordered(FWD, after)


def test_wait_on_a_never_recorded_event_orders_nothing():
    c = StreamClocks()
    copy = c.stamp(LOAD)
    c.wait(FWD, None)
    assert not c.ordered(FWD, copy)


def test_ordering_passes_through_a_third_stream():
    c = StreamClocks()
    copy = c.stamp(LOAD)
    c.wait(OTHER, c.record(LOAD))
    c.wait(FWD, c.record(OTHER))
    assert c.ordered(FWD, copy)


def test_host_sync_orders_everything_before_it_even_for_new_streams():
    c = StreamClocks()
    copy = c.stamp(LOAD)
    c.clock(FWD)
    c.host_sync()
    later = c.stamp(LOAD)
    assert c.ordered(FWD, copy) and c.ordered(OTHER, copy)
    assert not c.ordered(FWD, later)
