"""Fences whose waits nothing will ever release, so that a replay can never finish.

`value_never_written`: the forward waits until a flag reaches a value no stream writes.
`record_behind_it`: the forward waits on an event whose record is queued on the load stream
behind such a value wait (the event is never recorded). Tests use them to show that work that can
never run is that scenario's error, naming the stream, the wait and what it waits for, and that
the next scenario runs as if nothing happened.
"""

from harness.api import FenceContext, FenceSetup

NEVER = 5  # no stream ever writes it: the flags are made 0 and never written


class value_never_written:  # noqa: N801 - named as a plugin is
    def setup(self, s: FenceSetup) -> None:
        self.flags = s.dev.Flags(1, 0)

    def __call__(self, ctx: FenceContext) -> None:
        self.flags.wait(0, NEVER)


class record_behind_it(value_never_written):  # noqa: N801
    def __call__(self, ctx: FenceContext) -> None:
        event = ctx.dev.Event()
        with ctx.dev.stream(ctx.load):
            self.flags.wait(0, NEVER)
            event.record()
        ctx.forward.wait_event(event)


class host_waits_behind_it(value_never_written):  # noqa: N801
    """The host waits (bounded) on the event queued behind the stuck wait: the wait times out."""

    def __call__(self, ctx: FenceContext) -> None:
        event = ctx.dev.Event()
        with ctx.dev.stream(ctx.load):
            self.flags.wait(0, NEVER)
            event.record()
        ctx.host_wait(event)
