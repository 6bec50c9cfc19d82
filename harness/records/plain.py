"""Records as JSON-ready values: dataclasses, enums and tuples to plain dicts, lists and strings."""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any


def as_plain(obj: Any) -> Any:
    """Dataclasses, enums and tuples to JSON-ready values (NaN poison as a string)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: as_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (list, tuple)):
        return [as_plain(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): as_plain(v) for k, v in obj.items()}
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    return obj
