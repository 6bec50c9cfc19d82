"""The run's environment: what the device reported, plus NVML's view of the GPU and the host's CPU;
and the simulator's cost model in words, for the report.

The GPU is matched in NVML by UUID (`harness.devices.nvml`), not by index.

Nothing here raises: the environment is context for a report, and a run that found a race must
not be lost because a clock could not be read. What could not be read is left out, with a note.
"""

from __future__ import annotations

import platform
import re
from dataclasses import fields
from pathlib import Path

from harness.devices import nvml
from harness.records.device_settings import SimCosts

CPUINFO = Path("/proc/cpuinfo")
# A setting's unit, from the suffix of its key ("launch_us"): the one convention its names follow.
UNITS = {"us": "µs", "ms": "ms", "s": "s", "gbps": "GB/s", "mib": "MiB", "gib": "GiB", "mhz": "MHz"}


def cpu_model() -> str:
    """The CPU's marketing name ("AMD EPYC 9654 ..."); platform.processor() is often just "x86_64"."""
    try:
        for line in CPUINFO.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def collect_environment(device_info: dict, torch_device=None) -> dict:
    """`device_info` (device.describe()) plus the host CPU and, on cuda, NVML's view of the GPU.

    The device's own keys win over NVML's where both exist (gpu from torch, say), so a report
    never shows two names for one thing.
    """
    env = dict(device_info)
    env.setdefault("host", platform.node())
    env["cpu_model"] = cpu_model()
    if env.get("device") == "cuda":
        try:
            uuid = nvml.torch_uuid(torch_device)
        except Exception as e:  # noqa: BLE001
            env["nvml_note"] = f"torch could not describe the device: {e}"
            return env
        for key, value in nvml.gpu_info(uuid).items():
            env.setdefault(key, value)
    return env


# ---- the simulator's cost model, in words -----------------------------------------------------


def unit(key: str) -> str:
    """The unit a key's suffix names ("bandwidth_gbps": "GB/s"), or "" where it names none."""
    _, sep, suffix = key.rpartition("_")
    return UNITS.get(suffix, "") if sep else ""


def cost_meanings() -> dict[str, str]:
    """Each cost's meaning as `SimCosts`'s docstring states it ("launch_us: host time to enqueue one
    op outside a graph."): the one place the cost model is described."""
    keys = set(SimCosts.keys())
    found = (re.match(r"\s*(\w+):\s+(.*\S)", line) for line in (SimCosts.__doc__ or "").splitlines())
    return {m.group(1): m.group(2).rstrip(".") for m in found if m and m.group(1) in keys}


def cost_rows(costs: dict) -> list[list[str]]:
    """The simulator's costs as a table: key, value, unit, what it is (with the default where the
    run set another). Keys the current model does not know (an older file's) keep their value."""
    meanings = cost_meanings()
    defaults = {f.name: f.default for f in fields(SimCosts)}
    rows = []
    for key, value in costs.items():
        meaning = meanings.get(key, "")
        default = defaults.get(key)
        if isinstance(default, (int, float)) and isinstance(value, (int, float)) and value != default:
            meaning = f"{meaning} (default {default:g})" if meaning else f"default {default:g}"
        shown = f"{value:g}" if isinstance(value, (int, float)) else str(value)
        rows.append([key, shown, unit(key), meaning])
    return rows
