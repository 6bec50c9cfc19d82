"""Load-back schedules: how one load op enqueues its copies and events.

A schedule is a callable `schedule(op: LoadOp) -> None`, run on the host with the
load stream current. The correct one, `layerwise`, is the engine's: wait on the
op's start event (recorded on the scheduling stream, so the copies are ordered
after everything enqueued there before, including a previous batch's replay),
then for each layer its copies and `load_events[layer]`.

Known-bad schedules (mutants) live here too, so the kill matrix can prove the
harness catches them. A user's own schedule is named in a scenario file as
`package.module:callable` and receives the same `LoadOp`.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.devices.base import Device, Event, Gate, Graph, Stream
from harness.faults.plan import FaultPlan
from harness.protocol.counter import LoadCounter, LoadEventSet
from harness.protocol.layout import Layout
from harness.protocol.loadback import CopyPlan, LayerCopy
from harness.records.plugin_api import removed_name
from harness.records.scenario import LAYER_KINDS

# Called with a layer index right after that layer's event is recorded (load stream current).
LayerListener = Callable[[int], None]
# Called as a load op starts, on the scheduling stream, before its start event is recorded: what
# it enqueues is ordered after the previous batch's forward and before this one's, and before
# anything the load stream does for this op (a value-wait fence re-arms its flags here).
LoadStarter = Callable[[], None]


@dataclass
class LoadOp:
    """One load op, as a schedule and a fence see it (`harness.api`).

    A schedule gets it with the load stream current, and enqueues the op's work there:

    dev       the device (`dev.delay`, `dev.copy_async`, `dev.Event` ...)
    stream    the load stream
    plan      plan[layer][chunk]: the `LayerCopy`s (dst, src, region, source) to enqueue
    fault     the `FaultPlan` of this replay (`pause(layer, chunk)` applies it)
    index     the op's slot in the counter's ring of 3 (the batch's consumer index)
    layout    where the batch lives: `layout.shape` (layers, sizes), `layout.requests`
    gate      a device gate the fault holds the stream on, or None (`hold()` applies it)

    Its events are `start_event`, `load_events[i]` and `finish_event` (the harness's, or the
    engine's own under `engine = ...`). A layer is done only through `complete(layer)`: it records
    that layer's event and runs every `on_layer_loaded` listener, on the load stream.
    """

    dev: Device
    stream: Stream
    _events: LoadEventSet | None  # the set in the counter's ring; an engine's chain attaches it once started
    plan: CopyPlan
    fault: FaultPlan
    index: int
    layout: Layout
    gate: Gate | None = None
    listeners: Sequence[LayerListener] = ()
    held: bool = field(default=False, init=False)
    # The loader thread that enqueues this op's work, while it has not yet (`AsyncEnqueue`); None: done.
    thread: Callable[[], None] | None = field(default=None, init=False)

    def __getattr__(self, name: str) -> Any:
        # Only for names the class lacks: a name a plugin written for an older plugin API used.
        raise removed_name("LoadOp", name)

    def attach_events(self, events: LoadEventSet) -> None:
        """The event set an engine's own chain picked once it started the op (`index`'s)."""
        self._events = events

    @property
    def event_set(self) -> LoadEventSet:
        if self._events is None:
            raise RuntimeError("this load op has no event set yet: its chain has not started it")
        return self._events

    # ---- what it is ---------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return len(self.plan)

    @property
    def page_size(self) -> int:
        """KV slots per page (prefixes are allocated in whole pages; page 0 is padding)."""
        return self.layout.shape.page_size

    @property
    def layer_kinds(self) -> tuple[str, ...]:
        """"attention" or "mamba" for each layer, by global layer id."""
        return tuple(LAYER_KINDS[k] for k in self.layout.shape.layers)

    @property
    def start_event(self) -> Event:
        """Recorded on the scheduling stream before the schedule ran: the load stream's start wait."""
        return self.event_set.start_event

    @property
    def load_events(self) -> list[Event]:
        """load_events[i]: recorded by `complete(i)`, after layer i's copies."""
        return self.event_set.load_events

    @property
    def finish_event(self) -> Event:
        """The op's final event, `load_events[-1]`: what the engine's fence waits on."""
        return self.event_set.finish_event

    def wait_recorded(self) -> None:
        """Block the host until this op's events are recorded (enqueued on the load stream).

        Only an op a loader thread enqueues (`AsyncEnqueue`) can have events not recorded yet: this
        is its recorded flag (the sgl-project/sglang#38472 fix), which blocks the host until the
        thread has enqueued the records. A wait enqueued before them binds to no record, or to the
        ring slot's previous one: a no-op. For any other op it returns at once."""
        if self.thread is not None:
            self.thread()

    # ---- what a schedule does (each on the current stream, the load stream) ----------
    def wait_start(self) -> None:
        """The load stream waits on the start event (ordered after the scheduling stream)."""
        self.start_event.wait(self.stream)

    def hold(self) -> None:
        """Hold the current stream on the fault's gate until the host opens it, once per load op.

        The gate holds one stream: the first call enqueues the hold and later calls in the same
        op do nothing (the host opens the gate once, after the forward). With no gate, nothing."""
        if self.gate is not None and not self.held:
            self.gate.hold()
            self.held = True

    def pause(self, layer: int, chunk: int = 0) -> None:
        """The fault's delay before copy `chunk` of `layer`, on the current stream."""
        us = self.fault.pause_us(layer, chunk)
        if us > 0:
            self.dev.delay(us)

    def copy(self, c: LayerCopy) -> None:
        self.dev.copy_async(c.dst, c.src, c.region, c.source)

    def copy_layer(self, layer: int) -> None:
        """All chunks of one layer, with the fault's pauses before them."""
        for chunk, copies in enumerate(self.plan[layer]):
            self.pause(layer, chunk)
            for c in copies:
                self.copy(c)

    def complete(self, layer: int) -> None:
        """Layer `layer` is loaded: record its load event, then run every `on_layer_loaded` listener.

        Both on the load stream, whatever stream is current where it is called (inside a captured
        load op, on the capture's stream, which stands for the load stream in the graph): a
        listener's flag write or event record must follow that layer's copies in stream order."""
        with contextlib.nullcontext() if self.dev.capturing else self.dev.stream(self.stream):
            self.event_set.complete(layer)
            for listener in self.listeners:
                listener(layer)


Schedule = Callable[[LoadOp], None]


def layerwise(op: LoadOp) -> None:
    """The engine's load op: start wait, then per layer its copies and its event."""
    op.wait_start()
    op.hold()
    for layer in range(op.num_layers):
        op.copy_layer(layer)
        op.complete(layer)


def final_event_early(op: LoadOp) -> None:
    """Mutant: the final event is recorded before the last layer's copies.

    Under a gate fault the gate sits between that record and the copies, so a
    fence on the final event lets the replay run while the last layer is held.
    """
    op.wait_start()
    last = op.num_layers - 1
    for layer in range(last):
        op.copy_layer(layer)
        op.complete(layer)
    op.complete(last)
    op.hold()
    op.copy_layer(last)


def no_start_wait(op: LoadOp) -> None:
    """Mutant: the load stream never waits on the start event.

    Nothing then orders the copies after work the scheduling stream enqueued
    earlier: a previous batch's replay that still reads the reused slots.
    """
    op.hold()
    for layer in range(op.num_layers):
        op.copy_layer(layer)
        op.complete(layer)


def signal_before_copy(op: LoadOp) -> None:
    """Mutant: each layer's completion (its event, and whatever listens: a value-wait fence's
    flag) comes before that layer's copies, not after them.

    Under a gate fault the gate sits between layer 0's flag and its copies, so a forward that
    waits on the flag reads layer 0 while its copy is held.
    """
    op.wait_start()
    for layer in range(op.num_layers):
        op.complete(layer)
        op.hold()
        op.copy_layer(layer)


class CapturedLoad:
    """The whole load op as one captured graph: the host enqueues a start wait, the gate (under a
    gate fault) and one graph launch, whatever the number of layers, so the forward can start
    within tens of microseconds instead of after 2-4 enqueues per layer.

    The graph holds, per layer, its copies, its event record and whatever listens (a value-wait
    fence's flag write, `layerwise_graph`'s external event): the engine's order, layer by layer.
    It is captured at a ring slot's first load op (one graph per slot and copy plan), so a load
    op's events must be recordable inside a graph: the counter's events are external
    (`records_in_graph`). A captured graph cannot change per replay: the fault's pauses are
    added up and enqueued as one delay before the graph (a per-layer delay fault becomes one
    delay before layer 0), and a listener's Python runs only when its graph is captured.
    """

    records_in_graph = True

    def __init__(self) -> None:
        # One graph per ring slot's event set and copy plan, this scenario's alone (a schedule class
        # is made once per scenario). Keyed by identity, and holding both, so an id is never reused.
        self.graphs: dict[tuple[int, int], tuple[LoadEventSet, CopyPlan, Graph]] = {}

    def __call__(self, op: LoadOp) -> None:
        key = (id(op.event_set), id(op.plan))
        entry = self.graphs.get(key)
        if entry is None:
            # Captured before the gate is held: a capture synchronizes the device (CUDA), and a held
            # load stream would keep it waiting for the host that is capturing.
            graph = op.dev.capture(lambda: _copy_and_complete(op), warmup=0)
            entry = self.graphs[key] = (op.event_set, op.plan, graph)
        op.wait_start()
        op.hold()
        pause = sum(op.fault.pause_us(layer, chunk) for layer in range(op.num_layers)
                    for chunk in range(len(op.plan[layer])))
        if pause > 0:
            op.dev.delay(pause)
        entry[2].replay()


class AsyncEnqueue:
    """The load op enqueued by a loader thread of its own (sgl-project/sglang#38472,
    `SGLANG_HICACHE_ASYNC_LOAD_ENQUEUE`): the scheduler thread only takes the ring slot and records
    the start event (`start_loading`); the op's start wait, gate, copies and per-layer events
    (`layerwise`) are the thread's, enqueued later.

    The thread runs in enqueue order, so deterministically: its work is enqueued when the host
    drains it (`drain`). The replay loop drains it once the fence has run and before the forward
    is launched (the interleaving where a fence's wait comes before the records, and the graph
    launch after the copies), and again after the hazard's work; a consumer drains it first when it
    checks the op's recorded flag (`LoadOp.wait_recorded`, the fix). A wait enqueued before the
    records is a no-op (CUDA binds a wait to the event's record at the time of the wait): the
    engine's own fence, `final_event`, then orders nothing."""

    def __init__(self) -> None:
        self.queue: deque[LoadOp] = deque()  # ops whose work the thread has not enqueued yet, in order

    def __call__(self, op: LoadOp) -> None:
        op.thread = self.drain
        self.queue.append(op)

    def drain(self) -> None:
        """The thread runs: every op handed to it is enqueued now, in order, on its load stream."""
        while self.queue:
            op = self.queue.popleft()
            op.thread = None
            with op.dev.stream(op.stream):
                layerwise(op)


def _copy_and_complete(op: LoadOp) -> None:
    for layer in range(op.num_layers):
        for copies in op.plan[layer]:
            for c in copies:
                op.copy(c)
        op.complete(layer)


SCHEDULES: dict[str, Schedule | type] = {
    "layerwise": layerwise,
    "captured_load": CapturedLoad,
    "final_event_early": final_event_early,
    "no_start_wait": no_start_wait,
    "signal_before_copy": signal_before_copy,
    "async_enqueue": AsyncEnqueue,
}


def start_loading(
    dev: Device,
    counter: LoadCounter,
    load_stream: Stream,
    plan: CopyPlan,
    fault: FaultPlan,
    layout: Layout,
    schedule: Schedule = layerwise,
    gate: Gate | None = None,
    listeners: Sequence[LayerListener] = (),
    starters: Sequence[LoadStarter] = (),
) -> LoadOp:
    """Enqueue one load op; returns it (its `index` is the batch's consumer index).

    Called on the scheduling (forward) stream, as the engine's `start_loading` is:
    the start event is recorded there before the schedule runs on the load stream.
    """
    index = counter.update_producer()
    events = counter.events[index]
    for starter in starters:
        starter()
    events.start_event.record()  # on the scheduling stream
    op = LoadOp(dev, load_stream, events, plan, fault, index, layout, gate, listeners)
    with dev.stream(load_stream):
        schedule(op)
    return op
