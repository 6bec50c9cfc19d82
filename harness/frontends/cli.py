"""fence-harness: run scenario files, reproduce one scenario, or run the mutant kill matrix.

The command table, `main`, and the run / repro / mutants commands. The parser is built
from torch-free modules only (`--help` and a usage error answer at once); each command
imports the device and the pipeline when it runs. An interrupt at any point of `main`,
start-up included, is one line and exit 130 / 143 (see EXIT_CODES).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from harness.engines import ENGINES
from harness.frontends import connector_check, engine_matrix, graph_check, sanitizer_commands, soak
from harness.frontends.calibrate_command import HANDLERS as CALIBRATE_HANDLERS
from harness.frontends.calibrate_command import add_command as add_calibrate_command
from harness.frontends.cli_args import (
    DEFAULT_FILES,
    device_arguments,
    interval_width,
    out_argument,
    positive_int,
    selection_arguments,
    version_text,
)
from harness.frontends.fence_commands import HANDLERS as FENCE_HANDLERS
from harness.frontends.fence_commands import add_commands as add_fence_commands
from harness.frontends.gpu_host_commands import HANDLERS as GPU_HOST_HANDLERS
from harness.frontends.gpu_host_commands import add_commands as add_gpu_host_commands
from harness.frontends.list_commands import HANDLERS as LIST_HANDLERS
from harness.frontends.list_commands import add_command as add_list_command
from harness.frontends.merge_commands import HANDLERS as MERGE_HANDLERS
from harness.frontends.merge_commands import add_commands as add_merge_commands
from harness.frontends.merge_commands import cut, shard_argument
from harness.frontends.report_commands import HANDLERS as REPORT_HANDLERS
from harness.frontends.report_commands import add_commands as add_report_commands
from harness.frontends.session import (
    Stop,
    interrupt_signal,
    run_scenarios,
    signals_interrupt,
    write_partial,
    write_report,
)
from harness.input.plugins import Kind, resolve
from harness.records.errors import HarnessError, InputError
from harness.records.rates import Until
from harness.records.scenario import Scenario

if TYPE_CHECKING:
    from harness.devices.base import Device
    from harness.frontends.console import RunConsole
    from harness.run.oracle import ReplayVerdict
    from harness.run.pipeline import ScenarioResult

DESCRIPTION = """\
A race harness for CUDA-graph prefill against an async KV / Mamba load-back, on a GPU
or on the CPU simulator: scenario runs, the mutant kill matrix, fence checks and
costs, a false-positive soak, reports and their comparison."""
EXIT_CODES = """\
exit codes:
  0    every scenario met its expectation; compare: no regression; bench, report: done
  1    a scenario did not, or ended in an error (a replay past its timeout, out of
       memory): the run goes on with the next one; a mutant survived or a correct
       variant was flagged; a soak's false positive; compare: a regression;
       merge: a merged scenario did not, or a shard is missing;
       graph-check: a graph verdict disagreed with an expectation, or an error
  2    bad input (one line naming the file, the key and what is valid), a usage
       error, no command; no usable device (--device cuda without CUDA), or a
       device lost mid-run (the finished scenarios kept as a partial results.json)
  130  interrupted by SIGINT (Ctrl-C)
  143  interrupted by SIGTERM
       (an interrupt keeps the finished scenarios as a partial results.json; with none
       finished, the previous results.json stays as it was)

With no command, this help goes to stderr and the exit code is 2, as for any usage
error. `fence-harness COMMAND --help` shows a command's options and their defaults."""


DEFAULT_CAP = 10_000  # --until-confidence's replays at most: a rate near 0.5 is 0.04 wide by then


