"""`--json`: one JSON document on stdout for scripts, whatever the command printed for people (which
`--json` sends to stderr). It is built from the run's results document where there is one, so it says
the same as results.json, and it always says the exit code; a failed command says why in `error`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ITEM_KEYS = ("name", "expect", "observed", "evidence", "met", "error", "stale_replays", "replays")


def summary(command: str, exit_code: int, doc: dict | None = None, path: Path | None = None,
            error: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"command": command, "exit_code": exit_code, "error": error}
    if doc is None:
        return out
    items = [{k: s.get(k) for k in ITEM_KEYS} for s in doc.get("scenarios", [])]
    out.update(results=str(path) if path is not None else None, partial=bool(doc.get("partial")),
               scenarios=len(items), met=sum(bool(i["met"]) for i in items),
               skipped=[s["name"] for s in doc.get("skipped") or []], items=items)
    if "mutants" in doc:
        out["mutants"] = doc["mutants"]
    return out


def dumps(value: dict[str, Any] | list[dict[str, Any]]) -> str:
    return json.dumps(value, default=str)
