"""The load counter's interface: what every accessor, fence and schedule waits through, whether the
harness's own counter (`harness.protocol.loadback`) or an engine's (`harness.engines`) stands behind it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from harness.devices.base import Event


class LoadEventSet(Protocol):
    """One load op's events, as the engine's `LayerLoadingEvent` holds them (the harness's own, below,
    or the engine's under `engine = ...`)."""

    num_layers: int
    start_event: Event  # recorded on the scheduling stream as the op starts
    load_events: list[Event]  # load_events[i]: recorded on the load stream after layer i's copies

    @property
    def finish_event(self) -> Event: ...  # load_events[-1]: what the engine's fence waits on

    def complete(self, layer_index: int) -> None: ...  # record load_events[i] on the current stream

    def wait(self, layer_index: int) -> None: ...  # the current stream waits on load_events[i]


class LoadCounter(Protocol):
    """The load-event counter every accessor and fence waits through, as the engine's
    `LayerDoneCounter` is: a ring of event sets, a producer index the load ops advance and a
    consumer index the batch carries.

    A plugin reads `num_layers` and `consumer_index` (-1: no load pending for this batch, and
    always so while a graph is captured) and calls `wait_until(i)`, which enqueues a wait on the
    pending op's event i on the current stream and does nothing at consumer index -1. The rest
    is the harness's bookkeeping.
    """

    num_layers: int
    producer_index: int
    consumer_index: int

    @property
    def events(self) -> Sequence[LoadEventSet]: ...  # the ring: events[i] is slot i's set

    def update_producer(self) -> int: ...

    def set_consumer(self, index: int) -> None: ...

    def wait_until(self, threshold: int) -> None: ...
