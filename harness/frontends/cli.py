"""fence-harness: run scenario files, reproduce one scenario, or run the mutant kill matrix.

Exit codes: 0 every scenario met its expectation; 1 one did not (or errored),
or a mutant survived / a correct variant was flagged; 2 bad input, no usable
device, or a device lost mid-run (one line on stderr, no traceback); 130 / 143
interrupted by SIGINT / SIGTERM (the scenarios finished so far are written as a
partial results.json).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness.devices import open_device
from harness.devices.base import Device
from harness.engines import ENGINES, load_engine
from harness.frontends import soak
from harness.frontends.cli_args import device_arguments, positive_int
from harness.frontends.console import RunConsole, plain_line
from harness.frontends.fence_commands import HANDLERS as FENCE_HANDLERS
from harness.frontends.fence_commands import add_commands as add_fence_commands
from harness.frontends.session import (
    Stop,
    interrupt_signal,
    run_scenarios,
    signals_interrupt,
    write_partial,
)
from harness.records.errors import HarnessError, InputError
from harness.records.scenario import Scenario
from harness.records.trace import describe
from harness.report.cli import HANDLERS as REPORT_HANDLERS
from harness.report.cli import add_commands as add_report_commands
from harness.run.oracle import ReplayVerdict
from harness.run.pipeline import ScenarioResult, run_scenario
from harness.run.plugins import Kind, resolve


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fence-harness", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        device_arguments(sp)
        sp.add_argument("--replays", type=positive_int, help="replays per scenario (overrides the files)")
        for kind in Kind:
            sp.add_argument(f"--{kind.value}", metavar="NAME", dest=kind.value,
                            help=f"{kind.value} for every scenario: a built-in name or package.module:callable")
        sp.add_argument("--engine", choices=ENGINES,
                        help="run on an installed engine's own load-back counter (fences engine / engine_reverted)")

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
    add_fence_commands(sub)
    soak.add_command(sub)
    return p


def _load(files: list[Path], args: argparse.Namespace, default: list[Path] | None = None) -> list[Scenario]:
    """The scenarios of the files, with the command line's fence / accessor / schedule."""
    from harness.run.scenario_file import default_files, load_files

    scenarios = load_files(files or default or default_files())
    overrides = {}
    for kind in Kind:
        name = getattr(args, kind.value, None)
        if name is not None:
            resolve(kind, name, f"--{kind.value}", kind.value)  # one-line error, exit 2
            overrides[kind.value] = name
    if getattr(args, "engine", None):
        load_engine(args.engine, "--engine", "engine")  # one-line error, exit 2, when not usable here
        overrides["engine"] = args.engine
    return [s.with_overrides(**overrides) for s in scenarios] if overrides else scenarios


@dataclass
class _Run:
    """The scenarios of one command and how far it got."""

    scenarios: list[Scenario]
    console: RunConsole
    results: list[ScenarioResult] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    stop: Stop | None = None

    @property
    def not_run(self) -> list[str]:
        return [s.name for s in self.scenarios[len(self.results):]]

    def partial(self, device: dict, out: Path, sections: dict | None = None) -> int:
        return write_partial(self.stop, self.results, device, out, self.started,  # type: ignore[arg-type]
                             {**(sections or {}), "not_run": self.not_run}, len(self.results),
                             len(self.scenarios))


def _run_all(scenarios: list[Scenario], dev: Device, args: argparse.Namespace,
             status: Callable[[ScenarioResult], str] | None = None) -> _Run:
    """Run each scenario, one line each; `status(result)` overrides the ok / FAIL column."""
    run = _Run(scenarios, RunConsole())

    def done(r: ScenarioResult) -> None:
        run.results.append(r)
        run.console.scenario_done(r, status(r) if status else None)
        if r.fault_mode and "fallback" in r.fault_mode:
            run.console.note(r.fault_mode)

    run.stop = run_scenarios(scenarios, lambda: dev, args.replays, args.timeout, done,
                             lambda: run.console.start(len(scenarios), dev.name))
    if run.stop:
        run.console.stop()
    return run


def cmd_run(args: argparse.Namespace) -> int:
    from harness.report.results import build_results, write_results

    scenarios = _load(args.files, args)
    dev = open_device(args.device, args.sim_costs)
    device = dev.describe()  # before the run: a device lost mid-run cannot describe itself
    run = _run_all(scenarios, dev, args)
    if run.stop:
        return run.partial(device, args.out)
    doc = build_results(run.results, device, run.started, time.time())
    path = write_results(args.out, doc)
    _write_report(doc, args.out)
    run.console.finish(run.results, path)
    return 0 if all(r.met for r in run.results) else 1


def cmd_mutants(args: argparse.Namespace) -> int:
    from harness.report.results import build_results, write_results
    from harness.run.mutants import Role, classify, matrix_ok, matrix_section
    from harness.run.scenario_file import SCENARIO_DIR

    scenarios = _load(args.files, args, sorted((SCENARIO_DIR / "mutants").glob("*.toml")))
    dev = open_device(args.device, args.sim_costs)
    device = dev.describe()
    run = _run_all(scenarios, dev, args, lambda r: f"{classify(r).outcome.value:8s}")
    rows = [classify(r) for r in run.results]
    section = matrix_section(rows)
    if run.stop:
        return run.partial(device, args.out, section)
    run.console.stop()
    print("\nkill matrix (evidence: data = stale replays, analysis = happens-before findings):")
    for row in rows:
        evidence = "+".join(row.evidence) or "-"
        print(f"  {row.outcome.value.upper():8s} {row.role.value:7s} {row.name:40s} "
              f"stale {row.stale_replays}/{row.replays} findings {row.findings} evidence {evidence}")
    mutants = [r for r in rows if r.role is Role.MUTANT]
    correct = [r for r in rows if r.role is Role.CORRECT]
    killed = sum(r.ok for r in mutants)
    clean = sum(r.ok for r in correct)
    doc = build_results(run.results, device, run.started, time.time(), section)
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
    print(f"verdict: {r.verdict.describe() if r.verdict else '-'}")
    print(plain_line(r))
    return 0 if r.met else 1


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        handlers = {"run": cmd_run, "repro": cmd_repro, "mutants": cmd_mutants, "soak": soak.cmd_soak,
                    **REPORT_HANDLERS, **FENCE_HANDLERS}
        with signals_interrupt():
            return handlers[args.command](args)
    except HarnessError as e:
        print(f"fence-harness: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt as e:  # outside a scenario loop: nothing partial to keep
        sig = interrupt_signal(e)
        print(f"fence-harness: interrupted ({sig.name})", file=sys.stderr)
        return 128 + sig


if __name__ == "__main__":
    sys.exit(main())
