"""Example plugins: one fence, one accessor wait policy and one load-back schedule.

Point a scenario at them by path, as a user points at their own module:

    fence = "harness.examples.plugins:every_layer_fence"
    accessor = "harness.examples.plugins:wait_for_whole_load"
    schedule = "harness.examples.plugins:mamba_state_first"
"""

from __future__ import annotations

from harness.api import FenceContext, LoadCounter, LoadOp

HARNESS_API = 2  # the plugin API these are written for (harness.api.API_VERSION)


def every_layer_fence(ctx: FenceContext) -> None:
    """Wait on every layer's load event before replay (correct, and no cheaper than one wait)."""
    if ctx.op is None or ctx.counter.consumer_index < 0:
        return  # no load pending for this batch
    for event in ctx.op.load_events:  # the pending LoadOp's events, one per layer
        ctx.forward.wait_event(event)


def wait_for_whole_load(counter: LoadCounter, layer_id: int, pool: str) -> None:
    """Every accessor waits for the whole load op, whatever layer it serves (correct, slower)."""
    counter.wait_until(counter.num_layers - 1)


def mamba_state_first(op: LoadOp) -> None:
    """Copy every Mamba layer's state before any KV, recording each layer's event after its copy.

    Events are recorded in copy order; a layer's event still follows its own copy,
    so the per-layer waits and the final-event fence stay correct. The final event
    is `load_events[-1]`, so the last layer must be recorded last: it is copied last.
    """
    op.wait_start()
    op.hold()
    last = op.num_layers - 1
    mamba = [i for i in range(last) if op.layer_kinds[i] == "mamba"]
    rest = [i for i in range(op.num_layers) if i not in mamba]
    for layer in mamba + rest:
        op.copy_layer(layer)
        op.complete(layer)
