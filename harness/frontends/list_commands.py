"""`fence-harness list [KIND]`: what a scenario can name, each by its name and one line saying what it is.

    fence-harness list                               each kind with its count
    fence-harness list KIND                          its entries: name, then what it is
    fence-harness list scenarios [FILES] [-k EXPR]   the scenarios `run` would run with the same arguments
    --json                                           the same as a JSON list on stdout

Each kind is read from the registry the harness resolves its names in: the fences (the engines'
own among them), accessors, schedules and hazards of `harness.protocol`, the engines of
`harness.engines`, the faults of `harness.faults.registry`; the scenarios from the files `run`
reads, selected as `run` selects them. An entry's description is its `description` attribute where it has one, else the
first paragraph of its own docstring, as one line. A wrong kind is one line naming the valid
ones, exit 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from harness.records.errors import InputError

if TYPE_CHECKING:
    from harness.records.scenario import Scenario

# How `run` loads its scenarios: (files, args) -> scenarios; the command line hands it over,
# so that `list scenarios` selects exactly what `run` would.
LoadScenarios = Callable[[list[Path], argparse.Namespace], "list[Scenario]"]


@dataclass(frozen=True)
class Entry:
    name: str
    description: str
    source: str | None = None  # a scenario's file


def describe(obj: object) -> str:
    """What an entry is, in one line: its `description` attribute, else its own docstring's first
    paragraph. A class's docstring counts only if the class has one itself: a subclass that says
    nothing must not pass for its base."""
    text = getattr(obj, "description", None)
    if not isinstance(text, str):
        text = vars(obj).get("__doc__") if isinstance(obj, type) else getattr(obj, "__doc__", None)
    return " ".join((text or "").strip().split("\n\n")[0].split())


def fault_kinds() -> dict[str, str]:
    """Each fault's name and what it does, from the fault registry (its strategy's docstring): the one
    place `list` reads the faults from."""
    from harness.faults.registry import FAULTS

    return {name: describe(strategy) for name, strategy in FAULTS.items()}


def _fences(args: argparse.Namespace) -> list[Entry]:
    from harness.input.plugins import Kind, builtins

    return [Entry(name, describe(fn)) for name, fn in builtins(Kind.FENCE).items()]


def _accessors(args: argparse.Namespace) -> list[Entry]:
    from harness.input.plugins import Kind, builtins

    return [Entry(name, describe(fn)) for name, fn in builtins(Kind.ACCESSOR).items()]


def _schedules(args: argparse.Namespace) -> list[Entry]:
    from harness.input.plugins import Kind, builtins

    return [Entry(name, describe(fn)) for name, fn in builtins(Kind.SCHEDULE).items()]


def _hazards(args: argparse.Namespace) -> list[Entry]:
    from harness.protocol.hazards import HAZARDS

    return [Entry(hazard.value, describe(strategy)) for hazard, strategy in HAZARDS.items()]


def _faults(args: argparse.Namespace) -> list[Entry]:
    return [Entry(name, text) for name, text in fault_kinds().items()]


def _engines(args: argparse.Namespace) -> list[Entry]:
    from harness.engines import ENGINES

    # An engine is its adapter: the module its loader lives in says what the adapter runs.
    return [Entry(name, describe(e) if hasattr(e, "description") else describe(sys.modules[e.load.__module__]))
            for name, e in ENGINES.items()]


def _scenarios(args: argparse.Namespace) -> list[Entry]:
    return [Entry(s.name, scenario_line(s), s.shown_source) for s in args.load_scenarios(args.files, args)]


def scenario_line(s: Scenario) -> str:
    """A scenario in one line: model, backend + fence, what differs from the defaults, fault, expectation."""
    only = f"; {' / '.join(s.devices)} only" if s.devices is not None else ""
    return f"{s.describe()}; expect {s.expect.value}{only}"


KINDS: dict[str, Callable[[argparse.Namespace], list[Entry]]] = {
    "scenarios": _scenarios,
    "fences": _fences,
    "accessors": _accessors,
    "schedules": _schedules,
    "hazards": _hazards,
    "faults": _faults,
    "engines": _engines,
}


def entries(kind: str, args: argparse.Namespace) -> list[Entry]:
    """The entries of one kind; an unknown kind is an InputError naming the valid ones."""
    if kind not in KINDS:
        import difflib

        close = difflib.get_close_matches(kind, KINDS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise InputError("list", "KIND", f"unknown kind {kind!r}{hint}; valid: {', '.join(KINDS)}")
    return KINDS[kind](args)


def cmd_list(args: argparse.Namespace) -> int:
    from harness.frontends.json_summary import dumps

    if args.kind != "scenarios" and (args.files or args.keyword is not None):
        given = "-k" if args.keyword is not None else "FILES"
        raise InputError("list", given, "selects scenarios: give it after `list scenarios`")
    if args.kind is None:
        counts = {kind: len(entries(kind, args)) for kind in KINDS}
        if args.json_list:
            print(dumps([{"kind": kind, "count": n} for kind, n in counts.items()]))
        else:
            print("\n".join(f"{kind:10s} {n:4d}" for kind, n in counts.items()))
        return 0
    found = entries(args.kind, args)
    if args.json_list:
        print(dumps([{"kind": args.kind, **{k: v for k, v in asdict(e).items() if v is not None}} for e in found]))
        return 0
    width = min(max((len(e.name) for e in found), default=0), 40)
    for e in found:
        print(f"{e.name:{width}s}  {e.description}")
    return 0


HANDLERS = {"list": cmd_list}


def add_command(subparsers, load_scenarios: LoadScenarios) -> None:
    """Register `list`; `load_scenarios` is how `run` loads its files (with -k)."""
    p = subparsers.add_parser("list", help="list the scenarios, fences, accessors, schedules, hazards, faults "
                                           "or engines, each with what it is")
    p.add_argument("kind", nargs="?", metavar="KIND",
                   help=f"one of {', '.join(KINDS)} (default: each kind with its count)")
    p.add_argument("files", nargs="*", type=Path, metavar="FILES",
                   help="after scenarios: scenario TOML files, before any option (default: as `run`'s)")
    p.add_argument("-k", dest="keyword", metavar="EXPR",
                   help="with scenarios: only those whose names match EXPR, as `run -k`")
    p.add_argument("--json", dest="json_list", action="store_true",
                   help="print the list as JSON on stdout for scripts")
    p.set_defaults(load_scenarios=load_scenarios)
