"""fence-harness: run scenario files, reproduce one scenario, or run the mutant kill matrix.

Exit codes: 0 every scenario met its expectation; 1 one did not (or errored),
or a mutant survived / a correct variant was flagged; 2 bad input or no usable
device (one line on stderr, no traceback).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from harness.devices import DEVICE_NAMES, open_device
from harness.errors import HarnessError, InputError
from harness.oracle import ReplayVerdict
from harness.pipeline import ScenarioResult, run_scenario
from harness.plugins import Kind, resolve
from harness.report.cli import HANDLERS as REPORT_HANDLERS
from harness.report.cli import add_commands as add_report_commands
from harness.scenario import Scenario
from harness.trace import describe


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fence-harness", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--device", default="auto", choices=DEVICE_NAMES,
                        help="cuda, sim (CPU simulator) or auto (cuda when present)")
        sp.add_argument("--replays", type=_positive_int, help="replays per scenario (overrides the files)")
        sp.add_argument("--timeout", type=float, default=30.0,
                        help="seconds a replay may take before it is an error (default 30)")
        sp.add_argument("--sim-cost", dest="sim_costs", action="append", default=[], metavar="KEY=VALUE",
                        help="simulator cost model setting, e.g. launch_us=5 (repeatable; see SimCosts)")
        for kind in Kind:
            sp.add_argument(f"--{kind.value}", metavar="NAME", dest=kind.value,
                            help=f"{kind.value} for every scenario: a built-in name or package.module:callable")

    mutants = sub.add_parser("mutants", help="run the mutant kill matrix (default: scenarios/mutants/*.toml)")
    mutants.add_argument("files", nargs="*", type=Path, help="kill-matrix scenario files")
    mutants.add_argument("--out", type=Path, default=Path("reports"), help="where results.json goes")
    common(mutants)

    run = sub.add_parser("run", help="run scenario files (default: scenarios/*.toml)")
    run.add_argument("files", nargs="*", type=Path, help="scenario TOML files")
    run.add_argument("--out", type=Path, default=Path("reports"), help="where results.json goes")
    common(run)

    repro = sub.add_parser("repro", help="run one scenario verbosely, replay by replay")
    repro.add_argument("name", help="scenario name")
    repro.add_argument("--file", dest="files", action="append", type=Path, default=[],
                       help="scenario file(s) to look in (default: scenarios/*.toml)")
    repro.add_argument("--seed", type=int, help="override the scenario's seed")
    common(repro)
    add_report_commands(sub)
    return p


def _load(files: list[Path], args: argparse.Namespace, default: list[Path] | None = None) -> list[Scenario]:
    """The scenarios of the files, with the command line's fence / accessor / schedule."""
    from harness.scenario_file import default_files, load_files

    scenarios = load_files(files or default or default_files())
    overrides = {}
    for kind in Kind:
        name = getattr(args, kind.value, None)
        if name is not None:
            resolve(kind, name, f"--{kind.value}", kind.value)  # one-line error, exit 2
            overrides[kind.value] = name
    return [s.with_overrides(**overrides) for s in scenarios] if overrides else scenarios


def _line(r: ScenarioResult, status: str | None = None) -> str:
    t = r.tally
    status = status or ("ok  " if r.met else "FAIL")
    if r.error:
        return f"{status} {r.scenario.name:34s} expected {r.scenario.expect.value:5s}  error: {r.error}"
    layers = ",".join(str(k) for k in sorted(t.layer_counts)) or "-"
    return (
        f"{status} {r.scenario.name:34s} expected {r.scenario.expect.value:5s} "
        f"observed {r.observed.value:5s} stale {t.stale_replays:>5d}/{t.replays:<5d} "
        f"({t.stale_rate:6.1%}) layers {layers:8s} findings {len(r.findings):3d} "
        f"{r.replays_per_s:6.0f} replays/s"
    )


def cmd_run(args: argparse.Namespace) -> int:
    from harness.results import build_results, write_results

    scenarios = _load(args.files, args)
    dev = open_device(args.device, args.sim_costs)
    results, started = _run_all(scenarios, dev, args)
    doc = build_results(results, dev.describe(), started, time.time())
    path = write_results(args.out, doc)
    _write_report(doc, args.out)
    met = sum(r.met for r in results)
    print(f"{met}/{len(results)} scenarios met their expectation; results: {path}")
    return 0 if met == len(results) else 1


