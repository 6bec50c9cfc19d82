"""What a fault is: a strategy object, one module a fault, found by name in `harness.faults.registry`.

A strategy says everything the harness decides by the fault's kind: the keys its scenario-file
table takes and how they are checked (`keys`, `build`), how it reads in words (`describe`), the
pause before each copy of a load op (`pause_us`), whether it holds the load stream with a gate
(`gates`, and `stand_in` where no gate can be built), how many copies a layer's load is split into
(`chunks`), the faults a scenario runs at (`points`: one, or a sweep's), the contention it puts
beside the scenario (`pressure`), and whether and how the soak draws it (`soaks`, `draw`). The
defaults are a fault that does nothing; a strategy overrides what its fault does.

A strategy is stateless: the registry holds one instance, and every scenario's `Fault` record
carries the settings.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from harness.records.scenario import Fault, Pressure
from harness.records.values import Parser


@dataclass(frozen=True)
class FaultKey:
    """A key of a fault's table in a scenario file: its name, its value check, whether the kind needs
    it, and the hint a missing one's message gives ("microseconds > 0")."""

    name: str
    parse: Parser
    required: bool = False
    hint: str = ""

    def needed(self) -> FaultKey:
        """The same key, required."""
        return replace(self, required=True)


class FaultStrategy:
    """A fault kind; the base does nothing to the load stream. A subclass sets `name`, its docstring
    (its first paragraph is the one line `fence-harness list faults` prints) and what its fault does."""

    name: ClassVar[str]  # the kind's name in scenario files (`fault = { kind = NAME }`)
    keys: ClassVar[tuple[FaultKey, ...]] = ()  # the table's keys beyond `kind`
    gates: ClassVar[bool] = False  # a host-released gate holds the load stream (`harness.run.replay`)
    deterministic: ClassVar[bool] = False  # a race shows in every replay: a missed one is the harness's fault
    splits_copies: ClassVar[bool] = False  # a layer's load is several copies (`chunks`)
    sweeps: ClassVar[bool] = False  # the scenario runs at each of `points`, each point tallied apart
    soaks: ClassVar[bool] = False  # the soak draws it (`draw`)

    def build(self, values: dict[str, Any], key: str) -> Fault:
        """The record from the table's checked values (by key name); `key` is the table's path, for
        a check across keys (raise `harness.records.values.Invalid`)."""
        return Fault(self.name, **values)

    def describe(self, fault: Fault) -> str:
        """The fault in words: `Fault.describe()`, the run's lines, `results.json`'s `fault_text`."""
        return str(self.name)

    def pause_us(self, fault: Fault, replay: int, layer: int, chunk: int) -> float:
        """Microseconds the load stream spins before copy `chunk` of `layer` in replay `replay`."""
        return 0.0

    def chunks(self, fault: Fault) -> int:
        """How many copies each layer's load is split into."""
        return 1

    def points(self, fault: Fault) -> list[tuple[float, Fault]]:
        """(delay, the fault run there) for each point the scenario runs at: the fault itself for
        all but a sweep."""
        return [(fault.us, fault)]

    def stand_in(self, fault: Fault) -> Fault:
        """For a gating fault: what runs where the device cannot build a gate."""
        return fault

    def pressure(self, fault: Fault) -> Pressure | None:
        """The contention the fault puts beside the scenario (`harness.faults.contention`), or None."""
        return None

    def draw(self, rng: random.Random) -> Fault:
        """A random fault of this kind, for the soak (`soaks`)."""
        raise NotImplementedError(f"the soak does not draw {self.name} faults")


__all__ = ["FaultKey", "FaultStrategy"]
