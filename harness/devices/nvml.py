"""Everything the harness asks NVML (nvidia-ml-py), in one place.

NVML numbers GPUs physically and ignores CUDA_VISIBLE_DEVICES, so NVML index i is not
torch device i on a shared machine: a GPU is matched by UUID, which torch's device
properties carry in the form NVML reports ("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx").

Nothing here raises: what NVML says is context for a report, never a reason to lose
a run. Where it cannot be read, the answer is empty (or a note says why).
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator
from typing import Any

_HEX32 = re.compile(r"^[0-9a-f]{32}$")


def uuid_text(raw: Any) -> str | None:
    """A UUID (torch's _CUuuid with .bytes, NVML's bytes or str) in NVML's "GPU-..." form."""
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


def _text(value: Any) -> str:
    # Older nvidia-ml-py returns bytes for names and UUIDs, newer returns str.
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)


@contextlib.contextmanager
def _session() -> Iterator[Any]:
    """pynvml, initialised for the block; raises what init raises (callers turn it into a note)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        yield pynvml
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def gpu_uuids() -> list[str]:
    """Every GPU's UUID in NVML order; [] without NVML or a driver."""
    try:
        with _session() as nv:
            return [_text(nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(i)))
                    for i in range(nv.nvmlDeviceGetCount())]
    except Exception:  # noqa: BLE001 - no bindings, no driver: no GPUs
        return []


def driver_version() -> str | None:
    try:
        with _session() as nv:
            return _text(nv.nvmlSystemGetDriverVersion())
    except Exception:  # noqa: BLE001 - optional information only
        return None


def torch_uuid(torch_device: Any = None) -> str | None:
    """The UUID of a torch CUDA device (default: the current one), in NVML's form."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    if isinstance(torch_device, torch.device):
        index = torch_device.index if torch_device.index is not None else torch.cuda.current_device()
    elif isinstance(torch_device, int):
        index = torch_device
    else:
        index = torch.cuda.current_device()
    return uuid_text(getattr(torch.cuda.get_device_properties(index), "uuid", None))


def gpu_info(uuid: str | None) -> dict:
    """The GPU with this UUID as NVML sees it; on any failure, fewer keys and an nvml_note."""
    if uuid is None:
        return {"nvml_note": "torch reported no CUDA device UUID to match NVML against"}
    try:
        import pynvml  # noqa: F401 - only to tell a missing package from a missing driver
    except ImportError:
        return {"nvml_note": "nvidia-ml-py is not installed"}
    try:
        session = _session()
        nv = session.__enter__()
    except Exception as e:  # noqa: BLE001 - NVMLError, or a missing libnvidia-ml
        return {"nvml_note": f"NVML unavailable: {e}"}
    try:
        try:
            found = [(i, h) for i in range(nv.nvmlDeviceGetCount())
                     for h in [nv.nvmlDeviceGetHandleByIndex(i)] if uuid_text(nv.nvmlDeviceGetUUID(h)) == uuid]
        except Exception as e:  # noqa: BLE001
            return {"nvml_note": f"NVML device list failed: {e}"}
        if not found:
            return {"nvml_note": f"no NVML device has UUID {uuid}"}
        index, handle = found[0]
        info: dict = {"gpu_uuid": uuid, "nvml_index": index}
        # Each reading on its own: a field the board does not support must not hide the rest.
        readings = {
            "gpu": lambda: _text(nv.nvmlDeviceGetName(handle)),
            "gpu_memory_mib": lambda: nv.nvmlDeviceGetMemoryInfo(handle).total // 2**20,
            # The current clock is read after the run, often at idle; the maximum says what the
            # board can reach, so a throttled or capped GPU shows up in the report.
            "sm_clock_mhz": lambda: nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM),
            "sm_clock_max_mhz": lambda: nv.nvmlDeviceGetMaxClockInfo(handle, nv.NVML_CLOCK_SM),
            "memory_clock_mhz": lambda: nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_MEM),
            "pcie_gen": lambda: nv.nvmlDeviceGetCurrPcieLinkGeneration(handle),
            "pcie_width": lambda: nv.nvmlDeviceGetCurrPcieLinkWidth(handle),
            "driver": lambda: _text(nv.nvmlSystemGetDriverVersion()),
        }
        failed = []
        for key, read in readings.items():
            try:
                info[key] = read()
            except Exception:  # noqa: BLE001
                failed.append(key)
        if failed:
            info["nvml_note"] = "NVML could not read " + ", ".join(failed)
        return info
    finally:
        session.__exit__(None, None, None)
