"""The `chunked` fault: each layer's copies split into parts with a gap before each after the first."""

from __future__ import annotations

import random
from typing import Any

from harness.faults.keys import CHUNKS, US
from harness.faults.strategy import FaultStrategy
from harness.records.scenario import Fault, FaultKind

DEFAULT_GAP_US = 50.0


class Chunked(FaultStrategy):
    """Each layer's copies split into `chunks` parts with `us` before each part after the first: a layer
    can be read partly loaded."""

    name = FaultKind.CHUNKED
    keys = (CHUNKS.needed(), US)
    splits_copies = True
    soaks = True

    def build(self, values: dict[str, Any], key: str) -> Fault:
        return Fault(self.name, **{"us": DEFAULT_GAP_US, **values})

    def describe(self, fault: Fault) -> str:
        return f"chunked x{fault.chunks} gap {fault.us:g}us"

    def pause_us(self, fault: Fault, replay: int, layer: int, chunk: int) -> float:
        return fault.us if chunk > 0 else 0.0

    def chunks(self, fault: Fault) -> int:
        return fault.chunks

    def draw(self, rng: random.Random) -> Fault:
        return Fault(self.name, us=round(rng.uniform(5, 300), 1), chunks=rng.randint(2, 8))


__all__ = ["Chunked"]
