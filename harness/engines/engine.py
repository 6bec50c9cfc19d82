"""What an engine adapter offers the harness: a loader, and the engine's own fences.

An adapter runs a serving engine's own code under the harness (`harness.engines.sglang`); it is
typed against the same interfaces a plugin gets (`harness.api`), so what the engine supplies (its
counter, its pools, its load chain) stands where the harness's own would.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from harness.devices.base import Device, Gate, Stream
    from harness.faults.plan import FaultPlan
    from harness.protocol.counter import LoadCounter
    from harness.protocol.fences import FenceFn
    from harness.protocol.layout import Layout
    from harness.protocol.pools import HostPool, HybridPool
    from harness.protocol.schedules import LayerListener, LoadOp


class EngineLoader(Protocol):
    """An engine's own load chain for one scenario: its counter, its load stream, and one load op
    started through the engine's own calls (the harness supplies only the compiled copy kernel)."""

    counter: LoadCounter
    stream: Stream

    def start(self, fault: FaultPlan, gate: Gate | None, listeners: Sequence[LayerListener]) -> LoadOp: ...


class Adapter(Protocol):
    """A loaded engine: its version, its own load-event counter and device pools on a harness device."""

    @property
    def version(self) -> str: ...  # read-only, so a frozen dataclass can be one

    def counter(self, dev: Device, num_layers: int) -> LoadCounter: ...

    def pools(self, dev: Device, layout: Layout) -> HybridPool: ...  # the engine's pools, the harness's interface

    # The engine's own load chain for this model, or None where the harness's load op stands in.
    def loader(self, dev: Device, layout: Layout, pools: HybridPool, host: HostPool) -> EngineLoader | None: ...


@dataclass(frozen=True)
class Engine:
    name: str
    # load(source, key): the adapter, or InputError(source, key, ...) when the engine is not usable
    load: Callable[[str, str], Adapter]
    fences: dict[str, FenceFn | Callable[[], object]]  # fence name -> fence(ctx) or a strategy's maker
