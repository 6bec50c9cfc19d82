"""A stream sanitizer for any PyTorch code that also sees inside CUDA graph replays.

    from harness.sanitizer import sanitize

    with sanitize(raise_on_race=True):
        ...

See `harness.frontends.sanitizer` (and the README's `harness.sanitizer` section).
"""

from harness.frontends.sanitizer import Sanitizer, sanitize
from harness.records.errors import RacesFound, SanitizerError
from harness.records.sanitizer_model import Access, GraphEdges, Race, RaceKind, Span, Use

__all__ = ["Sanitizer", "sanitize", "RacesFound", "SanitizerError", "Race", "RaceKind", "Access", "Span",
           "Use", "GraphEdges"]
