"""Every fault by name: the built-in strategies and any a project registers.

Adding a fault is one module: a `FaultStrategy` subclass (`harness.faults.strategy`) that says what
its fault does, registered by name. The built-in ones are the modules beside this one, listed in
`BUILT_IN`; a project's own fault registers itself when its module is imported:

    @register_fault
    class Stall(FaultStrategy):
        \"\"\"A spin of `us` before layer 0's copies, whatever `where` says.\"\"\"

        name = "stall"
        keys = (US.needed(),)

        def pause_us(self, fault, replay, layer, chunk):
            return fault.us if layer == 0 and chunk == 0 else 0.0

From then on a scenario file may say `fault = { kind = "stall", us = 500 }`, and `fence-harness list
faults` lists it. Everything the harness decides by a fault's kind it asks the kind's strategy
(`fault_strategy`); the registry also says how each kind reads in words (`Fault.describe`).
"""

from __future__ import annotations

from typing import TypeVar

from harness.faults.chunked import Chunked
from harness.faults.delay import Delay
from harness.faults.gate import Gate
from harness.faults.jitter import Jitter
from harness.faults.keys import SHARED
from harness.faults.none import NoFault
from harness.faults.pressure import PressureFault
from harness.faults.strategy import FaultStrategy
from harness.faults.sweep import Sweep
from harness.records.scenario import FAULT_TEXT, Fault

# In the order `fence-harness list faults` lists them (and the soak draws among them).
BUILT_IN: tuple[FaultStrategy, ...] = (NoFault(), Delay(), Gate(), Jitter(), Chunked(), Sweep(), PressureFault())

FAULTS: dict[str, FaultStrategy] = {}

S = TypeVar("S", FaultStrategy, type[FaultStrategy])


def register_fault(strategy: S) -> S:
    """Add a fault (a strategy, or a strategy class: one instance is made); usable as a class
    decorator. A name already taken by another strategy is refused."""
    instance = strategy() if isinstance(strategy, type) else strategy
    name = str(getattr(instance, "name", "") or "")
    if not name or name == "kind":
        raise ValueError(f"{type(instance).__name__}: a fault needs a name (not 'kind')")
    if "kind" in {k.name for k in instance.keys}:
        raise ValueError(f"fault {name!r}: 'kind' names the fault; it cannot be one of its keys")
    if name in FAULTS and type(FAULTS[name]) is not type(instance):
        raise ValueError(f"a fault named {name!r} is registered already ({type(FAULTS[name]).__name__})")
    FAULTS[name] = instance
    FAULT_TEXT[name] = instance.describe
    return strategy


def unregister_fault(name: str) -> None:
    """Remove a registered fault (a test's own, when it is done)."""
    FAULTS.pop(name, None)
    FAULT_TEXT.pop(name, None)


def fault_strategy(fault: Fault | str) -> FaultStrategy:
    """The strategy of a fault (or of a kind's name)."""
    kind = fault.kind if isinstance(fault, Fault) else fault
    try:
        return FAULTS[kind]
    except KeyError:
        raise LookupError(f"unknown fault kind {str(kind)!r}; registered: {', '.join(FAULTS)}") from None


def fault_keys() -> list[str]:
    """Every key some fault's table takes, beyond `kind`: the shared ones first, in their order."""
    used = {k.name for s in FAULTS.values() for k in s.keys}
    names = [k.name for k in SHARED if k.name in used]
    for s in FAULTS.values():
        names += [k.name for k in s.keys if k.name not in names]
    return names


for _strategy in BUILT_IN:
    register_fault(_strategy)


__all__ = ["BUILT_IN", "FAULTS", "fault_keys", "fault_strategy", "register_fault", "unregister_fault"]
