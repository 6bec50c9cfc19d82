"""What an engine adapter offers the harness: a loader, and the engine's own fences.

An adapter runs a serving engine's own code under the harness (`harness.engines.sglang`); it is
typed against the same interfaces a plugin gets (`harness.api`), so what the engine supplies (its
counter, its pools, its load chain) stands where the harness's own would.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

from harness.records.errors import EngineContractBroken, InputError

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
    """A loaded engine: its version, its own load-event counter and device pools on a harness device.

    An adapter may also have `writeback(dev, layout, pools, forward, backup) -> WriteBack`, the
    engine's own device-to-host path (vLLM's offloading workers; a scenario's `connector` is passed as
    `connector=` where it names one); where it has none, the harness's `WriteBack` runs
    (`harness.run.testbed`). And `offload_loader(dev, layout, pools, host, policy) -> EngineLoader`, the
    engine's load of an offloaded prefix into freshly allocated blocks, for a hazard whose load is one
    (`load_before_zeroing`), with the scenario's transfer path. Both optional, so an adapter written
    before them still loads.
    """

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


def import_engine(package: str, needed: Mapping[str, Sequence[str]], install: str, source: str = "engine",
                  key: str = "engine", importer: Callable[[str], ModuleType] = importlib.import_module,
                  ) -> tuple[str, dict[str, ModuleType]]:
    """An engine's version and the modules its adapter needs (`needed`: module -> the dotted names it
    must have), each imported and checked; InputError (exit 2) naming what is missing or broken."""
    try:
        top = importlib.import_module(package)
    except ImportError as e:
        raise InputError(source, key,
                         f"engine {package!r} is not importable here ({e}); install it: {install}") from None
    version = getattr(top, "__version__", "unknown")
    modules = {}
    for name in needed:
        try:
            modules[name] = importer(name)
        except Exception as e:  # noqa: BLE001 - any import failure is the same answer
            raise InputError(source, key,
                             f"{package} {version}: cannot import {name} ({type(e).__name__}: {e})") from None
    missing = [f"{mod.rsplit('.', 1)[-1]}.{attr}" for mod, attrs in needed.items() for attr in attrs
               if lookup(modules[mod], attr) is None]
    if missing:
        raise InputError(source, key, f"{package} {version} has no {', '.join(missing)}; the adapter needs them")
    return version, modules


def lookup(module: ModuleType, dotted: str) -> object | None:
    """`module`'s attribute at a dotted path (`Class.method`), or None where any part is missing."""
    obj: object = module
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def construct(cls: Any, **known: Any) -> Any:
    """`cls(...)` with the known arguments its signature names; an error naming any it
    requires that the harness does not know."""
    params = inspect.signature(cls).parameters
    missing = [n for n, p in params.items()
               if n not in known and p.default is inspect.Parameter.empty
               and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if missing:
        raise EngineContractBroken(f"{cls.__name__} requires {', '.join(missing)}, which the harness cannot give")
    return cls(**{n: v for n, v in known.items() if n in params})
