"""How a forward runs: eagerly, as graph segments around pool reads, or as one graph.

- eager: every step runs as Python, so the accessors' per-layer waits fire.
- breakable: the runs of steps between pool reads are captured as graph
  segments; the pool-reading steps run eagerly between them, so waits fire.
- full: the whole body is one graph; a replay runs no Python and so no waits.

Capture happens with no pending load (consumer index -1), as in the engine, so
no wait is captured into any graph.
"""

from __future__ import annotations

import abc
from collections.abc import Callable

from harness.devices.base import Device, Graph
from harness.model.stack import HybridModel, Step
from harness.protocol.counter import LoadCounter
from harness.records.errors import HarnessError
from harness.records.scenario import Backend


class Runner(abc.ABC):
    backend: Backend

    def __init__(self, dev: Device, model: HybridModel, counter: LoadCounter):
        self.dev = dev
        self.model = model
        self.counter = counter

    def prepare(self) -> None:  # noqa: B027 - the eager runner captures nothing
        """Capture whatever graphs the backend needs (no pending load allowed)."""

    @abc.abstractmethod
    def run(self) -> None:
        """Enqueue one forward on the current stream."""

    def _check_no_pending_load(self) -> None:
        if self.counter.consumer_index >= 0:
            raise HarnessError("capture with a pending load would capture its waits")


class EagerRunner(Runner):
    backend = Backend.EAGER

    def run(self) -> None:
        self.model.forward()


class BreakableRunner(Runner):
    backend = Backend.BREAKABLE

    def prepare(self) -> None:
        self._check_no_pending_load()
        self.plan: list[Callable[[], None]] = []
        segment: list[Step] = []

        def close() -> None:
            if segment:
                runs = [s.run for s in segment]

                def run_segment() -> None:
                    for run in runs:
                        run()

                self.plan.append(self.dev.capture(run_segment).replay)
                segment.clear()

        for step in self.model.steps:
            if step.reads_pool:
                close()
                self.plan.append(step.run)
            else:
                segment.append(step)
        close()

    def run(self) -> None:
        for item in self.plan:
            item()


class FullGraphRunner(Runner):
    backend = Backend.FULL
    graph: Graph

    def prepare(self) -> None:
        self._check_no_pending_load()
        self.graph = self.dev.capture(self.model.forward)

    def run(self) -> None:
        self.graph.replay()


RUNNERS: dict[Backend, type[Runner]] = {
    Backend.EAGER: EagerRunner,
    Backend.BREAKABLE: BreakableRunner,
    Backend.FULL: FullGraphRunner,
}


def make_runner(backend: Backend, dev: Device, model: HybridModel, counter: LoadCounter) -> Runner:
    """A runner of `backend`, its graphs captured (call with the forward stream current)."""
    runner = RUNNERS[backend](dev, model, counter)
    runner.prepare()
    return runner
