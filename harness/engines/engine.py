"""What an engine adapter offers the harness: a loader, and the engine's own fences."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol


class Adapter(Protocol):
    """A loaded engine: its version, its own load-event counter and device pools on a harness device."""

    @property
    def version(self) -> str: ...  # read-only, so a frozen dataclass can be one

    def counter(self, dev: Any, num_layers: int) -> Any: ...

    def pools(self, dev: Any, layout: Any) -> Any: ...  # the engine's device pools (a HybridPool)

    # the engine's own load chain (`counter`, `stream`, `start(fault, gate, listeners) -> LoadOp`), or None
    def loader(self, dev: Any, layout: Any, pools: Any, host: Any) -> Any: ...


@dataclass(frozen=True)
class Engine:
    name: str
    # load(source, key): the adapter, or InputError(source, key, ...) when the engine is not usable
    load: Callable[[str, str], Adapter]
    fences: dict[str, Callable[[Any], Any]]  # fence name -> fence(ctx), run on this engine only
