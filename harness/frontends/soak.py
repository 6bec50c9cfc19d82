"""fence-harness soak: random correct scenarios for a while, counting false positives.

Each draw is a correct variant (the full graph with the final_event fence, or the
breakable runner with the accessors' waits) on a small random model, batch and fault
(gate, jitter or chunked), run for a few replays. Any stale replay or happens-before
finding on one of them is a false positive: the harness, or the fix it tests, is wrong.

Every Nth draw also runs its unfenced twin (fence none, or the accessors' waits off),
to show that races are still caught in the data: a twin expects a race with
`evidence = "data"`. A twin whose verdict is not met is a missed race; under a gate
fault that is a failure (the gate holds every copy until after the replay), under
jitter or chunks it is only counted (a small delay may not race).

Both sides are judged by the scenario's verdict (`harness.run.verdict`), as every
other command judges them.

A draw is a function of (seed, index) alone, so `--seed S` repeats a soak's scenarios.
Exit codes: 0 clean; 1 a false positive, a gate twin that did not race, or a scenario
that ended in an error; 2 bad input or a lost device; 130 / 143 interrupted.
"""

from __future__ import annotations

import argparse
import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from harness.faults.registry import FAULTS, fault_strategy
from harness.frontends.cli_args import device_arguments, out_argument, positive_float, positive_int
from harness.frontends.session import run_scenarios, write_partial
from harness.records.scenario import (
    Backend,
    DType,
    Evidence,
    Expect,
    ModelShape,
    Request,
    Scenario,
)

if TYPE_CHECKING:  # the device and the pipeline are the command's to import: --help needs no torch
    from harness.run.pipeline import ScenarioResult

PROGRESS_S = 30.0  # a progress line this often, so a long soak is visibly alive


def draw(seed: int, index: int) -> Scenario:
    """The index-th scenario of a soak: a correct variant on a small random shape."""
    rng = random.Random(f"soak:{seed}:{index}")  # a string seed: the same in every process
    kv_heads = rng.choice((1, 2))
    model = ModelShape(
        layers="".join(rng.choice("AM") for _ in range(rng.randint(1, 4))),
        hidden=rng.choice((16, 32, 64)),
        heads=kv_heads * rng.choice((1, 2)),
        kv_heads=kv_heads,
        head_dim=rng.choice((8, 16, 32)),
        state=rng.choice((2, 4, 8)),
        conv=rng.choice((2, 3, 4)),
        expand=rng.choice((1, 2)),
        page_size=rng.choice((4, 8, 16)),
        dtype=rng.choice((DType.FP32, DType.BF16)),
    )
    batch = tuple(Request(rng.randint(1, 64), rng.randint(1, 8)) for _ in range(rng.randint(1, 3)))
    fault = rng.choice([s for s in FAULTS.values() if s.soaks]).draw(rng)  # gate, jitter or chunked
    full = rng.random() < 0.5
    return Scenario(
        name=f"soak-{seed}-{index}",
        model=model,
        batch=batch,
        backend=Backend.FULL if full else Backend.BREAKABLE,
        fence="final_event" if full else "none",
        expect=Expect.CLEAN,
        fault=fault,
        seed=rng.randrange(2**31),
        source=f"soak --seed {seed}",
    )


def twin(s: Scenario) -> Scenario:
    """The same draw with the ordering that makes it correct taken away."""
    unordered = {"fence": "none"} if s.backend is Backend.FULL else {"accessor": "none"}
    return s.with_overrides(name=f"{s.name}-twin", expect=Expect.RACE, evidence=Evidence.DATA, **unordered)


