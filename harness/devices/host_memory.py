"""The host's memory as Linux reports it: what this process holds and what it could still take.

The simulator keeps every tensor on the host, so this is its device memory. The available figure is
the smaller of the kernel's estimate (`MemAvailable`) and what the process's control group still
allows, since a CI container's limit can sit well below the machine's memory.
"""

from __future__ import annotations

from pathlib import Path

from harness.devices.base import Memory

STATUS, MEMINFO = "/proc/self/status", "/proc/meminfo"
# cgroup v2, then v1: (limit, usage). An unlimited group reads "max" (v2) or a huge number (v1).
_CGROUP_FILES = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                 ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"))


def _kib_field(path: str, field: str) -> int:
    """A `Field:   123 kB` line of a /proc file, in bytes."""
    for line in Path(path).read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise ValueError(f"no {field} in {path}")


def _cgroup_room() -> int | None:
    """What the control group still allows, or None where it sets no limit (or there is none)."""
    for limit_file, usage_file in _CGROUP_FILES:
        try:
            limit, usage = Path(limit_file).read_text().strip(), Path(usage_file).read_text().strip()
        except OSError:
            continue
        if limit == "max" or int(limit) >= 2**62:
            return None
        return max(int(limit) - int(usage), 0)
    return None


def host_memory() -> Memory | None:
    """This process's resident memory and the memory it could still take (None off Linux)."""
    try:
        in_use = _kib_field(STATUS, "VmRSS")
        available = _kib_field(MEMINFO, "MemAvailable")
    except (OSError, ValueError):
        return None
    room = _cgroup_room()
    return Memory("host memory", in_use, available if room is None else min(available, room))
