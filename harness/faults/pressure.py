"""The `pressure` fault: contention from outside the scenario (`harness.faults.contention` runs it).

Nothing happens to the load stream itself; its keys set the workload's intensity (`Pressure`).
"""

from __future__ import annotations

from typing import Any

from harness.faults.strategy import FaultKey, FaultStrategy
from harness.records.scenario import CopyDirection, Fault, FaultKind, Pressure, PressureProcess
from harness.records.values import Invalid, enum, integer

MAX_GEMM = 32768  # a side of 32,768 is 6 GiB of bf16 operands a stream: more is a typo
MIN_GEMM = 128  # below this a GEMM is launch overhead, not contention


def gemm(value: Any, key: str) -> int:
    side = integer(0, MAX_GEMM)(value, key)
    if 0 < side < MIN_GEMM:
        raise Invalid(key, f"a GEMM side of {side} contends with nothing; give 0 (no GEMMs) or "
                           f"{MIN_GEMM}-{MAX_GEMM}")
    return side


class PressureFault(FaultStrategy):
    """Contention from outside the scenario, as production has it: GEMMs and pinned copies on the device,
    in another process or this one."""

    name = FaultKind.PRESSURE
    keys = (
        FaultKey("gemm", gemm),
        FaultKey("gemm_streams", integer(1, 8)),
        FaultKey("copy_mib", integer(0, 8192)),
        FaultKey("copy", enum(CopyDirection)),
        FaultKey("process", enum(PressureProcess)),
    )

    def build(self, values: dict[str, Any], key: str) -> Fault:
        spec = Pressure(**values)
        if not spec.gemm and not spec.copy_mib:
            raise Invalid(f"{key}.gemm", "gemm = 0 and copy_mib = 0 leave nothing to contend with; "
                                         "set one of them > 0")
        return Fault(self.name, pressure=spec)

    def describe(self, fault: Fault) -> str:
        return f"pressure ({self.pressure(fault).describe()})"

    def pressure(self, fault: Fault) -> Pressure:
        return fault.pressure or Pressure()


__all__ = ["MAX_GEMM", "MIN_GEMM", "PressureFault"]
