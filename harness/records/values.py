"""The scenario file's value checks, shared by the loader (`harness.input.scenario_file`) and the
fault strategies' keys (`harness.faults`).

Each parser takes (value, key) and returns the converted value or raises `Invalid(key, message)`:
the loader adds the file and raises `InputError`, so a parser need not carry the file name around.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterable
from typing import Any

from harness.records.scenario import NamedEnum

Parser = Callable[[Any, str], Any]


class Invalid(Exception):
    """A problem at `key` (a dotted path into the file, as written); the loader adds the source."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key
        self.message = message


def describe_value(value: Any) -> str:
    """How a wrong value reads in a message: its TOML type and a short form."""
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"string {shown!r}"
    if isinstance(value, int):
        return f"integer {value}"
    if isinstance(value, float):
        return f"float {value!r}"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return f"{type(value).__name__} {value}"  # TOML dates and times


def did_you_mean(word: str, options: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def integer(lo: int, hi: int | None = None) -> Parser:
    bounds = f">= {lo}" if hi is None else f"between {lo} and {hi}"

    def parse(value: Any, key: str) -> int:
        # bool is an int subclass in Python; `true` for a size is a mistake.
        if not isinstance(value, int) or isinstance(value, bool):
            raise Invalid(key, f"expected an integer, got {describe_value(value)}")
        if value < lo or (hi is not None and value > hi):
            raise Invalid(key, f"must be {bounds}, got {value}")
        return value

    return parse


def number(value: Any, key: str) -> float:
    """A finite number >= 0, int or float, stored as float."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise Invalid(key, f"expected a number, got {describe_value(value)}")
    if not math.isfinite(value):
        raise Invalid(key, f"must be a finite number, got {value}")
    if value < 0:
        raise Invalid(key, f"must be >= 0, got {value}")
    return float(value)


def string(value: Any, key: str, wanted: str) -> str:
    if not isinstance(value, str):
        raise Invalid(key, f"expected {wanted}, got {describe_value(value)}")
    return value


def one_of(value: Any, key: str, names: list[str], noun: str | None = None) -> str:
    """One of `names` (each a `noun`, where the message should say what they are): a wrong one
    names the valid ones (and the closest)."""
    valid = ", ".join(names)
    string(value, key, f"a {noun or 'string'}, one of: {valid}")
    if value not in names:
        raise Invalid(key, f"unknown {noun or 'value'} {value!r}; valid: {valid}{did_you_mean(value, names)}")
    return value


def enum(cls: type[NamedEnum]) -> Parser:
    names = cls.names()

    def parse(value: Any, key: str) -> NamedEnum:
        return cls(one_of(value, key, names))

    return parse
