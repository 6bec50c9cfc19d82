"""collect_environment on the CPU, with a fake pynvml and a fake CUDA torch.

The point under test: NVML numbers GPUs physically and ignores CUDA_VISIBLE_DEVICES, so the
GPU must be found by UUID, not by index; and no NVML failure may escape.
"""

from __future__ import annotations

import sys
import types
import uuid as uuidlib

import pytest
import torch

from harness.devices.nvml import uuid_text as nvml_uuid
from harness.report import environment
from harness.report.environment import collect_environment

UUIDS = [str(uuidlib.UUID(int=n * 0x1111_2222_3333_4444_5555_6666_7777_8888)) for n in (1, 2, 3)]
CUDA_INFO = {"device": "cuda", "torch": "2.13.0", "gpu": "NVIDIA H200", "cuda": "13.0"}


class FakeNVMLError(Exception):
    pass


def fake_pynvml(uuids=UUIDS, *, init_fails=False, unsupported=(), as_bytes=False):
    """A pynvml with len(uuids) GPUs in physical order; `unsupported` readings raise."""
    m = types.SimpleNamespace(NVML_CLOCK_SM=1, NVML_CLOCK_MEM=2, calls=[])
    wrap = (lambda s: s.encode()) if as_bytes else (lambda s: s)

    def reading(name, value):
        def fn(*args):
            if name in unsupported:
                raise FakeNVMLError(f"{name}: Not Supported")
            return value(*args)
        return fn

    def init():
        m.calls.append("init")
        if init_fails:
            raise FakeNVMLError("Driver Not Loaded")

    m.nvmlInit = init
    m.nvmlShutdown = lambda: m.calls.append("shutdown")
    m.nvmlDeviceGetCount = lambda: len(uuids)
    m.nvmlDeviceGetHandleByIndex = lambda i: ("handle", i)
    m.nvmlDeviceGetUUID = lambda h: wrap(f"GPU-{uuids[h[1]]}")
    m.nvmlDeviceGetName = reading("name", lambda h: wrap(f"NVIDIA H200 #{h[1]}"))
    m.nvmlDeviceGetMemoryInfo = reading("memory", lambda h: types.SimpleNamespace(total=(143771 + h[1]) << 20))
    m.nvmlDeviceGetClockInfo = reading("clock", lambda h, kind: {1: 1980, 2: 3201}[kind] + h[1])
    m.nvmlDeviceGetMaxClockInfo = reading("clock", lambda h, kind: {1: 1980, 2: 3201}[kind])
    m.nvmlDeviceGetCurrPcieLinkGeneration = reading("pcie", lambda h: 5)
    m.nvmlDeviceGetCurrPcieLinkWidth = reading("pcie", lambda h: 16)
    m.nvmlSystemGetDriverVersion = reading("driver", lambda: wrap("580.159.04"))
    return m


class FakeCUuuid:
    """torch's _CUuuid: 16 raw bytes."""

    def __init__(self, text: str):
        self.bytes = list(uuidlib.UUID(text).bytes)


@pytest.fixture
def cuda(monkeypatch):
    """torch sees one GPU (as with CUDA_VISIBLE_DEVICES=2): its device 0 is NVML's index 2."""
    visible = [UUIDS[2]]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: types.SimpleNamespace(name="NVIDIA H200", uuid=FakeCUuuid(visible[i])))
    return visible


def install(monkeypatch, module) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", module)


@pytest.mark.parametrize("raw", [
    FakeCUuuid(UUIDS[0]),
    UUIDS[0],
    UUIDS[0].upper(),
    f"GPU-{UUIDS[0]}",
    f"GPU-{UUIDS[0]}".encode(),
    UUIDS[0].replace("-", ""),
])
def test_uuids_in_any_spelling_come_out_in_nvml_form(raw):
    assert nvml_uuid(raw) == f"GPU-{UUIDS[0]}"


@pytest.mark.parametrize("raw", [None, "", "GPU-xyz", "1234", b"\x00" * 4])
def test_a_uuid_that_is_not_one_gives_none(raw):
    assert nvml_uuid(raw) is None


