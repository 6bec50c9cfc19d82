"""The plugin API: everything a fence, accessor, schedule or engine adapter written outside this
package may use, and nothing else. Import from here only; every other module path is internal and
may move. `API_VERSION` names this surface; a change of meaning of any name below is a new version,
written in the CHANGELOG, and a plugin using a name a version removed gets one line naming the
replacement (`ApiChanged`).

A plugin is named in a scenario file or on the command line as `package.module:callable`
(importable from the working directory or the Python path). A module may say which version it is
written for with `HARNESS_API = 2`; another version is refused at load with what changed since.

The three kinds, and how the harness calls each (on the host; none may block it unless it says so):

    fence(ctx: FenceContext) -> Runner | None
        right before each replay, with the forward stream current, after the batch's load op
        was enqueued: enqueue the waits you want; return a runner to run this batch instead of
        the scenario's, or None.
    accessor(counter: LoadCounter, layer_id: int, pool: str) -> None
        each time the forward asks a pool for a layer's buffer ("kv", "mamba", or "index" for a
        model's sparse-attention index), eagerly and
        once while a graph is captured (a replay runs no Python: a wait on an external event or a
        value wait made then is a node of the graph; anything else it does is not replayed).
    schedule(op: LoadOp) -> None
        once per load op, with the load stream current: enqueue the op's start wait, copies and
        layer completions (`op.wait_start()`, `op.hold()`, `op.copy_layer(i)`, `op.complete(i)`);
        `layerwise` is the engine's own, for a schedule that wraps it.

Each may be a class instead, whose instances are called so. The harness makes one instance per
scenario, with no arguments, so the state an instance keeps (events, flags, captured graphs) is
that scenario's alone; a fence class may define `setup(s: FenceSetup)`, called once per scenario
before anything is captured. A schedule class that records its events inside a captured graph sets
`records_in_graph = True`, so the counter's events are made external.

What a plugin can count on (each checked by tests/test_api.py):

- A layer completes only through `LoadOp.complete(layer)`: it records the layer's load event and
  then runs every `FenceSetup.on_layer_loaded` listener, both on the load stream, whichever stream
  is current where it is called (inside a captured load op, on the capture's stream).
- `FenceSetup.runner(backend)` builds and captures a runner at once: its graphs hold the accessor
  waits added (`FenceSetup.add_wait`) before the call and none added after.
- `LoadOp.hold()` holds the current stream on the fault's gate the first time it is called in a
  load op; later calls in the same op do nothing (one gate, opened once by the host, after the
  forward). With no gate fault it does nothing.
- An exception a plugin raises ends its scenario as that scenario's error (`PluginError`, naming
  the plugin); the run goes on.

Regions: every copy and kernel names the pool slots it touches, so the happens-before analyser and
the graph check can see what a plugin's work orders. `Region(pool, layer, start, stop)` is slots
[start, stop) of one pool at one global layer id; device pools are `Pool.K`, `Pool.V`, `Pool.CONV`,
`Pool.SSM` (and `Pool.IDX`, a model's sparse-attention index, in compressed slots), and host
memory is `Pool.on_host(buffer, pool)` (never overlapping a device region).
`dev.copy_async(dst, src, region, source)` copies host to device on the current stream, writing
`region` and reading `source`; `dev.launch(fn, reads=[...], writes=[...], what="name")` runs device
work `fn` on the current stream. A `LayerCopy` of `op.plan` carries its own `region` and `source`.
"""

from __future__ import annotations

from harness.devices.base import Device, Event, Flags, Gate, Graph, Stream
from harness.engines.engine import Adapter, Engine, EngineLoader
from harness.faults.keys import CHUNKS, HOLD_US, POINTS, SEED, US, WHERE
from harness.faults.plan import FaultPlan
from harness.faults.registry import register_fault
from harness.faults.strategy import FaultKey, FaultStrategy
from harness.protocol.accessors import AccessorPolicy
from harness.protocol.counter import LoadCounter, LoadEventSet
from harness.protocol.fences import FenceContext, FenceFn, FenceSetup, Runner
from harness.protocol.layout import Layout
from harness.protocol.loadback import CopyPlan, LayerCopy
from harness.protocol.schedules import LayerListener, LoadOp, LoadStarter, Schedule, layerwise
from harness.records.errors import ApiChanged, HarnessError, InputError, PluginError, ReplayTimeout
from harness.records.plugin_api import API_VERSION
from harness.records.scenario import Backend, Fault
from harness.records.trace import Pool, Region

__all__ = [
    "API_VERSION",
    # fences
    "FenceContext", "FenceSetup", "FenceFn", "Runner", "Backend",
    # load-back
    "LoadOp", "LoadCounter", "LoadEventSet", "LayerCopy", "CopyPlan", "Schedule", "LayerListener",
    "LoadStarter", "FaultPlan", "Layout", "layerwise",
    # accessors
    "AccessorPolicy",
    # faults: a strategy, its keys (the shared ones: US, WHERE, SEED, CHUNKS, POINTS, HOLD_US), registered
    "Fault", "FaultStrategy", "FaultKey", "register_fault", "US", "WHERE", "SEED", "CHUNKS", "POINTS", "HOLD_US",
    # the device
    "Device", "Stream", "Event", "Flags", "Gate", "Graph", "Region", "Pool",
    # engine adapters
    "Adapter", "Engine", "EngineLoader",
    # errors
    "HarnessError", "InputError", "PluginError", "ApiChanged", "ReplayTimeout",
]