def _run_all(
    scenarios: list[Scenario], dev, args: argparse.Namespace, status=None
) -> tuple[list[ScenarioResult], float]:
    """Run each scenario, one line each; `status(result)` overrides the ok / FAIL column."""
    print(f"device: {dev.name}  scenarios: {len(scenarios)}", flush=True)
    started = time.time()
    results = []
    for s in scenarios:
        r = run_scenario(s, dev, replays=args.replays, timeout_s=args.timeout)
        results.append(r)
        print(_line(r, status(r) if status else None), flush=True)
        if r.fault_mode and "fallback" in r.fault_mode:
            print(f"     note: {r.fault_mode}", flush=True)
    return results, started


def cmd_mutants(args: argparse.Namespace) -> int:
    from harness.mutants import Role, classify, matrix_ok
    from harness.results import as_plain, build_results, write_results
    from harness.scenario_file import SCENARIO_DIR

    scenarios = _load(args.files, args, sorted((SCENARIO_DIR / "mutants").glob("*.toml")))
    dev = open_device(args.device, args.sim_costs)
    results, started = _run_all(scenarios, dev, args, lambda r: f"{classify(r).outcome.value:8s}")
    rows = [classify(r) for r in results]
    print("\nkill matrix (evidence: data = stale replays, analysis = happens-before findings):")
    for row in rows:
        evidence = "+".join(row.evidence) or "-"
        print(f"  {row.outcome.value.upper():8s} {row.role.value:7s} {row.name:40s} "
              f"stale {row.stale_replays}/{row.replays} findings {row.findings} evidence {evidence}")
    mutants = [r for r in rows if r.role is Role.MUTANT]
    correct = [r for r in rows if r.role is Role.CORRECT]
    killed = sum(r.ok for r in mutants)
    clean = sum(r.ok for r in correct)
    section = {"mutants": {"matrix": [
        {**as_plain(row), "stale_rate": row.stale_rate} for row in rows
    ]}}
    doc = build_results(results, dev.describe(), started, time.time(), section)
    path = write_results(args.out, doc)
    _write_report(doc, args.out)
    print(f"{killed}/{len(mutants)} mutants killed, {clean}/{len(correct)} correct variants clean; "
          f"results: {path}")
    return 0 if matrix_ok(rows) else 1


def _write_report(doc: dict, out: Path) -> None:
    """summary.md and report.html next to results.json; a failure here never loses the results."""
    from harness.report.cli import append_step_summary, write_all

    try:
        write_all(doc, out)
        append_step_summary(out / "summary.md")
    except Exception as e:  # noqa: BLE001 - results.json is written; the report is a view of it
        print(f"fence-harness: warning: report not written: {e}", file=sys.stderr)


def _describe_verdict(i: int, v: ReplayVerdict) -> str:
    if not v.stale:
        return f"replay {i:4d}: clean"
    parts = [f"replay {i:4d}: STALE"]
    if v.layers:
        parts.append(f"read layers {sorted(v.layers)} pools {sorted(v.pools)} "
                     f"slots {len(v.slots)}/{v.read_units} ({v.read_fraction:.0%})")
    if v.final_state_layers:
        parts.append(f"post-prefill Mamba state differs at layers {sorted(v.final_state_layers)}")
    if v.output_differs:
        parts.append("output differs")
    return "  ".join(parts)


def cmd_repro(args: argparse.Namespace) -> int:
    scenarios = {s.name: s for s in _load(args.files, args)}
    if args.name not in scenarios:
        import difflib

        close = difflib.get_close_matches(args.name, scenarios, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise InputError("repro", "name", f"no scenario '{args.name}'{hint}; valid: {', '.join(scenarios)}")
    s = scenarios[args.name]
    if args.seed is not None:
        s = s.with_overrides(seed=args.seed)
    dev = open_device(args.device, args.sim_costs)
    print(f"device: {dev.name}  scenario: {s.name}  {s.describe()}  seed {s.seed}")
    r = run_scenario(s, dev, replays=args.replays, timeout_s=args.timeout,
                     on_replay=lambda i, v: print(_describe_verdict(i, v), flush=True))
    if r.trace is not None:
        print(f"trace of the traced warm-up replay ({len(r.trace.ops)} ops):")
        for op in r.trace.ops:
            print(describe(op, r.trace.stream_names, "  "))
    print(f"happens-before findings ({len(r.findings)}):")
    for f in r.findings:
        print(f"  {f.describe()}")
    print(_line(r))
    return 0 if r.met else 1


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        handlers = {"run": cmd_run, "repro": cmd_repro, "mutants": cmd_mutants, **REPORT_HANDLERS}
        return handlers[args.command](args)
    except HarnessError as e:
        print(f"fence-harness: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("fence-harness: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
