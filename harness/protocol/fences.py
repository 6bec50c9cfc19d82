"""Fence strategies: what the forward stream does right before a replay.

A fence is a callable `fence(ctx: FenceContext) -> Runner | None`, called on the
host with the forward stream current, after the batch's load op was enqueued and
right before the forward. It enqueues whatever waits it wants (it must not block
the host unless that is the strategy: then through `ctx.host_wait`), and may return
a runner to run this batch instead of the scenario's (None: the scenario's).

A strategy that needs set-up or state is a class: the harness makes one instance per
scenario, with no arguments, and, before the runner captures anything, calls its
`setup(s: FenceSetup)` once (it can add accessor waits, act on every load op's layer
events, or prepare another runner). What an instance keeps is that scenario's alone.

Correct strategies and known-bad ones (mutants, which the kill matrix proves the
harness catches) sit in one registry; an engine adapter adds the engine's own
(`harness.engines`). A user's own fence is named in a scenario file or on the
command line as `package.module:callable`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from harness.devices.base import Device, Event, Stream
from harness.protocol.accessors import AccessorPolicy
from harness.protocol.counter import LoadCounter
from harness.protocol.loadback import RING
from harness.protocol.pools import HybridPool
from harness.protocol.schedules import LayerListener, LoadOp, LoadStarter
from harness.records.scenario import Backend


class Runner(Protocol):
    """What runs one forward (`harness.model.runners`): `run()` enqueues it on the current stream."""

    backend: Backend

    def run(self) -> None: ...


@dataclass(frozen=True)
class FenceContext:
    """What a fence gets, each replay.

    dev        the device (`dev.current_stream()`, `dev.Event()` ...)
    forward    the stream the replay is enqueued on (current when the fence runs)
    load       the load-back side stream
    counter    the `LayerDoneCounter`: `consumer_index` is the pending op's slot in the
               ring of 3 (-1: no load pending), `wait_until(i)` waits on its event i
    op         the pending `LoadOp` (the one the schedule got: `finish_event`,
               `load_events`, `plan`, `layout`, `index` ...), or None when no load is pending
    runner     the runner about to enqueue the forward (`runner.backend`)
    replay     the replay's index in the scenario (0-based; -1 for the traced replay the
               harness runs first, which is not counted)
    host_wait  `host_wait(event)` blocks the host until the event completes (bounded by
               the replay timeout; a gate fault's gate is opened first, as nothing else
               could open it). `event.query()` polls instead: a True orders the host after
               the event, as a wait does.
    """

    dev: Device
    forward: Stream
    load: Stream
    counter: LoadCounter
    op: LoadOp | None
    runner: Runner
    replay: int
    host_wait: Callable[[Event], None]


@dataclass(frozen=True)
class FenceSetup:
    """What a strategy's `setup` gets, once per scenario, before anything is captured.

    dev, forward, load, counter  as in FenceContext (no load is pending now)
    pool            the pools (`pool.kv`, `pool.mamba`)
    runner          `runner(backend)` builds and captures another runner on this scenario's
                    model (`Backend.BREAKABLE`, `Backend.FULL`, `Backend.EAGER`) now: its graphs
                    hold the accessor waits added before the call (`add_wait`) and none added
                    after it (a captured graph cannot change), so add waits first
    add_wait        `add_wait(policy)`: every pool accessor also runs `policy(counter,
                    layer_id, pool)`, eagerly and while the graph is captured (a wait on an
                    external event made then becomes a wait node of the graph)
    on_layer_loaded `on_layer_loaded(fn)`: every load op calls `fn(layer)` on the load
                    stream right after it records that layer's event (`LoadOp.complete`, the one
                    way a layer completes, built-in schedules and plugins alike)
    on_load_start   `on_load_start(fn)`: every load op calls `fn()` on the scheduling (forward)
                    stream before it records its start event: ordered after the previous
                    batch's forward and before this batch's, and before the op's copies
    """

    dev: Device
    forward: Stream
    load: Stream
    counter: LoadCounter
    pool: HybridPool
    runner: Callable[[Backend], Runner]
    add_wait: Callable[[AccessorPolicy], None]
    on_layer_loaded: Callable[[LayerListener], None]
    on_load_start: Callable[[LoadStarter], None]


FenceFn = Callable[[FenceContext], "Runner | None"]


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


def recorded_final_event_fence(ctx: FenceContext) -> None:
    """`final_event` with the recorded flag of sgl-project/sglang#38472: where a loader thread
    enqueues the load op (schedule `async_enqueue`), the host first blocks until the op's events
    are recorded (`LoadOp.wait_recorded`), then enqueues the wait on its final event. The plain
    `final_event` may wait before the record is enqueued, which orders nothing. With any other
    schedule it is `final_event`."""
    if ctx.counter.consumer_index >= 0:
        if ctx.op is not None:
            ctx.op.wait_recorded()
        ctx.counter.wait_until(ctx.counter.num_layers - 1)


class LayerwiseGraphFence:
    """Per-layer external events waited on inside the captured graph.

    Every load op re-records one fixed set of external events, layer by layer, on the
    load stream; every pool accessor waits on its layer's event, and under capture
    those waits become wait nodes of the graph. A replay then waits layer by layer and
    keeps the overlap of layer i's compute with layer i+1's copy. The graph waits on
    the set's latest record: a load op must have re-recorded the set before the replay
    is launched (the harness and the engine start the load before the forward); with
    no load pending the waits are on completed events and cost almost nothing.
    """

    created = True  # each event recorded once when made, so a graph captured before any load waits on it

    def setup(self, s: FenceSetup) -> None:
        events = [s.dev.Event(external=True, created=self.created) for _ in range(s.counter.num_layers)]
        s.on_layer_loaded(lambda layer: events[layer].record())
        s.add_wait(lambda counter, layer_id, pool: events[layer_id].wait())

    def __call__(self, ctx: FenceContext) -> Runner | None:
        return None  # the waits are inside the graph


# A value-wait flag's two values: loaded (what a replay waits for; flags are made so, so a
# forward with no load pending passes), and armed (not loaded yet).
LOADED = 1
ARMED = 0


class LayerwiseValueFence:
    """Per-layer value waits inside the captured graph: flags in device memory, one per layer.

    Every pool accessor waits until its layer's flag is LOADED (`cuStreamWaitValue32`, GEQ); under
    capture those waits are graph nodes, like `layerwise_graph`'s external-event waits, and a
    replay waits layer by layer and keeps the load/compute overlap. Every load op re-arms the
    flags (all ARMED, one write on the scheduling stream before the op's start event, so ordered
    after the previous batch's forward read them and before this batch's forward, and before
    the load stream writes any), and its load stream writes each layer's flag LOADED
    (`cuStreamWriteValue32`) right after that layer's copies and event.

    Why a reset and not a new value per op (a generation counter): a captured wait node compares
    against a constant fixed at capture, so a graph replayed for every op can only wait for one
    value; a new value per op would mean updating every wait node of the graph before each replay,
    on the host's critical path. The flag that holds the previous op's LOADED is what must not
    release this op's forward: the re-arm, ordered before the forward, is what prevents it (the
    mutant `value_not_rearmed` drops it).
    """

    rearm = True

    def setup(self, s: FenceSetup) -> None:
        flags = s.dev.Flags(s.counter.num_layers, LOADED)
        if self.rearm:
            s.on_load_start(lambda: flags.write_all(ARMED))
        s.on_layer_loaded(lambda layer: flags.write(layer, LOADED))
        s.add_wait(lambda counter, layer_id, pool: flags.wait(layer_id, LOADED))
        self.flags = flags

    def __call__(self, ctx: FenceContext) -> None:
        return None  # the waits are inside the graph


class PiecewiseFence:
    """The downgrade vLLM makes for connectors that load layer by layer (vllm-project/vllm#31057):
    every batch runs the breakable path (graph pieces, the pool reads eagerly between them, where
    the accessors' waits fire), whether or not a load is pending: the full graph is never used."""

    def setup(self, s: FenceSetup) -> None:
        self.pieces = s.runner(Backend.BREAKABLE)

    def __call__(self, ctx: FenceContext) -> Runner:
        return self.pieces


def host_sync_fence(ctx: FenceContext) -> None:
    """The host waits for the pending load op's final event, then launches the replay."""
    if ctx.op is not None and ctx.counter.consumer_index >= 0:
        ctx.host_wait(ctx.op.finish_event)


class EagerFallbackFence:
    """A batch with a pending load runs the breakable path (waits fire) instead of the graph."""

    def setup(self, s: FenceSetup) -> None:
        self.fallback = s.runner(Backend.BREAKABLE)

    def __call__(self, ctx: FenceContext) -> Runner | None:
        return self.fallback if ctx.counter.consumer_index >= 0 else None


# ---------------------------------------------------------------- mutants


def first_event_fence(ctx: FenceContext) -> None:
    """Mutant: waits on layer 0's event instead of the final one."""
    if ctx.counter.consumer_index >= 0:
        ctx.counter.wait_until(0)


def wrong_stream_fence(ctx: FenceContext) -> None:
    """Mutant: the right event, waited on by the load stream instead of the forward one."""
    if ctx.op is not None:
        ctx.load.wait_event(ctx.op.finish_event)


class LayerwiseUnrecordedFence(LayerwiseGraphFence):
    """Mutant: the first `layerwise_graph`. Its per-layer external events are never recorded
    before the capture, so CUDA has not created them when the accessors wait on them: torch
    enqueues no wait, and the graph holds no wait node. The load ops record them later, which
    no replay sees. Stale on the H200 while the op list said clean; the graph check sees the
    missing wait nodes without a replay."""

    created = False


class LateCounterFence(LayerwiseGraphFence):
    """Mutant (sgl-project/sglang#38354): the graph is captured before the accessors' waits exist.

    With a piecewise prefill backend forced, the engine skipped its HiCache check and registered
    the layer counter after capture: capture traced `layer_transfer_counter is None`, so the graph
    holds no wait at all, while every eager path (where the accessors run) waits correctly. Here the
    full-graph runner is captured first and `layerwise_graph`'s waits added after it, and every batch
    replays that graph. State that differs between capture and replay: the graph check names the
    missing wait nodes without a replay."""

    def setup(self, s: FenceSetup) -> None:
        self.early = s.runner(Backend.FULL)  # captured now: no accessor wait exists yet
        super().setup(s)  # the waits, added after the capture: no replay of `early` sees them

    def __call__(self, ctx: FenceContext) -> Runner:
        return self.early


def previous_op_fence(ctx: FenceContext) -> None:
    """Mutant: a stale consumer index, one behind in the ring of 3 (the previous load op)."""
    c = ctx.counter
    if c.consumer_index >= 0:
        c.events[(c.consumer_index - 1) % RING].finish_event.wait(ctx.forward)


class ValueNotRearmed(LayerwiseValueFence):
    """Mutant: the value-wait flags are never re-armed between load ops. Each still holds LOADED
    from the previous op, so the forward's waits pass at once, before this op's copies land."""

    rearm = False


# Correct strategies, in the order reports list them; a class is instantiated per scenario.
STRATEGIES = ("final_event", "layerwise_graph", "layerwise_value", "host_sync", "eager_fallback", "piecewise")

FENCES: dict[str, FenceFn | type] = {
    "none": no_fence,
    "final_event": final_event_fence,
    "recorded_final_event": recorded_final_event_fence,
    "layerwise_graph": LayerwiseGraphFence,
    "layerwise_value": LayerwiseValueFence,
    "host_sync": host_sync_fence,
    "eager_fallback": EagerFallbackFence,
    "piecewise": PiecewiseFence,
    "first_event": first_event_fence,
    "wrong_stream": wrong_stream_fence,
    "previous_op": previous_op_fence,
    "layerwise_unrecorded": LayerwiseUnrecordedFence,
    "value_not_rearmed": ValueNotRearmed,
    "late_counter": LateCounterFence,
}
