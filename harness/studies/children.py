"""One case of a study in a process of its own: `python -m harness ...` with the case's arguments,
its answer the last line of its standard output, as JSON.

Studies that turn on something that cannot be turned off again (PyTorch's CUDA sanitizer) run each
case so. A child that fails, prints no answer or runs past its time is an answer too: one line
saying why, so the study can say which case it was and go on or stop as it chooses.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ChildAnswer:
    value: dict[str, Any] | None  # the child's answer, or None
    error: str | None = None  # why there is none, in one line


def ask_child(args: Sequence[str], timeout: float | None = None) -> ChildAnswer:
    """Run `python -m harness ARGS` in a new process and read its answer."""
    try:
        proc = subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return ChildAnswer(None, f"timed out after {timeout:g} s")
    lines = proc.stdout.strip().splitlines()
    if proc.returncode or not lines:
        return ChildAnswer(None, f"failed: {proc.stderr.strip().splitlines()[-1:]}")
    try:
        return ChildAnswer(json.loads(lines[-1]))
    except json.JSONDecodeError:
        return ChildAnswer(None, f"answered no JSON: {lines[-1][:200]!r}")


def answer(value: dict[str, Any]) -> None:
    """What a child prints last: its answer."""
    print(json.dumps(value), flush=True)
