"""Sharding across runners: `--shard K/N` of run and mutants, and `fence-harness merge`.

    fence-harness run [FILES] --shard K/N      only the scenarios whose names hash to shard K of N
    fence-harness mutants [FILES] --shard K/N  (`harness.input.shard`); results.json records it
    fence-harness merge RESULTS... [--out DIR] the shards' results.json files (or their folders) as
                                               one results.json, summary.md and report.html

A CI matrix of N jobs runs one shard each; a last job merges what they wrote. The merged report
has the verdicts one runner would give for the whole set (`harness.report.merge`). Exit codes of
merge: 0 every scenario met its expectation and every shard was there; 1 a scenario did not, a
shard is missing, or an input was a partial run; 2 inputs that cannot be merged (one line).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from harness.frontends.cli_args import out_argument
from harness.input.shard import parse_shard, select
from harness.records.errors import InputError

if TYPE_CHECKING:
    from harness.records.scenario import Scenario

SHARD_HELP = ("run only shard K of N: the scenarios whose names hash (SHA-256) to K, the same split on every "
              "runner; `fence-harness merge` combines the shards' results. A shard that holds none of the "
              "selected scenarios is an error (exit 2): use fewer shards")


def shard_argument(sp: argparse.ArgumentParser) -> None:
    # Parsed in the command (`cut`), not by argparse: a bad value is then one line, exit 2.
    sp.add_argument("--shard", metavar="K/N", help=SHARD_HELP)


def cut(scenarios: list[Scenario], args: argparse.Namespace) -> list[Scenario]:
    """The scenarios of the command's --shard (all without one). What results.json records of the
    shard goes to `args.shard_sections`."""
    from harness.report.merge import shard_sections

    text = getattr(args, "shard", None)
    if text is None:
        return scenarios
    try:
        shard = parse_shard(text)
    except ValueError as e:
        raise InputError("--shard", "", str(e)) from None
    chosen = select(scenarios, shard, lambda s: s.name)
    args.shard_sections = shard_sections(shard, [s.name for s in scenarios])
    return chosen


def _results_file(given: Path) -> Path:
    return given / "results.json" if given.is_dir() else given


def cmd_merge(args: argparse.Namespace) -> int:
    from harness.frontends.session import write_report
    from harness.report.merge import merge_documents
    from harness.report.results import write_results
    from harness.report.schema import load

    docs = [(str(path), load(path)) for path in map(_results_file, args.results)]
    merged = merge_documents(docs)
    doc = merged.doc
    path = write_results(args.out, doc)
    write_report(doc, args.out)
    for name in merged.repeated:
        print(f"fence-harness: note: {name} is in more than one input, with one verdict: the first kept",
              file=sys.stderr)
    for e in doc["scenarios"]:
        if not e["met"]:
            print(f"FAIL {e['name']}: expected {e['expect']}, observed {e.get('verdict') or e['observed']}"
                  + (f" ({e['error']})" if e["error"] else ""))
    info = doc["merge"]
    shards = f" (shards {', '.join(info['shards'])} of {info['shard_count']})" if info["shard_count"] else ""
    total, met = doc["summary"]["scenarios"], doc["summary"]["met"]
    print(f"merged {len(docs)} runs{shards}: {met}/{total} scenarios met; results: {path}")
    if merged.missing:
        print(f"fence-harness: shard{'s' * (len(merged.missing) > 1)} {', '.join(merged.missing)} missing: "
              "the merged set is incomplete", file=sys.stderr)
    if doc.get("partial"):
        cut_short = [r["source"] for r in info["runs"] if r["partial"]]
        print(f"fence-harness: {', '.join(cut_short)}: a run cut short; not run: {', '.join(doc['not_run']) or '-'}",
              file=sys.stderr)
    return 0 if met == total and merged.complete and not doc.get("partial") else 1


HANDLERS = {"merge": cmd_merge}


def add_commands(subparsers) -> dict:
    """Register `merge` on the main parser's subparsers; returns name -> handler."""
    merge = subparsers.add_parser("merge", help="combine the results.json of several runs (a CI matrix's "
                                                "shards) into one report; exit 1 if a scenario failed or a "
                                                "shard is missing")
    merge.add_argument("results", nargs="+", type=Path, metavar="RESULTS.json|DIR",
                       help="each run's results.json, or the folder it is in")
    out_argument(merge)
    merge.set_defaults(fn=cmd_merge)
    return HANDLERS
