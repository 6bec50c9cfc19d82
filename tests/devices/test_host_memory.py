"""The host's memory as Linux reports it (`harness.devices.host_memory`), from files made here."""

from __future__ import annotations

import pytest

from harness.devices import host_memory as hm
from harness.devices.sim import SimDevice

GIB = 2**30


@pytest.fixture
def proc(tmp_path, monkeypatch):
    """Fake /proc files (6 GiB resident, 20 GiB available) and no control group, unless a test writes one."""
    status, meminfo = tmp_path / "status", tmp_path / "meminfo"
    status.write_text(f"Name:\tpython\nVmRSS:\t{6 * GIB // 1024} kB\n")
    meminfo.write_text(f"MemTotal:       {24 * GIB // 1024} kB\nMemAvailable:   {20 * GIB // 1024} kB\n")
    monkeypatch.setattr(hm, "STATUS", str(status))
    monkeypatch.setattr(hm, "MEMINFO", str(meminfo))
    monkeypatch.setattr(hm, "_CGROUP_FILES", ((str(tmp_path / "memory.max"), str(tmp_path / "memory.current")),))
    return tmp_path


def test_the_process_holds_its_resident_memory_and_may_take_what_is_available(proc):
    m = hm.host_memory()
    assert m is not None and (m.in_use, m.available, m.where) == (6 * GIB, 20 * GIB, "host memory")


def test_a_control_group_limit_below_the_machine_is_what_is_available(proc):
    (proc / "memory.max").write_text(f"{12 * GIB}\n")
    (proc / "memory.current").write_text(f"{7 * GIB}\n")
    assert hm.host_memory().available == 5 * GIB  # type: ignore[union-attr]
    (proc / "memory.max").write_text("max\n")  # no limit: the machine's
    assert hm.host_memory().available == 20 * GIB  # type: ignore[union-attr]


def test_no_reading_off_linux(proc, monkeypatch):
    monkeypatch.setattr(hm, "MEMINFO", str(proc / "absent"))
    assert hm.host_memory() is None


def test_the_simulator_reads_the_host():
    m = SimDevice().memory()
    assert m is None or (m.in_use > 0 and m.available > 0)
