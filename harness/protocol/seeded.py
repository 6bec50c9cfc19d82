"""Seeded random data, drawn on the CPU (so every device gets the same numbers) once per process.

Every testbed of one model shape and seed draws the same weights and the same cached prefix: a
bench point builds a testbed for each of its arms, a run one for each scenario, and most scenarios
share a shape and a seed. An 80-layer model's weights take seconds to draw on a CPU, so the draws
of the last few keys are kept.

A kept draw is handed out again as it is: its callers copy it to the device, or into pinned host
memory of their own, before anything writes to it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

# How many keys each drawing function keeps. A bench point's arms all share one key, and scenarios
# of one shape mostly sit together in their file; an 80-layer model's weights are 1.3 GB in bf16, so
# each key kept costs host memory.
KEPT = 2


def drawn_once(draw: Callable[P, R]) -> Callable[P, R]:
    """`draw`, keeping its results for the last `KEPT` distinct arguments (which must be hashable)."""
    return functools.lru_cache(maxsize=KEPT)(draw)  # type: ignore[return-value]
