"""Fence strategies: what the forward stream does right before a replay.

A fence is a callable that receives a `FenceContext` and enqueues whatever
waits it wants on the forward stream (the current stream when it is called).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from harness.devices.base import Device, Stream
from harness.loadback import LayerDoneCounter
from harness.scenario import Fence


@dataclass(frozen=True)
class FenceContext:
    dev: Device
    forward: Stream  # the stream the replay is enqueued on
    load: Stream  # the load-back side stream
    counter: LayerDoneCounter  # consumer_index says which load op is pending (-1: none)


FenceFn = Callable[[FenceContext], None]


def no_fence(ctx: FenceContext) -> None:
    """Reference only: the bug. A full-graph replay runs no per-layer waits."""


def final_event_fence(ctx: FenceContext) -> None:
    """The fix under test: one wait on the pending load op's final event.

    Mirrors the engine's `_wait_for_layer_loads`: when a load is pending
    (consumer index >= 0), `wait_until(num_layers - 1)` enqueues a wait on the
    last layer's load event on the current (forward) stream before replay.
    """
    if ctx.counter.consumer_index >= 0:
        ctx.counter.wait_until(ctx.counter.num_layers - 1)


FENCES: dict[Fence, FenceFn] = {
    Fence.NONE: no_fence,
    Fence.FINAL_EVENT: final_event_fence,
}