def _until(args: argparse.Namespace) -> Until | None:
    """run --until-confidence's stopping rule, or None; --max-replays alone is a usage error."""
    width, cap = getattr(args, "until_confidence", None), getattr(args, "max_replays", None)
    if width is None:
        if cap is not None:
            raise InputError("--max-replays", "", "caps --until-confidence; give --until-confidence W too")
        return None
    return Until(width, cap or DEFAULT_CAP)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fence-harness", description=DESCRIPTION,
                                epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=version_text())
    sub = p.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")

    def common(sp: argparse.ArgumentParser) -> None:
        device_arguments(sp)
        sp.add_argument("--replays", type=positive_int, help="replays per scenario (overrides the files)")
        for kind in Kind:
            sp.add_argument(f"--{kind.value}", metavar="NAME", dest=kind.value,
                            help=f"{kind.value} for every scenario: a built-in name or package.module:callable")
        sp.add_argument("--engine", choices=ENGINES,
                        help="run on an installed engine's own code (fences engine_execute, engine_execute_nowait)")

    run = sub.add_parser("run", help="run scenario files (default: the working directory's scenarios/*.toml, "
                                     "else the bundled set)")
    run.add_argument("files", nargs="*", type=Path, help=f"scenario TOML files (default: {DEFAULT_FILES})")
    out_argument(run)
    common(run)
    selection_arguments(run)
    shard_argument(run)
    run.add_argument("--until-confidence", type=interval_width, metavar="W",
                     help="after each scenario's replays, keep replaying until its stale rate's 95%% interval "
                          "(Clopper-Pearson) is narrower than W, e.g. 0.05; at --max-replays it stops there, "
                          "says so, and the verdict stands on the replays made")
    run.add_argument("--max-replays", type=positive_int, metavar="N",
                     help=f"with --until-confidence: at most N replays a scenario (a sweep: a point) "
                          f"(default: {DEFAULT_CAP:,})")

    repro = sub.add_parser("repro", help="run one scenario verbosely, replay by replay")
    repro.add_argument("name", help="scenario name")
    repro.add_argument("--file", dest="files", action="append", type=Path, default=[],
                       help=f"scenario file(s) to look in (default: {DEFAULT_FILES})")
    repro.add_argument("--seed", type=int, help="override the scenario's seed")
    common(repro)

    mutants = sub.add_parser("mutants", help="run the mutant kill matrix (default: scenarios/mutants/*.toml, "
                                             "the working directory's or the bundled one)")
    mutants.add_argument("files", nargs="*", type=Path,
                         help="kill-matrix scenario files (default: scenarios/mutants/*.toml of the working "
                              "directory when it has any, else the bundled kill matrix)")
    out_argument(mutants)
    common(mutants)
    selection_arguments(mutants)
    shard_argument(mutants)
    add_report_commands(sub)
    add_merge_commands(sub)
    add_fence_commands(sub)
    soak.add_command(sub)
    engine_matrix.add_command(sub)
    connector_check.add_command(sub)
    graph_check.add_command(sub)
    sanitizer_commands.add_command(sub)
    add_list_command(sub, _load)
    add_gpu_host_commands(sub)
    add_calibrate_command(sub)
    return p


def _load(files: list[Path], args: argparse.Namespace, default: list[Path] | None = None) -> list[Scenario]:
    """The scenarios of the files, with the command line's fence / accessor / schedule."""
    from harness.engines import load_engine
    from harness.input.scenario_file import default_files, load_files

    paths = files or default or default_files()
    if not paths:
        raise InputError("scenario files", "", "none given and none found: no scenarios/*.toml here and no bundled "
                                               "set installed; give files")
    scenarios = cut(select_by_keyword(load_files(paths), getattr(args, "keyword", None)), args)
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
    skipped: list[dict] = field(default_factory=list)  # {name, why}: not for this device
    results: list[ScenarioResult] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    stop: Stop | None = None
    shard: dict = field(default_factory=dict)  # run --shard: what results.json records of it

    @property
    def not_run(self) -> list[str]:
        return [s.name for s in self.scenarios[len(self.results):]]

    @property
    def sections(self) -> dict:
        """What results.json adds for this run: the scenarios it skipped, when there were any; its shard."""
        return {**({"skipped": self.skipped} if self.skipped else {}), **self.shard}

    def partial(self, device: dict, out: Path, sections: dict | None = None) -> int:
        code = write_partial(self.stop, self.results, device, out, self.started,  # type: ignore[arg-type]
                             {**self.sections, **(sections or {}), "not_run": self.not_run}, len(self.results),
                             len(self.scenarios))
        self.finished(out)  # the partial results.json says what the journal did
        return code

    def finished(self, out: Path) -> None:
        """results.json is written: the journal of this run has served its purpose."""
        from harness.report import journal

        journal.clear(out)


