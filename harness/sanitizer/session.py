"""`harness.sanitizer`: a stream sanitizer for any PyTorch code, that sees inside graph replays.

    from harness.sanitizer import sanitize

    with sanitize(raise_on_race=True):   # or: with sanitize() as s: ...; s.races
        ...  # streams, events, async copies, torch.cuda.graph capture and replay

Like PyTorch's CUDA sanitizer (`torch.cuda._sanitizer`) it watches every aten operation
and every stream, event and synchronisation call; unlike it, what runs during a capture is
kept in the graph, and each `CUDAGraph.replay()` re-enacts the graph's accesses on the
replay stream, at replay time. The model is `harness.sanitizer.model`; the torch
taps are `harness.sanitizer.tap`.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol

from harness.records.errors import RacesFound, SanitizerError
from harness.sanitizer.model import GraphEdges, Race, SanitizerModel

__all__ = ["Sanitizer", "sanitize"]


class Watch(Protocol):
    def start(self) -> None: ...
    def stop(self) -> None: ...


def _cuda_watch(model: SanitizerModel, stack_depth: int) -> Watch:
    from harness.sanitizer.tap import CudaWatch

    return CudaWatch(model, stack_depth=stack_depth)


class Sanitizer:
    """Watches while entered; `races` lists what it found, `report()` says it in words.

    raise_on_race: raise `RacesFound` at exit when anything raced (not when the block
      itself raised: that exception goes through, with the races still on `races`).
    graph_edges: per captured access, the external events the real graph orders it after
      (a reader of the captured graph's nodes and edges); None: the captured wait records.
    stack_depth: frames kept per access (innermost outside torch and the sanitizer).
    watch: how it taps torch (the default: CUDA); tests give a CPU one.
    """

    def __init__(self, *, raise_on_race: bool = False, graph_edges: GraphEdges | None = None,
                 stack_depth: int = 6, watch: Callable[[SanitizerModel, int], Watch] | None = None) -> None:
        self.raise_on_race = raise_on_race
        self.model = SanitizerModel(graph_edges=graph_edges)
        self._make_watch = watch or _cuda_watch
        self.stack_depth = stack_depth
        self._watch: Watch | None = None

    @property
    def races(self) -> list[Race]:
        return self.model.races

    def report(self) -> str:
        races = self.races
        if not races:
            return "harness.sanitizer: no unordered accesses"
        head = f"harness.sanitizer: {len(races)} unordered pair(s) of accesses"
        if self.model.unknown_replays:
            head += f" ({self.model.unknown_replays} replays of graphs captured before it watched: not seen)"
        return "\n".join([head, *(r.describe() for r in races)])

    def __enter__(self) -> Sanitizer:
        self._watch = self._make_watch(self.model, self.stack_depth)
        self._watch.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        watch = self._watch
        assert watch is not None
        try:
            watch.stop()  # every tap off, in reverse order, before the last reference goes
        except SanitizerError:
            if kind is None:  # else the block's own exception goes through
                raise
        finally:
            self._watch = None
        if kind is None and self.raise_on_race and self.races:
            raise RacesFound(self.report(), self.races)


def sanitize(**kwargs: Any) -> Sanitizer:
    """A `Sanitizer` to use in a `with` block (the keywords are `Sanitizer`'s)."""
    return Sanitizer(**kwargs)