@dataclass
class Soak:
    """What a soak ran and what it found."""

    seed: int
    scenarios: int = 0  # correct variants run
    twins: int = 0
    replays: int = 0
    false_positives: int = 0
    missed: Counter = field(default_factory=Counter)  # twins without a stale replay, by fault kind
    errors: int = 0
    faults: Counter = field(default_factory=Counter)  # the correct variants' fault kinds
    backends: Counter = field(default_factory=Counter)
    failures: list[ScenarioResult] = field(default_factory=list)  # kept whole in results.json

    @property
    def failed(self) -> bool:
        return bool(self.failures)

    def add(self, r: ScenarioResult) -> str | None:
        """Count one result; for a failure, the status word of its line (else None).

        A twin that missed under jitter or chunks is only counted: a long soak has
        hundreds, and each is expected now and then.
        """
        s = r.scenario
        self.replays += r.tally.replays
        status = None
        missed = r.error is None and not r.met
        if s.expect is Expect.CLEAN:
            self.scenarios += 1
            self.faults[str(s.fault.kind)] += 1
            self.backends[s.backend.value] += 1
            if missed:
                self.false_positives += 1
                status = "FP  "
        else:
            self.twins += 1
            if missed:
                self.missed[str(s.fault.kind)] += 1
                if fault_strategy(s.fault).deterministic:
                    status = "MISS"
        if r.error is not None:
            self.errors += 1
            status = "ERR "
        if status:
            self.failures.append(r)
        return status

    def section(self, args: argparse.Namespace, elapsed_s: float) -> dict:
        return {
            "seed": self.seed,
            "minutes": args.minutes,
            "replays_per_scenario": args.replays,
            "twin_every": args.twin_every,
            "elapsed_s": round(elapsed_s, 2),
            "scenarios": self.scenarios,
            "twins": self.twins,
            "replays": self.replays,
            "replays_per_s": round(self.replays / elapsed_s, 1) if elapsed_s else 0.0,
            "false_positives": self.false_positives,
            "missed_races": {"total": sum(self.missed.values()), **dict(sorted(self.missed.items()))},
            "errors": self.errors,
            "faults": dict(sorted(self.faults.items())),
            "backends": dict(sorted(self.backends.items())),
            "failures": [r.scenario.name for r in self.failures],
        }

    def summary(self, elapsed_s: float) -> str:
        rate = self.replays / elapsed_s if elapsed_s else 0.0
        missed = sum(self.missed.values())
        # The kinds under which a twin always races: a miss there is a harness bug ("gate 0").
        certain = ", ".join(f"{name} {self.missed[name]}" for name, s in FAULTS.items() if s.deterministic)
        return (
            f"soak: {self.scenarios} scenarios + {self.twins} twins, {self.replays} replays in "
            f"{elapsed_s:.1f}s ({rate:.1f} replays/s); false positives {self.false_positives}; "
            f"missed races {missed} ({certain}); "
            f"errors {self.errors}"
        )


def add_command(subparsers) -> None:
    p = subparsers.add_parser("soak", help="random correct scenarios for a while; exit 1 on a false positive")
    p.add_argument("--minutes", type=positive_float, default=1.0, help="how long to draw scenarios (default 1)")
    device_arguments(p)
    p.add_argument("--seed", type=int, help="repeat a soak's draws (default: a fresh seed, printed)")
    out_argument(p, "reports/soak", "results.json")
    p.add_argument("--replays", type=positive_int, default=4, help="replays per scenario (default 4)")
    p.add_argument("--twin-every", type=positive_int, default=4,
                   help="run the unfenced twin of every Nth draw (default 4)")


def _draws(soak: Soak, twin_every: int, deadline: float) -> Iterator[Scenario]:
    """The soak's scenarios until the deadline (at least one draw), twins in their place."""
    index = 0
    while index == 0 or time.monotonic() < deadline:
        s = draw(soak.seed, index)
        yield s
        if index % twin_every == twin_every - 1:
            yield twin(s)
        index += 1


def cmd_soak(args: argparse.Namespace) -> int:
    from harness.devices import open_device
    from harness.frontends.console import plain_line
    from harness.report.results import build_results, write_results

    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    dev = open_device(args.device, args.sim_costs)  # bad input and a missing device fail here
    device = dev.describe()
    print(f"soak: device {dev.name}, seed {seed}, {args.minutes:g} min, {args.replays} replays each, "
          f"a twin every {args.twin_every}", flush=True)
    soak = Soak(seed)
    started, t0 = time.time(), time.monotonic()
    progress = [t0 + PROGRESS_S]

    def done(r: ScenarioResult) -> None:
        status = soak.add(r)
        if status:
            print(f"{plain_line(r, status)}  fault {r.scenario.fault.describe()}", flush=True)
        if time.monotonic() >= progress[0]:
            print(f"  {soak.summary(time.monotonic() - t0)}", flush=True)
            progress[0] += PROGRESS_S

    # A fresh device per scenario: a device keeps every stream it ever made, and its host
    # syncs walk them all, so shared by thousands of scenarios it makes each replay slower.
    stop = run_scenarios(_draws(soak, args.twin_every, t0 + args.minutes * 60),
                         lambda: open_device(args.device, args.sim_costs), args.replays, args.timeout, done)
    elapsed = time.monotonic() - t0
    print(soak.summary(elapsed), flush=True)
    sections = {"soak": soak.section(args, elapsed)}
    if stop:
        return write_partial(stop, soak.failures, device, args.out, started, sections,
                             soak.scenarios + soak.twins)
    path = write_results(args.out, build_results(soak.failures, device, started, time.time(), sections))
    print(f"results: {path}")
    return 1 if soak.failed else 0
