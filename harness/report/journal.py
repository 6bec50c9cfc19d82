"""The run journal: each finished scenario's entry appended, as it finishes, to a file beside the
results, so a run killed with no chance to write (SIGKILL, a runner's hard limit, a lost host)
still leaves what it had finished. `fence-harness report DIR` rebuilds a partial results.json
from it.

One file per process (`DIR/journal/<name>.jsonl`: the command, or each pytest-xdist worker), so
no two processes append to one file. Its first line is a header (the run's environment, when it
started, its command); every later line is one scenario entry, written whole and synced before
the next scenario starts. A line cut off by the kill is dropped when read. A run that ends as it
should (results.json written, whole or partial) removes the journal: a journal that is there
belongs to a run that never finished.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

FOLDER = "journal"
FORMAT = 1


class Journal:
    """One process's journal in the results folder `out`."""

    def __init__(self, out: Path, name: str):
        self.path = Path(out) / FOLDER / f"{name}.jsonl"

    def start(self, environment: dict[str, Any], started: float | None = None) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        header = {"journal": FORMAT, "started": started or time.time(), "command": _command_line(),
                  "environment": environment}
        with open(self.path, "w", encoding="utf-8") as f:
            f.write(json.dumps(header, default=str) + "\n")
            _sync(f)

    def add(self, entry: dict[str, Any]) -> None:
        # The timeline is for a finished run's report: the journal keeps what a verdict needs.
        slim = {k: v for k, v in entry.items() if k != "timeline"}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(slim, default=str) + "\n")
            _sync(f)


def _sync(f) -> None:
    f.flush()
    os.fsync(f.fileno())


def clear(out: Path) -> None:
    """Remove the journal of `out` (a run that finished; or a new run, before it starts)."""
    shutil.rmtree(Path(out) / FOLDER, ignore_errors=True)


def present(out: Path) -> bool:
    return any((Path(out) / FOLDER).glob("*.jsonl"))


def read(out: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(headers, entries) of every process's journal in `out`, entries in the order they finished
    within each file; a line the kill cut off (not whole JSON) is dropped."""
    headers, entries = [], []
    for path in sorted((Path(out) / FOLDER).glob("*.jsonl")):
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        for i, line in enumerate(lines):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue  # the last line, cut off mid-write
            if i == 0 and isinstance(value, dict) and "journal" in value:
                headers.append(value)
            elif isinstance(value, dict) and "name" in value:
                entries.append(value)
    return headers, entries


def rebuild(out: Path) -> dict[str, Any] | None:
    """A partial document of what the journal of `out` holds, or None when it holds no header."""
    from harness.report.results import build_document

    headers, entries = read(out)
    if not headers:
        return None
    first = min(headers, key=lambda h: h["started"])
    doc = build_document(entries, first["environment"], first["started"], time.time(),
                         {"partial": True, "interrupted": "killed", "rebuilt_from": "journal"})
    doc["command"] = first["command"]
    return doc


def _command_line() -> list[str]:
    from harness.report.results import command_line  # lazily: results imports much of the package

    return command_line()
