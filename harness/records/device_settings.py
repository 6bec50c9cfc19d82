"""What a command line may say about a device: the device names and the simulator's cost model.

Plain records with no torch, so that building the command-line parser (its choices, the
`--sim-cost` help) imports none; `harness.devices` opens the devices they name.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields

from harness.records.errors import InputError

DEVICE_NAMES = ("auto", "cuda", "sim")


@dataclass(frozen=True)
class SimCosts:
    """The simulator's cost model; every constant can be set from the command line.

    bandwidth_gbps: pinned host-to-device copy bandwidth (55 GB/s measured on an H200).
    launch_us:      host time to enqueue one op outside a graph.
    replay_us:      host time to launch one graph replay.
    access_us:      device time of a kernel that reads or writes pool memory (a layer's core).
    kernel_us:      device time of any other kernel.
    poll_us:        host time of one event query.
    """

    bandwidth_gbps: float = 55.0
    launch_us: float = 5.0
    replay_us: float = 10.0
    access_us: float = 20.0
    kernel_us: float = 2.0
    poll_us: float = 5.0

    @classmethod
    def keys(cls) -> list[str]:
        """The settable names, in declaration order: what `--sim-cost` accepts and its help lists."""
        return [f.name for f in fields(cls)]

    @classmethod
    def from_settings(cls, settings: Sequence[str], source: str = "--sim-cost") -> SimCosts:
        """`KEY=VALUE` strings (from the command line) over the defaults."""
        names = cls.keys()
        values = {}
        for item in settings:
            key, sep, text = item.partition("=")
            if key not in names:
                raise InputError(source, key or item, f"unknown cost; valid: {', '.join(names)} (as KEY=VALUE)")
            try:
                value = float(text) if sep else math.nan
            except ValueError:
                value = math.nan
            if not value > 0 or value == math.inf:
                raise InputError(source, key, f"expected a positive number, got '{text}'")
            values[key] = value
        return cls(**values)
