"""One scenario through one pipeline, the same on every device.

build the testbed (seeded) -> eager ground truth with all loads complete -> capture
the runner -> one traced replay (the op list the analyser reads, and the timeline)
-> the graph check -> the counted replays (`harness.run.replay`) -> tally -> the
verdict (`harness.run.verdict`). `counted=False` stops after the graph check
(`fence-harness graph-check`): the same set-up, trace and check, no counted replay.
"""

from __future__ import annotations

import gc
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from harness.checkers.graph import GraphCheck, check_graphs
from harness.checkers.happens_before import Finding, find_races
from harness.devices.base import Device, Gate, collector_paused, freeze_startup_heap
from harness.devices.collective import current_group
from harness.faults.contention import Contention, contention
from harness.faults.plan import sweep_points
from harness.faults.registry import fault_strategy
from harness.model.runners import Runner
from harness.records.errors import GraphMismatch, HarnessError, NotRestored, describe_regions
from harness.records.ranks import CrossRank
from harness.records.rates import Rate, Until
from harness.records.scenario import Expect, Scenario
from harness.records.trace import Span, Trace
from harness.run.oracle import Oracle, ReplayVerdict, Tally
from harness.run.replay import Replayer, armed, open_gate
from harness.run.testbed import Testbed
from harness.run.verdict import Verdict, decide


@dataclass
class SweepPoint:
    us: float  # injected delay
    tally: Tally


@dataclass
class ScenarioResult:
    scenario: Scenario
    tally: Tally = field(default_factory=Tally)
    error: str | None = None
    not_restored: str | None = None  # ground truth found slots the landed load op did not restore
    wall_s: float = 0.0
    replay_s: float = 0.0  # the replay loop alone
    trace: Trace | None = None
    findings: list[Finding] = field(default_factory=list)  # happens-before races in the op list
    graph: GraphCheck | None = None  # the traced replay's graphs, checked by their own nodes and edges
    fault_mode: str | None = None  # how a gate was built, or what stood in for it
    sweep: list[SweepPoint] = field(default_factory=list)  # per delay point (sweep faults)
    timeline: list[Span] = field(default_factory=list)  # the traced replay's streams in time
    timeline_stale_layers: tuple[int, ...] = ()  # layers the traced replay read stale
    timeline_backup_layers: tuple[int, ...] = ()  # layers whose write-back host copy it got wrong
    timeline_fault: str = ""  # the fault the traced replay ran under (a sweep's: its last point)
    clock: str = "device"  # the timeline's clock: device time, or the simulator's virtual time
    verdict: Verdict | None = None  # decided once, when the scenario has ended
    pressure: dict | None = None  # a pressure fault: how its contention ran and what it achieved
    until: Until | None = None  # run --until-confidence: the interval width asked for, and the cap
    tp: CrossRank | None = None  # tensor parallel (`harness.run.tp`): each rank, and the cross-rank verdict

    @property
    def widest_interval(self) -> float:
        """The width of the stale rate's 95% interval; of the widest, for a sweep's points."""
        tallies = [p.tally for p in self.sweep] or [self.tally]
        return max(Rate(t.stale_replays, t.replays).width() for t in tallies)

    @property
    def confident(self) -> bool:
        """With --until-confidence: every rate (each sweep point's) narrower than asked for."""
        return self.until is None or self.widest_interval < self.until.width

    def seal(self) -> Verdict:
        """Decide the verdict from what was seen (`harness.run.verdict`); call once, at the end."""
        graph_findings = len(self.graph.findings) if self.graph is not None else 0
        self.verdict = decide(self.scenario, self.tally.stale_replays, len(self.findings), self.error, graph_findings,
                              self.not_restored)
        return self.verdict

    @property
    def observed(self) -> Expect | None:
        return self._verdict.observed

    @property
    def met(self) -> bool:
        return self._verdict.met

    @property
    def _verdict(self) -> Verdict:
        return self.verdict if self.verdict is not None else self.seal()

    @property
    def replays_per_s(self) -> float:
        return self.tally.replays / self.replay_s if self.replay_s else 0.0


ReplayHook = Callable[[int, ReplayVerdict], None]


def _due(tally: Tally, minimum: int, until: Until | None, batch: int) -> int:
    """How many more counted replays are due: up to `minimum` of them; with --until-confidence, more
    until the stale rate's 95% interval is narrower than asked for, or the cap. Those run a batch at
    a time (one host synchronisation each), never past the fewest replays whose interval could be
    narrow enough: a run in which every replay agreed stops exactly where the interval gets there,
    any other within a batch of it."""
    if tally.replays < minimum:
        return minimum - tally.replays
    if until is None or not until.more(Rate(tally.stale_replays, tally.replays), minimum):
        return 0
    short = until.fewest - tally.replays  # replays that cannot yet be enough, whatever they show
    return max(1, min(batch, until.cap - tally.replays, short if short > 0 else batch))


def _raised_in_engine(e: BaseException, engine: str) -> bool:
    """Whether `e` came through the engine's code or its adapter (harness/engines/)."""
    marks = (f"{os.sep}{engine}{os.sep}", f"{os.sep}harness{os.sep}engines{os.sep}")
    return any(m in frame.filename for frame in traceback.extract_tb(e.__traceback__) for m in marks)


