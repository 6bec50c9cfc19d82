"""Plugins a user might write, right and wrong, for the tests of what the harness does with them.

They use only the plugin API, `harness.api`.
"""

from harness.api import layerwise

# ---------------------------------------------------------------- correct, and unusual


def poll_until_loaded(ctx):
    """Correct: the host polls the load op's final event until it completes, then the replay goes.

    A True query orders the host after the event, as a blocking wait would.
    """
    if ctx.op is None:
        return
    while not ctx.op.finish_event.query():
        pass


# ---------------------------------------------------------------- wrong


def late_state_copy(op):
    """The engine's load op, then one more copy of the last Mamba layer's state that no event
    covers, held back 2 ms: it lands after the prefill wrote that state, and clobbers it."""
    layerwise(op)
    last = max(i for i, kind in enumerate(op.layer_kinds) if kind == "mamba")
    op.dev.delay(2000.0)
    for chunk in op.plan[last]:
        for c in chunk:
            op.copy(c)


# ---------------------------------------------------------------- plugins that break


def raising_fence(ctx):
    raise ValueError("the fence broke")


def raising_schedule(op):
    raise KeyError("the schedule broke")


def raising_accessor(counter, layer_id, pool):
    raise RuntimeError("the accessor broke")


def number_fence(ctx):
    return 42  # neither None nor a runner


class BadSetupFence:
    def setup(self):  # a fence's setup takes the FenceSetup
        pass

    def __call__(self, ctx):
        return None


class RaisingSetupFence:
    def setup(self, s):
        raise ZeroDivisionError("setup broke")

    def __call__(self, ctx):
        return None
