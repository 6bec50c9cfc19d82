"""`fence-harness report` and `fence-harness compare`, and the writers `run` calls.

    fence-harness report RESULTS.json [--out DIR]          summary.md, report.html, timeline traces
    fence-harness report DIR                               the same for DIR/results.json; where DIR holds
                                                           the journal of a run that never finished,
                                                           first a partial results.json rebuilt from it
    fence-harness compare NEW.json BASELINE.json [--cost-threshold PCT]
                                                           exit 1 on a regression, 2 when the runs
                                                           share nothing to compare, 0 otherwise

Bad files raise InputError; the main CLI prints it as one line and exits 2.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from harness.report.schema import load


def _percent(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentage, got '{text}'") from None
    if not value >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"expected a percentage >= 0, got {text}")
    return value


def _trace_name(scenario: str) -> str:
    # Scenario names are checked when loaded, but a results file may come from anywhere.
    return "timeline-" + re.sub(r"[^A-Za-z0-9_.-]", "_", scenario) + ".json"


def write_all(doc: dict, out_dir: Path) -> list[Path]:
    """summary.md, report.html and, per scenario with a timeline, its Chrome trace."""
    from harness.report.html import write_html
    from harness.report.summary import write_summary
    from harness.report.timeline import write_chrome_trace

    out_dir = Path(out_dir)
    paths = [write_summary(doc, out_dir / "summary.md"), write_html(doc, out_dir / "report.html")]
    for s in doc["scenarios"]:
        if s.get("timeline"):
            paths.append(write_chrome_trace(s["timeline"], out_dir / _trace_name(s["name"]), s["name"]))
    return paths


def append_step_summary(summary_path: Path) -> bool:
    """Append summary.md to $GITHUB_STEP_SUMMARY when a GitHub Actions step set it."""
    target = os.environ.get("GITHUB_STEP_SUMMARY")
    if not target:
        return False
    try:
        text = Path(summary_path).read_text(encoding="utf-8")
        with open(target, "a", encoding="utf-8") as f:
            f.write(text if text.endswith("\n") else text + "\n")
    except OSError as e:
        # The results are on disk already; a CI nicety must not fail the run.
        print(f"fence-harness: warning: step summary not written: {e}", file=sys.stderr)
        return False
    return True


def cmd_report(args: argparse.Namespace) -> int:
    from harness.report import journal

    given = Path(args.results)
    if given.is_dir():
        if journal.present(given):
            rebuilt = _rebuild(given)
            if rebuilt is not None:
                given = rebuilt
        given = given if given.is_file() else given / "results.json"
    elif journal.present(given.parent):
        print(f"fence-harness: note: {given.parent / journal.FOLDER} holds the journal of a run that never "
              f"finished; `fence-harness report {given.parent}` rebuilds its results", file=sys.stderr)
    doc = load(given)
    for path in write_all(doc, args.out or given.parent):
        print(path)
    return 0


def _rebuild(folder: Path) -> Path | None:
    """results.json rebuilt, partial, from the journal of `folder`; the journal is kept (it is the
    only record of that run until a finished run replaces it)."""
    from harness.report import journal
    from harness.report.results import write_results

    doc = journal.rebuild(folder)
    if doc is None:
        return None
    path = write_results(folder, doc)
    print(f"fence-harness: rebuilt partial results of {len(doc['scenarios'])} finished scenarios from the journal "
          f"of a run that never finished: {path}", file=sys.stderr)
    return path


def cmd_compare(args: argparse.Namespace) -> int:
    from harness.report.compare import compare

    new, baseline = load(args.new), load(args.baseline)
    c = compare(new, baseline, args.cost_threshold)
    for warning in c.warnings:
        print(f"fence-harness: warning: {warning}", file=sys.stderr)
    print("\n".join(c.lines()))
    if c.compared_nothing:
        what = "scenario" if c.scenarios else "bench point"
        print(f"fence-harness: compare: {args.new} and {args.baseline} share no {what}: nothing was compared",
              file=sys.stderr)
        return 2
    return 1 if c.regression else 0


HANDLERS = {"report": cmd_report, "compare": cmd_compare}


def add_commands(subparsers) -> dict:
    """Register `report` and `compare` on the main parser's subparsers; returns name -> handler."""
    report = subparsers.add_parser("report", help="rebuild summary.md and report.html from a results.json "
                                                   "(or a killed run's journal)")
    report.add_argument("results", type=Path, metavar="RESULTS.json|DIR",
                        help="a results.json, or its folder: there a killed run's journal is rebuilt first")
    report.add_argument("--out", type=Path, metavar="DIR",
                        help="where the report goes (default: next to the results)")
    report.set_defaults(fn=cmd_report)

    cmp = subparsers.add_parser("compare",
                                help="compare a results.json with a baseline; exit 1 on a regression")
    cmp.add_argument("new", type=Path, metavar="NEW.json", help="the new results.json")
    cmp.add_argument("baseline", type=Path, metavar="BASELINE.json", help="the baseline results.json")
    cmp.add_argument("--cost-threshold", type=_percent, default=10.0, metavar="PCT",
                     help="throughput drop or bench slowdown that counts as a regression (default 10)")
    cmp.set_defaults(fn=cmd_compare)
    return HANDLERS
