"""What a command line may say about a device: the device names and the simulator's cost model.

Plain records with no torch, so that building the command-line parser (its choices, the
`--sim-cost` help) imports none; `harness.devices` opens the devices they name.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from harness.records.errors import InputError

DEVICE_NAMES = ("auto", "cuda", "sim")
# The costs measured on a GPU by `fence-harness calibrate` (harness.studies.calibration), with the
# points they were fitted to and the machine: the simulator's defaults, read from there alone.
CALIBRATION = Path(__file__).with_name("sim_costs.json")
_MEASURED: dict[str, float] = json.loads(CALIBRATION.read_text())["costs"]


@dataclass(frozen=True)
class SimCosts:
    """The simulator's cost model; every constant can be set from the command line. The defaults are
    the costs `fence-harness calibrate` measured on a GPU (harness/records/sim_costs.json).

    bandwidth_gbps: pinned host-to-device copy bandwidth.
    copy_latency_us: device time of a copy beyond its bytes over the bandwidth (a copy of a few
                    bytes still takes it).
    launch_us:      host time to enqueue one op outside a graph.
    replay_us:      host time to launch one graph replay.
    access_us:      device time of a kernel that reads or writes pool memory (a layer's core).
    kernel_us:      device time of any other kernel.
    poll_us:        host time of one event query.
    """

    bandwidth_gbps: float = _MEASURED["bandwidth_gbps"]
    copy_latency_us: float = _MEASURED["copy_latency_us"]
    launch_us: float = _MEASURED["launch_us"]
    replay_us: float = _MEASURED["replay_us"]
    access_us: float = _MEASURED["access_us"]
    kernel_us: float = _MEASURED["kernel_us"]
    poll_us: float = _MEASURED["poll_us"]

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
            # A copy may cost its bytes alone; any other cost at zero stops virtual time (a polling
            # host would never move on).
            if not (value >= 0 if key == "copy_latency_us" else value > 0) or value == math.inf:
                kind = "a number, 0 or more" if key == "copy_latency_us" else "a positive number"
                raise InputError(source, key, f"expected {kind}, got '{text}'")
            values[key] = value
        return cls(**values)
