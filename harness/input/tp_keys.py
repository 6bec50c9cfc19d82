"""A scenario file's tensor-parallel keys: `tp`, `fence_ranks` and the fault's `ranks`.

    tp = 2                                   # ranks (1, 2, 4 or 8; default 1)
    fault = { kind = "gate", ranks = [1] }   # the fault on rank 1 only (default: every rank)
    fence_ranks = [0]                        # the fence on rank 0 only (default: every rank)

`harness.input.scenario_file` calls these; a problem is a `KeyProblem` (the key, as a dotted path
into the file, and what would be valid), which it reports as any other bad input.
"""

from __future__ import annotations

from typing import Any

from harness.faults.registry import fault_strategy
from harness.records.ranks import TP_SIZES, split_problem


class KeyProblem(Exception):
    """A problem at `key` (the loader adds the file)."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key
        self.message = message


NOT_GIVEN = object()  # a table with no fault key: the fault's ranks come from [defaults]
_VALID_TP = ", ".join(map(str, TP_SIZES))


def parse_tp(value: Any, key: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise KeyProblem(key, f"expected an integer, one of: {_VALID_TP}; got {_kind(value)}")
    if value not in TP_SIZES:
        raise KeyProblem(key, f"unknown value {value}; valid: {_VALID_TP}")
    return value


def parse_ranks(value: Any, key: str) -> tuple[int, ...]:
    wanted = "an array of rank numbers, like [0] or [1, 3]"
    if not isinstance(value, list):
        raise KeyProblem(key, f"expected {wanted}, got {_kind(value)}")
    if not value:
        raise KeyProblem(key, f"an empty array selects no rank; give {wanted}, or leave the key out for every rank")
    for i, item in enumerate(value):
        if not isinstance(item, int) or isinstance(item, bool) or item < 0:
            raise KeyProblem(f"{key}[{i}]", f"expected a rank number >= 0, got {_kind(item)}")
    if len(set(value)) != len(value):
        raise KeyProblem(key, "the same rank appears twice")
    return tuple(sorted(value))


def split_fault_ranks(table: dict[str, Any], prefix: str) -> tuple[dict[str, Any], Any]:
    """`table` without its fault's `ranks`, and those ranks: a tuple, None (the fault names none:
    every rank), or NOT_GIVEN (the table has no fault)."""
    fault = table.get("fault")
    if not isinstance(fault, dict):
        return table, (None if "fault" in table else NOT_GIVEN)
    if "ranks" not in fault:
        return table, None
    ranks = parse_ranks(fault["ranks"], f"{prefix}.fault.ranks")
    rest = {k: v for k, v in fault.items() if k != "ranks"}
    return {**table, "fault": rest}, ranks


def check_tp(values: dict[str, Any], prefix: str) -> None:
    """The combinations a tensor-parallel scenario refuses; `values` as the scenario will be built."""
    tp = values.get("tp", 1)
    for name, key in (("fault_ranks", "fault.ranks"), ("fence_ranks", "fence_ranks")):
        ranks = values.get(name)
        if ranks is None:
            continue
        if tp == 1:
            raise KeyProblem(f"{prefix}.{key}", "selects ranks of a tensor-parallel scenario; it needs tp > 1 "
                                               f"(valid: {', '.join(map(str, TP_SIZES[1:]))})")
        for rank in ranks:
            if rank >= tp:
                raise KeyProblem(f"{prefix}.{key}", f"rank {rank} is not a rank of tp = {tp}; "
                                                   f"valid: {', '.join(map(str, range(tp)))}")
    if tp == 1:
        return
    problem = split_problem(values["model"], tp)
    if problem is not None:
        raise KeyProblem(f"{prefix}.tp", f"tp = {tp} cannot split the model: {problem}")
    if values.get("engine") is not None:
        raise KeyProblem(f"{prefix}.tp", "tp > 1 runs the harness's own model on each rank; "
                                        "an engine scenario runs on one rank (leave tp out)")
    fault = values.get("fault")
    if fault is not None and fault_strategy(fault).sweeps:
        raise KeyProblem(f"{prefix}.tp", "a sweep runs on one rank (tp = 1); give the delay as a fault of kind "
                                        "'delay' on the ranks it is for")


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"{type(value).__name__.replace('int', 'integer')} {value!r}"
    if isinstance(value, str):
        return f"string {value!r}"
    return "an array" if isinstance(value, list) else "a table" if isinstance(value, dict) else type(value).__name__


__all__ = ["KeyProblem", "NOT_GIVEN", "check_tp", "parse_ranks", "parse_tp", "split_fault_ranks"]
