"""The run's environment: what the device reported, plus NVML's view of the GPU and the host's CPU.

The GPU is matched in NVML by UUID (`harness.devices.nvml`), not by index.

Nothing here raises: the environment is context for a report, and a run that found a race must
not be lost because a clock could not be read. What could not be read is left out, with a note.
"""

from __future__ import annotations

import platform
from pathlib import Path

from harness.devices import nvml

CPUINFO = Path("/proc/cpuinfo")

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