def confidence_text(r: ScenarioResult) -> str:
    """A scenario that stopped at --max-replays before its interval was narrow enough, in words."""
    assert r.until is not None
    return (f"95% interval still {r.widest_interval:.3f} wide at the cap of {r.until.cap:,} replays (asked for "
            f"< {r.until.width:g}); the verdict stands on the replays made")


def select_by_keyword(scenarios: list[Scenario], keyword: str | None) -> list[Scenario]:
    """The scenarios `-k keyword` selects (all without one); none is an InputError naming -k."""
    if keyword is None:
        return scenarios
    from harness.input.keyword import parse

    chosen = [s for s in scenarios if parse(keyword).matches(s.name)]
    if not chosen:
        raise InputError("-k", "", f"{keyword!r} matches none of the {len(scenarios)} scenarios of "
                                   f"{_sources(scenarios)}: nothing to run")
    return chosen


def runnable(scenarios: list[Scenario], device: str) -> tuple[list[Scenario], list[Scenario]]:
    """(to run, skipped) on a device of this kind; none to run is an InputError: a run that tests
    nothing must never pass."""
    run = [s for s in scenarios if s.runs_on(device)]
    if not run:
        kinds = sorted({k for s in scenarios for k in (s.devices or ())})
        raise InputError(_sources(scenarios), "devices", f"each of its {len(scenarios)} selected scenarios runs "
                                                         f"only on {' / '.join(kinds)}; none runs on {device}")
    return run, [s for s in scenarios if not s.runs_on(device)]


def _sources(scenarios: list[Scenario]) -> str:
    return ", ".join(sorted({s.shown_source for s in scenarios}))


def _run_all(scenarios: list[Scenario], dev: Device, args: argparse.Namespace,
             status: Callable[[ScenarioResult], str] | None = None) -> _Run:
    """Run each scenario, one line each; `status(result)` overrides the ok / FAIL column."""
    from harness.frontends.console import RunConsole, skip_lines
    from harness.report import journal
    from harness.report.results import run_environment, scenario_entry

    chosen, skipped = runnable(scenarios, dev.name)
    run = _Run(chosen, RunConsole(), [{"name": s.name, "why": s.skip_reason(dev.name)} for s in skipped],
               shard=getattr(args, "shard_sections", {}))
    # Each finished scenario goes to the journal as it finishes: a run killed before it writes
    # results.json (SIGKILL) still leaves them, for `fence-harness report DIR` to rebuild.
    journal.clear(args.out)
    log = journal.Journal(args.out, args.command)
    log.start(run_environment(dev.describe()), run.started)

    until = _until(args)

    def done(r: ScenarioResult) -> None:
        run.results.append(r)
        log.add(scenario_entry(r))
        run.console.scenario_done(r, status(r) if status else None)
        if r.until is not None and not r.confident and r.error is None:
            run.console.note(f"{r.scenario.name}: {confidence_text(r)}")
        if r.fault_mode and ("fallback" in r.fault_mode or r.fault_mode.startswith("pressure: none")):
            run.console.note(f"{r.scenario.name}: {r.fault_mode}")

    def begin() -> None:
        run.console.start(len(run.scenarios), dev.name, [s.name for s in run.scenarios])
        for line in skip_lines(skipped, dev.name):
            run.console.skipped(line)

    run.stop = run_scenarios(run.scenarios, lambda: dev, args.replays, args.timeout, done, begin, until)
    if run.stop:
        run.console.stop()
    return run


