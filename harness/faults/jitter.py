"""The `jitter` fault: seeded random delays before each layer, new ones every replay."""

from __future__ import annotations

import random

from harness.faults.delay import Delay
from harness.faults.keys import SEED, US, WHERE
from harness.records.scenario import DelayWhere, Fault, FaultKind


def jitter_us(seed: int, replay: int, layer: int, most: float) -> float:
    # A string seed hashes the same in every process (unlike hash() of a tuple).
    return random.Random(f"{seed}:{replay}:{layer}").uniform(0.0, most)


class Jitter(Delay):
    """A random delay in [0, `us`] before each layer, new every replay, a function of (seed, replay,
    layer) only."""

    name = FaultKind.JITTER
    keys = (US.needed(), WHERE, SEED)
    soaks = True

    def describe(self, fault: Fault) -> str:
        return f"jitter 0-{fault.us:g}us {fault.where.value} seed {fault.seed}"

    def delay_us(self, fault: Fault, replay: int, layer: int) -> float:
        return jitter_us(fault.seed, replay, layer, fault.us)

    def draw(self, rng: random.Random) -> Fault:
        return Fault(self.name, us=round(rng.uniform(1, 500), 1), where=rng.choice(list(DelayWhere)),
                     seed=rng.randrange(2**16))


__all__ = ["Jitter", "jitter_us"]
