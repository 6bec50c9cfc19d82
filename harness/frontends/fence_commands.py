"""`fence-harness fences` (every strategy against every race) and `fence-harness bench` (their cost).

fences: each full-graph race scenario of the default set, and each kill-matrix
mutant whose defect is its fence, is run with every fence strategy in place of
its own. `none` must be caught on every one; every correct strategy must be clean
on every one (no stale replay, no analyser finding). Exit 1 otherwise.

bench: see `harness.studies.fence_cost`. Prints a table per point and writes the `bench`
section of results.json; exit 0 (a benchmark measures, it does not judge).

Both write summary.md and report.html next to results.json, as `run` does. The device,
the fences and the pipeline are imported by the commands: building the parser imports
no torch.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.faults.registry import FAULTS
from harness.frontends.cli_args import device_arguments, out_argument, positive_int
from harness.frontends.session import write_report
from harness.records.scenario import Backend, Expect, Scenario

if TYPE_CHECKING:
    from harness.run.pipeline import ScenarioResult

# Kill-matrix mutants whose only defect is the fence: a correct strategy in its place fixes them.
FENCE_MUTANTS = ("none", "first_event", "wrong_stream", "previous_op", "layerwise_unrecorded", "value_not_rearmed")


def race_scenarios() -> list[Scenario]:
    from harness.input.scenario_file import bundled_files, load_files

    # Only races whose defect is the fence (a write-back or staging race stays one under any fence),
    # and only the portable ones: a scenario for one kind of device only (the natural set's serving
    # shapes, minutes each on a GPU) would make every strategy pay its cost.
    scenarios = [s for s in load_files(bundled_files())
                 if s.expect is Expect.RACE and s.backend is Backend.FULL and s.fence in FENCE_MUTANTS
                 and s.devices is None]
    matrix = load_files(bundled_files("mutants"))
    scenarios += [s for s in matrix if s.expect is Expect.RACE and s.fence in FENCE_MUTANTS
                  and s.schedule == "layerwise" and s.accessor == "per_layer"]
    return scenarios


@dataclass(frozen=True)
class Cell:
    """One strategy in place of one race scenario's fence; `ok` is its verdict's `met`
    (each cell expects a race with `none` and clean with every correct strategy)."""

    scenario: str
    strategy: str
    stale_replays: int
    replays: int
    findings: int
    error: str | None
    ok: bool


def cell(r: ScenarioResult, base: str) -> Cell:
    return Cell(base, r.scenario.fence, r.tally.stale_replays, r.tally.replays, len(r.findings), r.error, r.met)


def cmd_fences(args: argparse.Namespace) -> int:
    from harness.devices import open_device
    from harness.input.plugins import Kind, resolve
    from harness.protocol.fences import STRATEGIES
    from harness.records.plain import as_plain
    from harness.report.results import build_results, write_results
    from harness.run.pipeline import run_scenario

    chosen = getattr(args, "strategies", None) or list(STRATEGIES)
    for name in chosen:
        resolve(Kind.FENCE, name, "--strategy", "strategy")  # one line, exit 2, for a name that is no fence
    dev = open_device(args.device, args.sim_costs)
    strategies = ["none", *dict.fromkeys(n for n in chosen if n != "none")]
    fault = getattr(args, "fault", None)
    scenarios = [s for s in race_scenarios() if fault is None or s.fault.kind == fault]
    print(f"device: {dev.name}  race scenarios: {len(scenarios)}  strategies: {', '.join(strategies)}")
    started, results, cells = time.time(), [], []
    doc = build_results([], dev.describe(), started, time.time(), {"strategies": {"cells": []}})
    path = write_results(args.out, doc)
    for s in scenarios:
        row = []
        for strategy in strategies:
            variant = s.with_overrides(name=f"{s.name}@{strategy}", fence=strategy,
                                       expect=Expect.RACE if strategy == "none" else Expect.CLEAN,
                                       evidence=s.evidence if strategy == "none" else None)
            r = run_scenario(variant, dev, replays=args.replays, timeout_s=args.timeout)
            results.append(r)
            c = cell(r, s.name)
            cells.append(c)
            row.append(f"{strategy}={'err' if c.error else f'{c.stale_replays}/{c.replays}'}"
                       f"{'' if c.ok else '!'}")
        print(f"{s.name:38s} " + "  ".join(row), flush=True)
        # After every scenario (atomically): a check stopped part way still leaves its finished rows.
        doc = build_results(results, dev.describe(), started, time.time(),
                            {"strategies": {"cells": [as_plain(c) for c in cells]}})
        path = write_results(args.out, doc)
    bad = [c for c in cells if not c.ok]
    write_report(doc, args.out)
    print(f"{len(cells) - len(bad)}/{len(cells)} cells as expected (none caught, every strategy clean); "
          f"results: {path}")
    for c in bad:
        print(f"  unexpected: {c.scenario} with {c.strategy}: stale {c.stale_replays}/{c.replays}, "
              f"findings {c.findings}{', error: ' + c.error if c.error else ''}")
    return 0 if not bad else 1


# `bench` without --points, by device kind.
DEFAULT_POINTS = {"cuda": "sweep", "sim": "default"}


def cmd_bench(args: argparse.Namespace) -> int:
    from harness.devices import open_device
    from harness.input.plugins import Kind, resolve
    from harness.records.errors import InputError
    from harness.report.results import build_results, write_results
    from harness.studies.fence_cost import ARMS, POINT_SETS, arm_parts, bench_point, points_named

    arms = args.arms or list(ARMS)
    for arm in arms:
        fence, schedule = arm_parts(arm)
        resolve(Kind.FENCE, fence, "--arm", "arm")  # one line, exit 2, for a name that is no fence
        if schedule is not None:
            resolve(Kind.SCHEDULE, schedule, "--arm", "arm")
    names = None if args.points is None else [n.strip() for n in args.points.split(",") if n.strip()]
    unknown = [n for n in names or () if n not in POINT_SETS]
    if unknown or names == []:
        raise InputError("--points", "points", f"unknown point set {', '.join(unknown) or '(none)'}; "
                         f"valid: {', '.join(POINT_SETS)}, or several joined by commas")
    dev = open_device(args.device, args.sim_costs)
    # On the simulator, which computes every kernel on the CPU, the sweep takes minutes and most of a
    # CI machine's memory (11 testbeds a point, up to 32 layers), for figures that are modelled anyway.
    points = points_named(names or [DEFAULT_POINTS[dev.name]])
    print(f"device: {dev.name}  points: {len(points)}  repeats: {args.repeats} (+{args.warmup} warm-up)")
    started, rows = time.time(), []
    for done, point in enumerate(points, 1):
        res = bench_point(dev, point, args.repeats, args.warmup, args.timeout, arms)
        rows += res.rows()
        ld, cp = res.stats["load"], res.stats["compute"]
        print(f"\n{point.label}: "
              f"load {ld.median_ms:.3f} ms [{ld.p25_ms:.3f}-{ld.p75_ms:.3f}], compute {cp.median_ms:.3f} ms "
              f"[{cp.p25_ms:.3f}-{cp.p75_ms:.3f}], bound {res.bound_ms:.3f} ms  (median [IQR])")
        for row in res.rows():
            unf = (f"x{row['ratio_to_unfenced']:.2f} [{row['ratio_to_unfenced_p25']:.2f}-"
                   f"{row['ratio_to_unfenced_p75']:.2f}] of none" if "ratio_to_unfenced" in row else "")
            print(f"  {row['strategy']:30s} {row['median_ms']:8.3f} ms [{row['p25_ms']:.3f}-{row['p75_ms']:.3f}]  "
                  f"x{row['ratio_to_bound']:.2f} of bound  {unf}  forward starts at {row['forward_start_ms']:.3f} ms",
                  flush=True)
        # After every point (atomically): a sweep stopped part way still leaves the points it
        # measured, marked partial until the last one is in.
        sections: dict = {"bench": {"points": rows, "clock": dev.clock}}
        if done < len(points):
            sections["partial"] = True
        doc = build_results([], dev.describe(), started, time.time(), sections)
        path = write_results(args.out, doc)
    write_report(doc, args.out)
    print(f"\nresults: {path}")
    return 0


def cmd_checking(args: argparse.Namespace) -> int:
    from harness.devices import open_device
    from harness.report.results import build_results, write_results
    from harness.studies.checking_speed import TARGET, default_shapes, measure

    dev = open_device(args.device, args.sim_costs)
    shapes = default_shapes()
    if dev.name != "cuda" and not args.all_shapes:
        # The simulator runs every kernel on the CPU: serving shapes take minutes a replay there.
        shapes = [s for s in shapes if s.name.startswith("tiny")]
    print(f"device: {dev.name}  shapes: {len(shapes)}  replays: {args.replays} "
          f"(x10 on the tiny model), best of {args.runs} runs; device bound = load + replay, "
          f"device events in the same run")
    started, rows = time.time(), []
    print(f"{'shape':34s} {'checked/s':>10s} {'bound/s':>9s} {'bound ms':>9s} {'p10-p90':>15s} "
          f"{'harness ms':>10s} {'idle ms':>8s} {'overhead':>9s} {'<=' + format(TARGET, '.0%'):>5s} {'stale':>9s}")
    for shape in shapes:
        n = args.replays * (10 if shape.name.startswith("tiny") else 1)
        p = measure(dev, shape, n, args.runs, timeout_s=args.timeout)
        rows.append(p.row())
        print(f"{p.shape:34s} {p.replays_per_s:10.1f} {p.bound_replays_per_s:9.1f} {p.device_ms:9.3f} "
              f"{p.device_p10_ms:7.3f}-{p.device_p90_ms:<7.3f} {p.harness_ms:10.3f} {p.idle_ms:8.3f} "
              f"{p.overhead:+9.1%} {'yes' if p.within else 'NO':>5s} {p.stale_replays:>4d}/{p.replays:<4d}",
              flush=True)
    if dev.clock != "device":
        print("(the simulator's device time is virtual: against wall-clock rates the overhead column means nothing)")
    doc = build_results([], dev.describe(), started, time.time(), {"checking": {"points": rows, "clock": dev.clock}})
    print(f"\nresults: {write_results(args.out, doc)}")
    return 0


def add_commands(sub) -> None:
    def common(sp: argparse.ArgumentParser) -> None:
        device_arguments(sp)
        out_argument(sp)

    f = sub.add_parser("fences", help="every fence strategy against every full-graph race scenario")
    f.add_argument("--replays", type=positive_int, default=None, help="replays per cell (default: the scenario's)")
    f.add_argument("--strategy", dest="strategies", action="append", metavar="FENCE",
                   help="a correct strategy to check (repeatable): a registry name or package.module:callable "
                        "(default: every correct strategy); `none` always runs too")
    f.add_argument("--fault", choices=list(FAULTS), default=None,
                   help="only the race scenarios under this fault (gate: the deterministic ones)")
    common(f)
    b = sub.add_parser("bench", help="end-to-end cost of each fence strategy against max(load, compute)")
    b.add_argument("--points", default=None, metavar="NAME[,NAME...]",
                   help="named point sets: default (8 attention layers, 2,048 tokens), sweep (512-16,384 "
                        "tokens, 4-32 layers), layers (8, 32, 80 at 2,048 tokens), prefix (2,048-32,768 at 8 "
                        "layers), deep (80 layers), hybrid, hidden (4,096), serving (all of it); default: "
                        "sweep on a GPU, default on the simulator")
    b.add_argument("--repeats", type=positive_int, default=100, help="timed rounds per arm (default 100)")
    b.add_argument("--warmup", type=positive_int, default=10, help="untimed rounds first (default 10)")
    b.add_argument("--arm", dest="arms", action="append", metavar="FENCE",
                   help="a fence to time (repeatable): a registry name or package.module:callable, "
                        "FENCE+SCHEDULE with a load-back schedule (layerwise_value+captured_load); "
                        "default: none, every correct strategy, and two arms with captured_load")
    common(b)


    c = sub.add_parser("checking", help="checked replays per second against the device time of what is checked")
    c.add_argument("--replays", type=positive_int, default=300,
                   help="checked replays per shape, ten times that on the tiny model (default 300)")
    c.add_argument("--runs", type=positive_int, default=2, help="checked runs per shape, the best kept (default 2)")
    c.add_argument("--all-shapes", action="store_true",
                   help="the serving shapes on the simulator too (slow: it computes on the CPU)")
    common(c)


HANDLERS = {"fences": cmd_fences, "bench": cmd_bench, "checking": cmd_checking}