def cmd_run(args: argparse.Namespace) -> int:
    from harness.devices import open_device
    from harness.report.results import build_results, write_results

    _until(args)  # a usage error before the device opens
    scenarios = _load(args.files, args)
    dev = open_device(args.device, args.sim_costs)
    device = dev.describe()  # before the run: a device lost mid-run cannot describe itself
    run = _run_all(scenarios, dev, args)
    if run.stop:
        return run.partial(device, args.out)
    doc = build_results(run.results, device, run.started, time.time(), run.sections)
    path = write_results(args.out, doc)
    run.finished(args.out)
    args.results = (doc, path)  # for --json
    write_report(doc, args.out)
    run.console.finish(run.results, path)
    return 0 if all(r.met for r in run.results) else 1


def cmd_mutants(args: argparse.Namespace) -> int:
    from harness.devices import open_device
    from harness.input.scenario_file import default_mutant_files
    from harness.report.results import build_results, write_results
    from harness.run.mutants import Role, classify, matrix_ok, matrix_section

    scenarios = _load(args.files, args, default_mutant_files())
    dev = open_device(args.device, args.sim_costs)
    device = dev.describe()
    run = _run_all(scenarios, dev, args, lambda r: f"{classify(r).outcome.value:8s}")
    rows = [classify(r) for r in run.results]
    section = matrix_section(rows)
    if run.stop:
        return run.partial(device, args.out, section)
    run.console.stop()
    print("\nkill matrix (evidence: data = stale replays, analysis = happens-before findings, "
          "graph = the captured graph's own nodes):")
    for row in rows:
        evidence = "+".join(row.evidence) or "-"
        shown = f" (data in {', '.join(row.data_in)}; {', '.join(row.finding_kinds)})" if row.evidence else ""
        print(f"  {row.outcome.value.upper():8s} {row.role.value:7s} {row.name:40s} "
              f"stale {row.stale_replays}/{row.replays} findings {row.findings} evidence {evidence}{shown}")
    mutants = [r for r in rows if r.role is Role.MUTANT]
    correct = [r for r in rows if r.role is Role.CORRECT]
    killed = sum(r.ok for r in mutants)
    clean = sum(r.ok for r in correct)
    doc = build_results(run.results, device, run.started, time.time(), {**run.sections, **section})
    path = write_results(args.out, doc)
    run.finished(args.out)
    args.results = (doc, path)  # for --json
    write_report(doc, args.out)
    print(f"{killed}/{len(mutants)} mutants killed, {clean}/{len(correct)} correct variants clean; "
          f"results: {path}")
    return 0 if matrix_ok(rows) else 1


class _ReplayLines:
    """repro's replay lines: a replay whose verdict reads as the one before it prints nothing, and
    the run of them is one line with its count once a different verdict (or the end) comes."""

    def __init__(self) -> None:
        self.text: str | None = None
        self.first = self.last = -1

    def add(self, i: int, v: ReplayVerdict) -> None:
        text = _describe_verdict(v)
        if text == self.text:
            self.last = i
            return
        self.flush()
        self.text, self.first, self.last = text, i, i
        print(f"replay {i:4d}: {text}", flush=True)

    def flush(self) -> None:
        n = self.last - self.first
        if n == 1:
            print(f"replay {self.last:4d}: the same", flush=True)
        elif n > 1:
            print(f"replays {self.first + 1}-{self.last}: the same ({n} more)", flush=True)
        self.first = self.last


def _describe_verdict(v: ReplayVerdict) -> str:
    if not v.stale:
        return "clean"
    parts = ["STALE"]
    if v.layers:
        parts.append(f"read layers {sorted(v.layers)} pools {sorted(v.pools)} "
                     f"slots {v.stale_reads}/{v.read_units} ({v.read_fraction:.0%})")
    if v.final_state_layers:
        parts.append(f"post-prefill Mamba state differs at layers {sorted(v.final_state_layers)}")
    if v.output_differs:
        parts.append("output differs")
    if v.backup_layers:
        parts.append(f"write-back host copy differs at layers {sorted(v.backup_layers)}")
    return "  ".join(parts)


