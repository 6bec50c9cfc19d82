"""A run's scenarios in pairs that differ in one thing, each pair with Fisher's exact test.

Two scenario entries of one results.json pair up when their definitions are the same but for

- the fence: one unfenced (`none`), the other fenced (`kind = "fence"`): does the fence change
  the stale rate, or is the difference the luck of the replays?
- the contention: one with no fault, the other under the `pressure` fault, the same fence
  (`kind = "pressure"`): does contention make a race show that a quiet GPU hides?

Names, expectations, demanded evidence and replay counts may differ; nothing else. An entry
that ended in an error, or one from a file too old to carry its definition, pairs with nothing.
The test is two-sided, on the table [[stale, clean] of the first, [stale, clean] of the second]
(`harness.records.rates.exact_test`). `pairs(entries)` is what results.json's `pairs` holds;
`pairs_of(doc)` reads it back, or works it out for a file written before it existed.
"""

from __future__ import annotations

import json

from harness.records.rates import Rate, exact_test

# What may differ between two scenarios of a pair besides the axis itself.
_FREE = ("name", "expect", "evidence", "replays", "source")
NO_FENCE = "none"
PRESSURE = "pressure"


def rate_of(entry: dict) -> Rate:
    return Rate(entry["stale_replays"], entry["replays"])


def _key(definition: dict, axis: str) -> str:
    return json.dumps({k: v for k, v in definition.items() if k not in (*_FREE, axis)}, sort_keys=True)


def _fault_kind(entry: dict) -> str:
    return (entry["definition"].get("fault") or {}).get("kind", "none")


def _usable(entry: dict) -> bool:
    return bool(entry.get("definition")) and not entry.get("error") and entry["replays"] > 0


def _pair(kind: str, a: dict, b: dict, differs: str) -> dict:
    test = exact_test(rate_of(a), rate_of(b))
    return {"kind": kind, "a": a["name"], "b": b["name"], "differs": differs,
            "a_stale": a["stale_replays"], "a_replays": a["replays"],
            "b_stale": b["stale_replays"], "b_replays": b["replays"], "p_value": test.p_value}


def _groups(entries: list[dict], axis: str) -> list[list[dict]]:
    groups: dict[str, list[dict]] = {}
    for e in entries:
        groups.setdefault(_key(e["definition"], axis), []).append(e)
    return list(groups.values())


def pairs(entries: list[dict]) -> list[dict]:
    """Every fence pair (unfenced first) and every pressure pair (quiet first), in run order."""
    usable = [e for e in entries if _usable(e)]
    found = []
    for group in _groups(usable, "fence"):
        for a in (e for e in group if e["definition"].get("fence") == NO_FENCE):
            found += [_pair("fence", a, b, f"fence {NO_FENCE} / {b['definition'].get('fence')}")
                      for b in group if b["definition"].get("fence") != NO_FENCE]
    for group in _groups(usable, "fault"):
        for a in (e for e in group if _fault_kind(e) == "none"):
            found += [_pair("pressure", a, b, f"no fault / {PRESSURE} (fence {b['definition'].get('fence')})")
                      for b in group if _fault_kind(b) == PRESSURE]
    order = {e["name"]: i for i, e in enumerate(entries)}
    return sorted(found, key=lambda p: (order[p["b"]], order[p["a"]]))


def pairs_of(doc: dict) -> list[dict]:
    """The document's pairs: as written, or worked out from its scenarios for an older file."""
    if doc.get("pairs") is not None:
        return list(doc["pairs"])
    return pairs(doc["scenarios"])