def test_the_gpu_is_matched_by_uuid_not_by_index(monkeypatch, cuda):
    nvml = fake_pynvml()
    install(monkeypatch, nvml)
    env = collect_environment(CUDA_INFO, torch.device("cuda", 0))
    assert env["gpu_uuid"] == f"GPU-{UUIDS[2]}"
    assert env["nvml_index"] == 2  # not 0, which is torch's index
    assert env["sm_clock_mhz"] == 1982 and env["memory_clock_mhz"] == 3203 and env["sm_clock_max_mhz"] == 1980
    assert env["gpu_memory_mib"] == 143773
    assert env["pcie_gen"] == 5 and env["pcie_width"] == 16
    assert env["driver"] == "580.159.04"
    assert env["gpu"] == "NVIDIA H200"  # the device's own name wins over NVML's
    assert "nvml_note" not in env
    assert nvml.calls == ["init", "shutdown"]


def test_the_input_dict_is_not_changed(monkeypatch, cuda):
    install(monkeypatch, fake_pynvml())
    info = dict(CUDA_INFO)
    collect_environment(info)
    assert info == CUDA_INFO


def test_old_bindings_returning_bytes_are_decoded(monkeypatch, cuda):
    install(monkeypatch, fake_pynvml(as_bytes=True))
    env = collect_environment({"device": "cuda"})
    assert env["gpu_uuid"] == f"GPU-{UUIDS[2]}"
    assert env["gpu"] == "NVIDIA H200 #2" and env["driver"] == "580.159.04"


def test_a_device_nvml_does_not_list_leaves_the_keys_out(monkeypatch, cuda):
    install(monkeypatch, fake_pynvml(uuids=UUIDS[:2]))
    env = collect_environment(CUDA_INFO)
    assert "gpu_uuid" not in env and "sm_clock_mhz" not in env
    assert UUIDS[2] in env["nvml_note"]


def test_nvml_init_failure_is_a_note(monkeypatch, cuda):
    nvml = fake_pynvml(init_fails=True)
    install(monkeypatch, nvml)
    env = collect_environment(CUDA_INFO)
    assert "Driver Not Loaded" in env["nvml_note"]
    assert {k: env[k] for k in CUDA_INFO} == CUDA_INFO


def test_an_unsupported_reading_drops_only_itself(monkeypatch, cuda):
    nvml = fake_pynvml(unsupported={"pcie", "clock"})
    install(monkeypatch, nvml)
    env = collect_environment(CUDA_INFO)
    assert "pcie_gen" not in env and "pcie_width" not in env and "sm_clock_mhz" not in env
    assert env["gpu_memory_mib"] == 143773 and env["driver"] == "580.159.04"
    assert "pcie_gen" in env["nvml_note"] and "sm_clock_mhz" in env["nvml_note"]
    assert nvml.calls[-1] == "shutdown"


def test_a_device_list_failure_still_shuts_nvml_down(monkeypatch, cuda):
    nvml = fake_pynvml()

    def broken():
        raise FakeNVMLError("Unknown Error")

    nvml.nvmlDeviceGetCount = broken
    install(monkeypatch, nvml)
    env = collect_environment(CUDA_INFO)
    assert "Unknown Error" in env["nvml_note"]
    assert nvml.calls == ["init", "shutdown"]


def test_missing_bindings_are_a_note(monkeypatch, cuda):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    env = collect_environment(CUDA_INFO)
    assert env["nvml_note"] == "nvidia-ml-py is not installed"


def test_torch_failing_to_describe_the_device_is_a_note(monkeypatch, cuda):
    install(monkeypatch, fake_pynvml())

    def broken(i):
        raise RuntimeError("CUDA error: invalid device ordinal")

    monkeypatch.setattr(torch.cuda, "get_device_properties", broken)
    env = collect_environment(CUDA_INFO, 3)
    assert "invalid device ordinal" in env["nvml_note"]


def test_the_simulator_gets_cpu_model_and_host_and_no_nvml(monkeypatch, tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\n"
                       "model name\t: AMD EPYC 9654 96-Core Processor\n")
    monkeypatch.setattr(environment, "CPUINFO", cpuinfo)

    def no_nvml(*a):
        raise AssertionError("NVML must not be asked about a simulator run")

    install(monkeypatch, types.SimpleNamespace(nvmlInit=no_nvml))
    env = collect_environment({"device": "sim", "torch": "2.13.0+cpu"})
    assert env["cpu_model"] == "AMD EPYC 9654 96-Core Processor"
    assert env["host"]
    assert not any(k.startswith(("gpu", "nvml", "pcie")) for k in env)


def test_no_cpuinfo_falls_back_to_platform(monkeypatch, tmp_path):
    monkeypatch.setattr(environment, "CPUINFO", tmp_path / "missing")
    assert environment.cpu_model()