def cmd_repro(args: argparse.Namespace) -> int:
    from harness.devices import open_device
    from harness.frontends.console import plain_line
    from harness.records.trace import describe
    from harness.run.pipeline import run_scenario

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
    reason = s.skip_reason(dev.name)
    if reason:
        raise InputError(s.shown_source, f"scenario '{s.name}'", reason)
    print(f"device: {dev.name}  scenario: {s.name}  {s.describe()}  seed {s.seed}")
    lines = _ReplayLines()
    r = run_scenario(s, dev, replays=args.replays, timeout_s=args.timeout, on_replay=lines.add)
    lines.flush()
    if r.trace is not None:
        print(f"trace of the traced warm-up replay ({len(r.trace.ops)} ops):")
        for op in r.trace.ops:
            print(describe(op, r.trace.stream_names, "  "))
    print(f"happens-before findings ({len(r.findings)}):")
    for f in r.findings:
        print(f"  {f.describe()}")
    _print_graph_check(r)
    print(f"verdict: {r.verdict.describe() if r.verdict else '-'}")
    print(plain_line(r))
    return 0 if r.met else 1


def _print_graph_check(r) -> None:
    """repro: the traced replay's graphs by their own nodes, and the graph check's findings."""
    g = r.graph
    if g is None:
        return
    if g.unavailable and not g.graphs:
        print(f"graph check: not run ({g.unavailable})")
        return
    for c in g.graphs:
        if c.steps:
            steps = ", ".join(f"{what} {n}" for what, n in c.steps)
            print(f"graph {c.graph} ({c.source}): {c.nodes} nodes, {c.wait_nodes} wait, {c.record_nodes} record; "
                  f"work nodes per step: {steps}; op list {'matches' if not c.mismatches else 'DIFFERS'}")
    print(f"graph check findings ({len(g.findings)}):")
    for f in g.findings:
        print(f"  {f.describe()}")


def _command(args: argparse.Namespace) -> int:
    """The command's handler, under the interrupt handlers; a HarnessError as one line."""
    handlers = {"run": cmd_run, "repro": cmd_repro, "mutants": cmd_mutants, "soak": soak.cmd_soak,
                "engine-matrix": engine_matrix.cmd_engine_matrix,
                "connector-check": connector_check.cmd_connector_check, "graph-check": graph_check.cmd_graph_check,
                **REPORT_HANDLERS, **MERGE_HANDLERS, **FENCE_HANDLERS, **sanitizer_commands.HANDLERS, **LIST_HANDLERS,
                **GPU_HOST_HANDLERS, **CALIBRATE_HANDLERS}
    if getattr(args, "json", False):
        return _with_json_summary(handlers[args.command], args)
    try:
        with signals_interrupt():
            return handlers[args.command](args)
    except HarnessError as e:
        print(f"fence-harness: {e}", file=sys.stderr)
        return e.exit_code


def _with_json_summary(handler: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """The command with what it prints for people on stderr, then its JSON summary alone on stdout."""
    import contextlib

    from harness.frontends.json_summary import dumps, summary

    stdout, error = sys.stdout, None
    with contextlib.redirect_stdout(sys.stderr):
        try:
            with signals_interrupt():
                code = handler(args)
        except HarnessError as e:
            print(f"fence-harness: {e}", file=sys.stderr)
            code, error = e.exit_code, str(e)
    doc, path = getattr(args, "results", (None, None))
    print(dumps(summary(args.command, code, doc, path, error)), file=stdout, flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        parser = _parser()
        if not argv:
            parser.print_help(sys.stderr)
            return 2
        return _command(parser.parse_args(argv))
    except KeyboardInterrupt as e:
        # Outside a scenario loop (start-up, loading files, opening the device): nothing
        # partial to keep. A loop's own interrupt ends in write_partial's line instead.
        sig = interrupt_signal(e)
        print(f"fence-harness: interrupted ({sig.name})", file=sys.stderr)
        return 128 + sig

