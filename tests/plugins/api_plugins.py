"""Plugins written against the plugin API (`harness.api`) alone, for tests/test_api.py: what the
API promises, each with a plugin that relies on it."""

from harness.api import Backend, FenceContext, FenceSetup, LoadCounter, LoadOp, layerwise

HARNESS_API = 2


class CountingSchedule:
    """The engine's schedule, counting the load ops of its own scenario (state on the instance)."""

    made = 0  # instances made, over the whole process

    def __init__(self):
        type(self).made += 1
        self.ops = 0

    def __call__(self, op: LoadOp) -> None:
        self.ops += 1
        layerwise(op)


class CountingAccessor:
    """The engine's per-layer wait, as a class: state per scenario."""

    def __init__(self):
        self.calls = 0

    def __call__(self, counter: LoadCounter, layer_id: int, pool: str) -> None:
        self.calls += 1
        counter.wait_until(layer_id)


HEARD: list[bool] = []  # per listener call: was the load stream current?


class CompletesFromTheFence:
    """Completes layer 0 once more from the fence, where the forward stream is current, and
    listens to every layer completion; each call notes whether the load stream was current."""

    def setup(self, s: FenceSetup) -> None:
        self.dev, self.load = s.dev, s.load
        s.on_layer_loaded(lambda layer: HEARD.append(self.dev.current_stream() is self.load))

    def __call__(self, ctx: FenceContext) -> None:
        if ctx.op is not None:
            ctx.op.complete(0)


def old_api_fence(ctx: FenceContext) -> None:
    """Written for plugin API 1, where ctx.op was the op's event set, with wait(layer)."""
    if ctx.op is not None:
        ctx.op.wait(ctx.op.num_layers - 1)  # type: ignore[attr-defined]


def holds_twice(op: LoadOp) -> None:
    """The engine's schedule with a second hold before the last layer: the gate holds once."""
    op.wait_start()
    op.hold()
    for layer in range(op.num_layers):
        if layer == op.num_layers - 1:
            op.hold()
        op.copy_layer(layer)
        op.complete(layer)


class _PerLayerEvents:
    """Per-layer external events re-recorded by every load op, waited on in the accessors."""

    def events(self, s: FenceSetup):
        events = [s.dev.Event(external=True) for _ in range(s.counter.num_layers)]
        s.on_layer_loaded(lambda layer: events[layer].record())
        return lambda counter, layer_id, pool: events[layer_id].wait()


class RunnerBeforeWaits(_PerLayerEvents):
    """Wrong: captures its full graph before adding the per-layer waits, so the graph holds none."""

    def setup(self, s: FenceSetup) -> None:
        self.graph = s.runner(Backend.FULL)
        s.add_wait(self.events(s))

    def __call__(self, ctx: FenceContext):
        return self.graph


class RunnerAfterWaits(_PerLayerEvents):
    """Right: adds the waits, then captures: the graph waits layer by layer."""

    def setup(self, s: FenceSetup) -> None:
        s.add_wait(self.events(s))
        self.graph = s.runner(Backend.FULL)

    def __call__(self, ctx: FenceContext):
        return self.graph