def run_scenario(
    scenario: Scenario,
    dev: Device,
    *,
    replays: int | None = None,
    timeout_s: float = 30.0,
    on_replay: ReplayHook | None = None,
    until: Until | None = None,
    counted: bool = True,
) -> ScenarioResult:
    """One scenario on `dev`; with `counted=False`, everything up to and including the graph check
    and no counted replay (and no pressure fault's contention: nothing it could slow is timed)."""
    if scenario.tp > 1 and current_group() is None:
        # One process per rank, each running this pipeline on its view (`harness.run.tp`). The ranks'
        # replay counts must match for their collectives to pair up: --until-confidence applies to
        # scenarios on one rank only.
        from harness.run.tp import run_tp

        tp_result = run_tp(scenario, dev, ScenarioResult, replays=replays, timeout_s=timeout_s, counted=counted,
                           on_replay=on_replay)
        tp_result.seal()
        return tp_result
    freeze_startup_heap()  # before t0: once per process, not this scenario's time
    result = ScenarioResult(scenario, until=until)
    t0 = time.perf_counter()
    gate: Gate | None = None
    # Optional: the cleanup below drops them when the scenario ends early.
    tb: Testbed | None
    oracle: Oracle | None
    runner: Runner | None
    replay: Replayer | None
    ended = False
    pressure = Contention()
    try:
        # A pressure fault's process starts now: its start-up overlaps the build and the capture.
        if counted:
            pressure = contention(scenario.fault, dev.torch_device)
        tb = Testbed(scenario, dev, timeout_s)
        oracle, runner = armed(tb, timeout_s)
        gate, fault, result.fault_mode = open_gate(tb, timeout_s)
        replay = Replayer(tb, runner, timeout_s, gate, oracle)  # it captures the harness's own graphs
        result.fault_mode = pressure.ready() or result.fault_mode  # every graph captured: contend from here
        points = sweep_points(fault)
        sweeps = fault_strategy(fault).sweeps  # each point's tally kept apart
        n = replays or scenario.replays

        # One extra replay, traced and not counted: tracing costs host time, and host
        # time before the replay launch shifts the race window of the counted ones.
        with dev.tracing() as trace:
            traced = replay(-1, points[-1][1])
        result.timeline_fault = points[-1][1].describe()
        result.trace = trace
        result.findings = find_races(trace)  # structural: shows whether or not timing did
        # The graphs the device will run, read from the device (no replay needed): the op list must
        # match them, or the analysis above was of something else.
        result.graph = check_graphs(trace, dev.graph_source(trace))
        if not result.graph.matched:
            raise GraphMismatch(result.graph.mismatch_line())
        result.timeline = dev.timeline(trace)
        result.clock = dev.clock
        result.timeline_stale_layers = tuple(sorted(traced.layers))
        result.timeline_backup_layers = tuple(sorted(traced.backup_layers))
        if not counted:
            points = []  # stop here: what the check needs is done
        t1 = time.perf_counter()
        try:
            with collector_paused():  # a collector pause mid-replay is host jitter the race test need not see
                for us, point_fault in points:
                    point = SweepPoint(us, Tally())
                    while due := _due(point.tally, n, until, replay.observer.batch):
                        start = point.tally.replays
                        for i, verdict in enumerate(replay.replays(range(start, start + due), point_fault), start):
                            result.tally.add(verdict)
                            point.tally.add(verdict)
                            if on_replay:
                                on_replay(i, verdict)
                    if sweeps:
                        result.sweep.append(point)
        finally:
            result.replay_s = time.perf_counter() - t1
        ended = True
    except NotRestored as e:  # found in ground truth: the verdict is wrong, and no replay runs
        result.not_restored = describe_regions(e.regions)
    except HarnessError as e:  # a plugin's failure (PluginError) is one of these
        result.error = str(e)
    except torch.OutOfMemoryError as e:  # one scenario's OOM must not end the run
        result.error = f"out of device memory: {(str(e).strip().splitlines() or ['(no detail)'])[0]}"
    except AssertionError as e:
        if scenario.engine is None:
            raise  # the harness's own assertion: a bug to see whole
        # The engine's own checks assert (LayerDoneCounter: a ring slot reused too early).
        result.error = f"{scenario.engine} assertion failed: {e}"
    except Exception as e:
        if scenario.engine is None or not _raised_in_engine(e, scenario.engine):
            raise  # the harness's own bug: seen whole
        # The engine's own code failed here (a module its CUDA path imports that this install
        # lacks, say): that scenario's error, in one line; the run goes on.
        first = (str(e).strip().splitlines() or [""])[0]
        result.error = f"{scenario.engine} raised {type(e).__name__}: {first}"
    finally:
        result.pressure = pressure.stop()  # no contention outlives its scenario, whatever ended it
        if pressure.failed and result.error is None:
            result.error = pressure.failed  # replays that ran without it must not count as under it
        if gate is not None:
            gate.close()  # nothing stays blocked behind a scenario that failed
        if not ended:
            # It ended early (an error, an interrupt): nothing it left queued may hold up the next
            # scenario, and what it built goes back before the next one allocates. Drop this
            # frame's references first, so that the collector can free the testbed, and only then
            # return the cached blocks.
            dev.drop_stuck_work()
            tb = oracle = runner = replay = None  # noqa: F841
            gc.collect()
            if torch.cuda.is_initialized():
                try:
                    torch.cuda.empty_cache()
                except RuntimeError:
                    pass  # a device that is gone has nothing to give back
    result.wall_s = time.perf_counter() - t0
    result.seal()
    return result
