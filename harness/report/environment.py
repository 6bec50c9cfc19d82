"""The run's environment: what the device reported, plus NVML's view of the GPU and the host's CPU.

NVML numbers GPUs physically and ignores CUDA_VISIBLE_DEVICES, so NVML index i is not torch
device i on a shared machine. The GPU is found by UUID instead: torch's device properties carry
the same UUID NVML reports as "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx".

Nothing here raises: the environment is context for a report, and a run that found a race must
not be lost because a clock could not be read. What could not be read is left out, with a note.
"""

from __future__ import annotations

import platform
import re
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")

_HEX32 = re.compile(r"^[0-9a-f]{32}$")


def nvml_uuid(raw) -> str | None:
    """torch's UUID (a _CUuuid with .bytes, or its string) in NVML's "GPU-..." form."""
    if raw is None:
        return None
    data = getattr(raw, "bytes", None)
    if data is not None and len(data) == 16:
        hexits = bytes(data).hex()
    else:
        text = _text(raw).strip().lower()
        for prefix in ("gpu-", "mig-"):
            text = text.removeprefix(prefix)
        hexits = text.replace("-", "")
    if not _HEX32.match(hexits):
        return None
    h = hexits
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _text(value) -> str:
    # Older nvidia-ml-py returns bytes for names and UUIDs, newer returns str.
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)


def _torch_uuid(torch_device) -> str | None:
    import torch

    if not torch.cuda.is_available():
        return None
    if isinstance(torch_device, torch.device):
        index = torch_device.index if torch_device.index is not None else torch.cuda.current_device()
    elif isinstance(torch_device, int):
        index = torch_device
    else:
        index = torch.cuda.current_device()
    return nvml_uuid(getattr(torch.cuda.get_device_properties(index), "uuid", None))


def _find_handle(pynvml, uuid: str):
    """The NVML handle and index whose UUID is `uuid`, or (None, None)."""
    for i in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(i)
        if nvml_uuid(pynvml.nvmlDeviceGetUUID(handle)) == uuid:
            return handle, i
    return None, None


def nvml_info(uuid: str | None) -> dict:
    """The GPU with this UUID as NVML sees it; on any failure, fewer keys and an nvml_note."""
    if uuid is None:
        return {"nvml_note": "torch reported no CUDA device UUID to match NVML against"}
    try:
        import pynvml
    except ImportError:
        return {"nvml_note": "nvidia-ml-py is not installed"}
    try:
        pynvml.nvmlInit()
    except Exception as e:  # noqa: BLE001 - NVMLError, or a missing libnvidia-ml
        return {"nvml_note": f"NVML unavailable: {e}"}
    try:
        try:
            handle, index = _find_handle(pynvml, uuid)
        except Exception as e:  # noqa: BLE001
            return {"nvml_note": f"NVML device list failed: {e}"}
        if handle is None:
            return {"nvml_note": f"no NVML device has UUID {uuid}"}
        info: dict = {"gpu_uuid": uuid, "nvml_index": index}
        failed = []
        # Each reading on its own: a field the board does not support must not hide the rest.
        readings = {
            "gpu": lambda: _text(pynvml.nvmlDeviceGetName(handle)),
            "gpu_memory_mib": lambda: pynvml.nvmlDeviceGetMemoryInfo(handle).total // 2**20,
            # The current clock is read after the run, often at idle; the maximum says what the
            # board can reach, so a throttled or capped GPU shows up in the report.
            "sm_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "sm_clock_max_mhz": lambda: pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "memory_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
            "pcie_gen": lambda: pynvml.nvmlDeviceGetCurrPcieLinkGeneration(handle),
            "pcie_width": lambda: pynvml.nvmlDeviceGetCurrPcieLinkWidth(handle),
            "driver": lambda: _text(pynvml.nvmlSystemGetDriverVersion()),
        }
        for key, read in readings.items():
            try:
                info[key] = read()
            except Exception:  # noqa: BLE001
                failed.append(key)
        if failed:
            info["nvml_note"] = "NVML could not read " + ", ".join(failed)
        return info
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


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
            uuid = _torch_uuid(torch_device)
        except Exception as e:  # noqa: BLE001
            env["nvml_note"] = f"torch could not describe the device: {e}"
            return env
        for key, value in nvml_info(uuid).items():
            env.setdefault(key, value)
    return env
