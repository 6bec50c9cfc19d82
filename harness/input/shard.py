"""`--shard K/N`: which of N runners takes a scenario, by a stable hash of its name.

A CI matrix of N jobs is the distributed engine: each job runs the same command with its own
`K/N` and takes the scenarios whose names hash to shard K; `fence-harness merge` puts their
results back together. The hash is SHA-256 of the name, not Python's `hash()`, which is salted per
process: every job of the matrix, and every xdist worker of each job, must agree on the split
without talking to each other. A name's shard depends on the name and N alone, so adding a
scenario never moves another one between shards.

The one rule for an empty share: a shard that holds none of the selected scenarios is bad input
(exit 2), as any run that selects nothing is. A matrix job that tested nothing must not go green;
the message says how many scenarios there were, so the matrix can be made smaller.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from harness.records.errors import InputError

T = TypeVar("T")

VALID = "K/N with whole numbers 1 <= K <= N, e.g. 1/2"
_FORM = re.compile(r"\s*(\d+)\s*/\s*(\d+)\s*")


def shard_of(name: str, count: int) -> int:
    """The shard (1 to `count`) that the scenario or test called `name` belongs to."""
    digest = hashlib.sha256(name.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % count + 1


@dataclass(frozen=True)
class Shard:
    """Shard `index` of `count` (both counted from 1, as a CI matrix names its jobs)."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def holds(self, name: str) -> bool:
        return shard_of(name, self.count) == self.index

    def split(self, things: Iterable[T], name: Callable[[T], str]) -> tuple[list[T], list[T]]:
        """(in this shard, in the others), each in the order given."""
        mine: list[T] = []
        others: list[T] = []
        for thing in things:
            (mine if self.holds(name(thing)) else others).append(thing)
        return mine, others


def parse_shard(text: str) -> Shard:
    """`K/N` as a Shard; anything else raises ValueError saying what is valid."""
    m = _FORM.fullmatch(text)
    if m is None:
        raise ValueError(f"expected {VALID}, got {text!r}")
    index, count = int(m.group(1)), int(m.group(2))
    if count < 1 or not 1 <= index <= count:
        raise ValueError(f"expected {VALID}, got {text!r}")
    return Shard(index, count)


def select(scenarios: list[T], shard: Shard, name: Callable[[T], str], source: str = "--shard") -> list[T]:
    """The scenarios of `shard`, in their order; none is an InputError naming `source`."""
    mine, _ = shard.split(scenarios, name)
    if not mine:
        n = len(scenarios)
        raise InputError(source, "", f"shard {shard} holds none of the {n} selected scenario{'s' * (n != 1)}; "
                                     f"a shard that tests nothing must not pass: use fewer shards")
    return mine
