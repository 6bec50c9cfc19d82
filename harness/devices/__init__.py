"""Devices behind one interface: `cuda` (real GPU) and `sim` (CPU, virtual time).

The interface itself is `harness.devices.base`. This package imports no torch when it loads: the
report's environment table reads NVML through `harness.devices.nvml`, and `fence-harness merge` runs
on a runner without torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from harness.records.device_settings import DEVICE_NAMES, SimCosts
from harness.records.errors import InputError

if TYPE_CHECKING:
    from harness.devices.base import Device


def device_kind(name: str) -> str:
    """"cuda" or "sim" for a device name, without opening it; `auto` is cuda when torch sees one."""
    if name not in DEVICE_NAMES:
        raise InputError("--device", "", f"unknown device '{name}'; valid: {', '.join(DEVICE_NAMES)}")
    if name != "auto":
        return name
    import torch

    return "cuda" if torch.cuda.is_available() else "sim"


def open_device(name: str, sim_costs: Sequence[str] = ()) -> Device:
    """Open the named device; `auto` picks CUDA when torch sees one, else the simulator.

    `sim_costs` are `KEY=VALUE` settings of the simulator's cost model.
    """
    if device_kind(name) == "cuda":
        from harness.devices.cuda import CudaDevice

        return CudaDevice()
    from harness.devices.sim import SimDevice

    return SimDevice(SimCosts.from_settings(sim_costs))


__all__ = ["device_kind", "open_device", "DEVICE_NAMES"]
