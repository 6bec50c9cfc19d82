"""A stream sanitizer for any PyTorch code that also sees inside CUDA graph replays.

    from harness.sanitizer import sanitize

    with sanitize(raise_on_race=True):
        ...

See `harness.sanitizer.session` and docs/sanitizer.md.
"""

from harness.records.errors import RacesFound, SanitizerError
from harness.records.races import RaceKind
from harness.sanitizer.model import Access, GraphEdges, Race, Span, Use
from harness.sanitizer.session import Sanitizer, sanitize

__all__ = ["Sanitizer", "sanitize", "RacesFound", "SanitizerError", "Race", "RaceKind", "Access", "Span",
           "Use", "GraphEdges"]
