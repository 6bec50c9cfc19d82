"""What `harness.sanitizer` costs per replay, on a GPU.

    fence-harness sanitizer cost [--rounds N] [--replays N] [--out DIR]

Cases: the plain-PyTorch example (`harness.examples.h2d_graph_race`, unfenced and with the
event fence) and the default set's full-graph scenarios with the final-event fence (attention,
mamba, hybrid), plus the hybrid one unfenced. Each round runs the case twice, plain and under
`sanitize()` (which order alternates round by round, so a drift of the device does not favour
one side), each time set up anew (the sanitizer must see the capture to re-enact the replays).

Time per replay is device time: two events around the replay loop (the example's loop; the
harness's checked replays, `harness.studies.checking_speed.checked_run`), over the replays. Every replay
ends in a host synchronisation, so the device's span includes the time the host took between
replays: where the sanitizer's cost lies. The cost is the round-by-round ratio, sanitized over
plain; median and spread over rounds. The sanitizer's races come with it: a case whose verdict
is wrong (a race unreported, or a report on a fenced case) makes the exit code 1.

Writes `results.json` (`sanitizer_cost.cases`) and `table.md` under --out.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from harness.studies.fence_cost import Spread
from harness.studies.sanitizer_compare import Case

EXAMPLE_CASES = ("example:none", "example:event")
SCENARIO_CASES = ("attention-full-final_event", "mamba-full-final_event", "hybrid-full-final_event",
                  "hybrid-full-none")


@dataclass(frozen=True)
class Sample:
    """One run of a case: device ms per replay, its stale replays, and (under the sanitizer) its
    races."""

    ms_per_replay: float
    stale: int
    races: int | None = None  # None: run plain


@dataclass(frozen=True)
class Cost:
    case: str
    racy: bool  # what the case is: unfenced
    replays: int  # per run
    plain: Spread  # device ms per replay, over rounds
    sanitized: Spread
    ratio: Spread  # sanitized over plain, round by round
    races: tuple[int, ...]  # the sanitizer's races, round by round
    stale: tuple[int, ...]  # plain runs' stale replays, round by round

    @classmethod
    def of(cls, case: str, replays: int, rounds: list[tuple[Sample, Sample]]) -> Cost:
        plain = [p for p, _ in rounds]
        under = [s for _, s in rounds]
        return cls(case, Case(case).racy, replays,
                   Spread.of([p.ms_per_replay for p in plain]), Spread.of([s.ms_per_replay for s in under]),
                   Spread.of([s.ms_per_replay / p.ms_per_replay for p, s in rounds if p.ms_per_replay > 0]),
                   tuple(s.races or 0 for s in under), tuple(p.stale for p in plain))

    @property
    def added_ms(self) -> float:
        """What the sanitizer adds to a replay: the medians' difference."""
        return self.sanitized.median - self.plain.median

    @property
    def agrees(self) -> bool:
        """The sanitizer reported a race in every round of an unfenced case, none in a fenced one."""
        return bool(self.races) and all((r > 0) == self.racy for r in self.races)

    def row(self) -> dict:
        return {"case": self.case, "racy": self.racy, "replays": self.replays, "rounds": self.plain.n,
                "plain_ms": asdict(self.plain), "sanitized_ms": asdict(self.sanitized), "ratio": asdict(self.ratio),
                "added_ms": round(self.added_ms, 4), "races": list(self.races), "stale": list(self.stale),
                "agrees": self.agrees}

    def line(self) -> str:
        p, s, r = self.plain, self.sanitized, self.ratio
        return (f"| {self.case} | {'race' if self.racy else 'fenced'} | {self.replays} x {p.n} "
                f"| {p.median:.3f} ({p.p10:.3f}-{p.p90:.3f}) | {s.median:.3f} ({s.p10:.3f}-{s.p90:.3f}) "
                f"| {self.added_ms:+.3f} | {r.median:.2f}x ({r.p10:.2f}-{r.p90:.2f}) "
                f"| {'/'.join(map(str, sorted(set(self.races))))} | {'yes' if self.agrees else 'NO'} |")


HEADER = ("| case | is | replays x rounds | plain ms/replay (p10-p90) | sanitized ms/replay (p10-p90) "
          "| added ms | ratio (p10-p90) | races | verdict right |\n" + "| --- " * 9 + "|")


def measure_rounds(run: Callable[[bool], Sample], rounds: int) -> list[tuple[Sample, Sample]]:
    """`rounds` pairs (plain, sanitized) of `run(sanitized)`; even rounds run plain first, odd ones
    sanitized first."""
    pairs = []
    for i in range(rounds):
        order = (False, True) if i % 2 == 0 else (True, False)
        got = {s: run(s) for s in order}
        pairs.append((got[False], got[True]))
    return pairs


# ---------------------------------------------------------------- on CUDA


def _plain_and_sanitized(timed: Callable[[], Sample]) -> Callable[[bool], Sample]:
    """`timed` run plain, or under `sanitize()` with the races it reported."""
    from harness.sanitizer.session import sanitize

    def once(sanitized: bool) -> Sample:
        if not sanitized:
            return timed()
        with sanitize() as s:
            got = timed()
        return replace(got, races=len(s.races))

    return once


def _example(fence: str, replays: int) -> Callable[[bool], Sample]:
    import torch

    from harness.examples.h2d_graph_race import run

    def timed() -> Sample:
        span = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        stale = run(fence, replays, span=span)
        torch.cuda.synchronize()
        return Sample(span[0].elapsed_time(span[1]) / replays, stale)

    return _plain_and_sanitized(timed)


def _scenario(name: str, replays: int) -> Callable[[bool], Sample]:
    from harness.devices.cuda import CudaDevice
    from harness.studies.checking_speed import checked_replayer, checked_run
    from harness.studies.sanitizer_compare import scenario_named

    scenario = scenario_named(name)

    def timed() -> Sample:
        run = checked_run(checked_replayer(CudaDevice(), scenario), replays)
        t = run.times
        # The device's span over the checked replays: each one's marks, plus the idle between them.
        span_ms = t.poison_ms + t.load_replay_ms + t.look_ms + t.idle_ms
        return Sample(span_ms / max(1, t.replays), run.tally.stale_replays)

    return _plain_and_sanitized(timed)


def run(rounds: int, replays: int, example_replays: int, out: Path) -> int:
    """Every case, plain and sanitized in alternating rounds; exit 1 where the sanitizer's verdict is wrong."""
    import torch

    if not torch.cuda.is_available():
        print("sanitizer cost: no CUDA device here; the sanitizer watches CUDA streams, so it is measured on a GPU")
        return 0
    print(HEADER, flush=True)
    costs: list[Cost] = []
    cases = [(c, _example(c.split(":", 1)[1], example_replays), example_replays) for c in EXAMPLE_CASES]
    cases += [(c, _scenario(c, replays), replays) for c in SCENARIO_CASES]
    for case, once, n in cases:
        once(False)  # warm-up: the first run of a case pays for kernels loaded and memory pooled
        costs.append(Cost.of(case, n, measure_rounds(once, rounds)))
        print(costs[-1].line(), flush=True)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "sanitizer_cost": {"cases": [c.row() for c in costs]}}
    (out / "results.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / "table.md").write_text("\n".join([HEADER, *(c.line() for c in costs)]) + "\n")
    return 0 if all(c.agrees for c in costs) else 1

