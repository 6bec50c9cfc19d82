"""fence-harness graph-check: each scenario's captured graphs checked by their own nodes and edges.

Each scenario runs as `run` runs it up to its graph check (`run_scenario(counted=False)`): the
testbed, the capture, the one traced replay (it records the waits the host enqueues on the
replay stream before the launch, which the check counts), the analyser and the graph check;
then it stops, with no counted replay. The graph verdict (`harness.run.verdict.decide_graph`)
is compared with the scenario's expectation where a full-graph replay can show its race.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from pathlib import Path

from harness.frontends.cli_args import device_arguments, out_argument


def add_command(subparsers) -> None:
    p = subparsers.add_parser(
        "graph-check",
        help="check each scenario's captured graphs by their own nodes and edges, with no counted replay "
             "(default: scenarios/*.toml)")
    p.add_argument("files", nargs="*", type=Path, help="scenario TOML files (the kill matrix's too)")
    out_argument(p, "reports/graph-check", "results.json and summary.md")
    device_arguments(p)


def _line(entry: dict, width: int) -> str:
    """One scenario: status, name, expected, graph verdict, findings, op list, nodes (and an error)."""
    from harness.report.summary import nodes_text

    why = entry["error"] or entry["unavailable"]
    return (f"  {entry['status']:16s} {entry['name']:{width}s} expected {entry['expect']:5s}  "
            f"graph {entry['graph']:11s} findings {entry['findings']:3d}  op list {entry['op_list']:8s} "
            f"nodes {nodes_text(entry['nodes'])}" + (f"  ({why})" if why else ""))


def count_line(counts: Counter) -> str:
    from harness.report.summary import status_counts

    return f"{sum(counts.values())} scenarios: {status_counts(counts) or 'none run'}"


def cmd_graph_check(args: argparse.Namespace) -> int:
    from harness.devices import open_device
    from harness.frontends.console import skip_lines
    from harness.frontends.session import run_scenarios, write_partial
    from harness.input.scenario_file import default_files, load_files
    from harness.report.results import build_results, graph_check_entry, write_atomic, write_results
    from harness.report.summary import render_graph_check
    from harness.run.pipeline import ScenarioResult
    from harness.run.verdict import GraphStatus, decide_graph

    scenarios = load_files(args.files or default_files())  # bad input: one line, exit 2
    dev = open_device(args.device, args.sim_costs)
    device = dev.describe()
    runs = [s for s in scenarios if s.runs_on(dev.name)]
    not_here = [s for s in scenarios if not s.runs_on(dev.name)]
    skipped = [{"name": s.name, "why": s.skip_reason(dev.name)} for s in not_here]
    width = max((len(s.name) for s in runs), default=0)
    results: list[ScenarioResult] = []
    entries: list[dict] = []
    started = time.time()

    def begin() -> None:
        print(f"graph-check on {dev.name}: {len(runs)} scenarios, no counted replay")
        for line in skip_lines(not_here, dev.name):
            print(f"  skipped: {line}")

    def done(r: ScenarioResult) -> None:
        results.append(r)
        entries.append(graph_check_entry(r.scenario.name, r.graph, decide_graph(r.scenario, r.graph, r.error)))
        print(_line(entries[-1], width), flush=True)

    stop = run_scenarios(runs, lambda: dev, None, args.timeout, done, begin, counted=False)
    counts = Counter(e["status"] for e in entries)
    section = {"graph_check": {"scenarios": entries, "counts": dict(counts)},
               **({"skipped": skipped} if skipped else {})}
    if stop:
        return write_partial(stop, results, device, args.out, started,
                             {**section, "not_run": [s.name for s in runs[len(results):]]}, len(results), len(runs))
    # No replay was counted, so the oracle's verdict (data evidence needs replays) is not what this
    # command checked: the summary counts the graph check's agreement, as its exit code does.
    doc = build_results(results, device, started, time.time(), section,
                        met=sum(GraphStatus(e["status"]).ok for e in entries))
    path = write_results(args.out, doc)
    write_atomic(args.out / "summary.md", render_graph_check(doc))
    print(f"{count_line(counts)}; results: {path}")
    return 0 if all(GraphStatus(e["status"]).ok for e in entries) else 1
