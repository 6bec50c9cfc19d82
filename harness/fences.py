"""Fence strategies: what the forward stream does right before a replay.

A fence is a callable `fence(ctx: FenceContext) -> None`, called on the host
with the forward stream current, after the batch's load op was enqueued and
right before the runner enqueues the forward. It enqueues whatever waits it
wants; it must not block the host unless that is the strategy.

Correct strategies and known-bad ones (mutants, which the kill matrix proves
the harness catches) sit in one registry. A user's own fence is named in a
scenario file or on the command line as `package.module:callable`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.devices.base import Device, Stream
from harness.loadback import RING, LayerDoneCounter, LayerLoadingEvent

if TYPE_CHECKING:
    from harness.runners import Runner


@dataclass(frozen=True)
class FenceContext:
    """What a fence gets.

    dev       the device (`dev.current_stream()`, `dev.Event()`, `dev.synchronize()` ...)
    forward   the stream the replay is enqueued on (current when the fence runs)
    load      the load-back side stream
    counter   the `LayerDoneCounter`: `consumer_index` is the pending op's slot in the
              ring of 3 (-1: no load pending), `wait_until(i)` waits on its event i
    op        the pending load op's `LayerLoadingEvent` (`start_event`, `load_events`,
              `finish_event`), or None when no load is pending
    runner    the runner about to enqueue the forward
    replay    the replay's index in the scenario (0-based)
    """

    dev: Device
    forward: Stream
    load: Stream
    counter: LayerDoneCounter
    op: LayerLoadingEvent | None = None
    runner: "Runner | None" = None
    replay: int = 0


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


# ---------------------------------------------------------------- mutants


def first_event_fence(ctx: FenceContext) -> None:
    """Mutant: waits on layer 0's event instead of the final one."""
    if ctx.counter.consumer_index >= 0:
        ctx.counter.wait_until(0)


def wrong_stream_fence(ctx: FenceContext) -> None:
    """Mutant: the right event, waited on by the load stream instead of the forward one."""
    if ctx.op is not None:
        ctx.load.wait_event(ctx.op.finish_event)


def previous_op_fence(ctx: FenceContext) -> None:
    """Mutant: a stale consumer index, one behind in the ring of 3 (the previous load op)."""
    c = ctx.counter
    if c.consumer_index >= 0:
        c.events[(c.consumer_index - 1) % RING].finish_event.wait(ctx.forward)


FENCES: dict[str, FenceFn] = {
    "none": no_fence,
    "final_event": final_event_fence,
    "first_event": first_event_fence,
    "wrong_stream": wrong_stream_fence,
    "previous_op": previous_op_fence,
}
