"""A tensor-parallel scenario (`tp` > 1): one process per rank, and their results as one.

The process that runs the scenario starts `tp` rank processes (forked from a fork server that has
imported the harness once, so a scenario starts in a fraction of a second) and takes no part in
the run itself. Each rank joins a process group (`harness.devices.collective`: gloo on the
simulator, NCCL on CUDA; a free TCP port on localhost), opens its own device, and runs the
ordinary pipeline (`harness.run.tp_rank`) on its view of the scenario (`rank_view`): its own pools,
load-back, gate, fault and fence, and its share of the model, whose all-reduces are ops of its
forward stream. Every rank replays the same replays, so their collectives pair up.

Each rank sends back its result (without the op list, whose closures stay in its process) and
each replay's verdict; here they become the scenario's one result: a replay is stale when it is
stale on any rank, the findings and graph checks are every rank's (their streams named by rank),
and `CrossRank` says which rank read stale data and whether the all-reduce carried it on.

Nothing here waits without a bound. The group has a timeout on every collective; a rank that
fails, dies or stops sending for longer than the replay timeout ends the scenario as an error:
the other ranks get a few seconds to finish, then each still running writes its stack
(`faulthandler`, on SIGUSR1) and is killed, and the error names every rank's end, with every
rank's traceback or stack in `CrossRank`.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import signal
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from harness.faults.registry import fault_strategy
from harness.records.ranks import CrossRank, RankReplay, RankTally, cross_rank
from harness.records.scenario import Fault, Scenario
from harness.records.trace import Span
from harness.run.oracle import ReplayVerdict

START_S = 60.0  # a rank's start-up (imports, the group's rendezvous) on top of the replay timeout
GRACE_S = 3.0  # how long the other ranks may take to finish once one has failed
STACK_S = 1.0  # how long a rank asked for its stack gets to write it
RANK_MODULE = "harness.run.tp_rank"  # what a rank process runs (named, not imported: it runs the pipeline)


def on_rank(ranks: tuple[int, ...] | None, rank: int) -> bool:
    return ranks is None or rank in ranks


def rank_view(scenario: Scenario, rank: int) -> Scenario:
    """What rank `rank` runs: the fault where `fault_ranks` selects it (elsewhere none: a sweep of as
    many points at no delay, so every rank replays as often), the fence where `fence_ranks` does
    (elsewhere none)."""
    fault = scenario.fault
    if not on_rank(scenario.fault_ranks, rank):
        fault = Fault(fault.kind, points=(0.0,) * len(fault.points)) if fault_strategy(fault).sweeps else Fault()
    fence = scenario.fence if on_rank(scenario.fence_ranks, rank) else "none"
    return scenario.with_overrides(fault=fault, fence=fence)


@dataclass
class RankJob:
    """What a rank process is given (pickled to it)."""

    scenario: Scenario  # the rank's view
    rank: int
    world: int
    init_method: str
    device: str  # "sim" or "cuda"
    sim_costs: dict | None
    replays: int | None
    timeout_s: float
    counted: bool
    stack_file: str


@dataclass
class RankOutcome:
    """What a rank process sends back when it ends."""

    rank: int
    result: Any = None  # its ScenarioResult, the op list dropped (None: it failed before it had one)
    verdicts: list[ReplayVerdict] = field(default_factory=list)  # each counted replay's, in order
    graph_nodes: int = 0
    collective_nodes: int = 0
    error: str | None = None  # an exception that escaped its pipeline, in one line
    stack: str | None = None  # its traceback


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_context: Any = None


def _mp() -> Any:
    """The fork server's context, the harness imported in it once: each rank is forked from a process
    that has run no torch op (a fork of one that has can hang in its thread pool)."""
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload([RANK_MODULE])
    return _context


def _rank_entry(job: RankJob, conn: Connection) -> None:
    """A rank process's start: its module, named here and imported only in the rank."""
    import importlib

    importlib.import_module(RANK_MODULE).main(job, conn)


def _device_kind(dev: Any) -> str:
    return "cuda" if getattr(dev, "name", "sim") != "sim" else "sim"


def run_tp(scenario: Scenario, dev: Any, make_result: Callable[[Scenario], Any], *, replays: int | None,
           timeout_s: float, counted: bool, on_replay: Callable[[int, ReplayVerdict], None] | None = None) -> Any:
    """The scenario on `scenario.tp` rank processes; `make_result(scenario)` makes the empty result
    (`ScenarioResult`) that the ranks' results are merged into."""
    t0 = time.perf_counter()
    kind = _device_kind(dev)
    if kind == "cuda":
        import torch

        if torch.cuda.device_count() < scenario.tp:
            result = make_result(scenario)
            result.error = (f"tp = {scenario.tp} runs one rank a GPU (NCCL between them); this host has "
                            f"{torch.cuda.device_count()}")
            return result
    ctx = _mp()
    costs = dict(dev.costs.__dict__) if kind == "sim" else None
    init = f"tcp://127.0.0.1:{_free_port()}"
    tmp = tempfile.TemporaryDirectory(prefix="fence-harness-tp-")
    procs, conns = [], []
    try:
        for rank in range(scenario.tp):
            job = RankJob(rank_view(scenario, rank), rank, scenario.tp, init, kind, costs, replays, timeout_s,
                          counted, str(Path(tmp.name) / f"rank{rank}.stack"))
            recv, send = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_rank_entry, args=(job, send), name=f"fence-harness-rank{rank}", daemon=True)
            p.start()
            send.close()
            procs.append(p)
            conns.append(recv)
        ends = _collect(procs, conns, timeout_s, [str(Path(tmp.name) / f"rank{r}.stack") for r in range(scenario.tp)])
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(timeout=5)
        for c in conns:
            c.close()
        tmp.cleanup()
    result = merge(scenario, ends, make_result, on_replay)
    result.wall_s = time.perf_counter() - t0
    return result


@dataclass
class _End:
    """How one rank ended, as the coordinator saw it."""

    rank: int
    outcome: RankOutcome | None = None
    state: str = "finished"  # finished | failed | died (exit code N) | stopped
    stack: str | None = None
    last: str = "starting"  # the last progress it reported
    order: int = 0  # when it ended abnormally, among the ranks that did (1 first; 0: it finished)


def _collect(procs: list, conns: list[Connection], timeout_s: float, stacks: list[str]) -> list[_End]:
    """Every rank's end, waiting a bounded time: a rank that fails or dies gives the others
    `GRACE_S` to end, then they are stopped; a rank silent for the replay timeout (and start-up) is
    stopped too."""
    ends = [_End(r) for r in range(len(procs))]
    open_ = dict(enumerate(conns))
    heard = time.monotonic()
    failed_at: float | None = None
    failures = 0
    while open_:
        limit = (failed_at + GRACE_S) if failed_at is not None else heard + timeout_s + START_S
        left = limit - time.monotonic()
        if left <= 0:
            break
        for ready in wait(list(open_.values()), timeout=min(left, 1.0)):
            rank = next(r for r, c in open_.items() if c is ready)
            try:
                kind, payload = open_[rank].recv()
            except (EOFError, OSError):
                del open_[rank]
                procs[rank].join(timeout=5)
                if ends[rank].outcome is None:
                    ends[rank].state = f"died (exit code {procs[rank].exitcode})"
                    failures += 1
                    ends[rank].order = failures
                    failed_at = failed_at or time.monotonic()
                continue
            heard = time.monotonic()
            if kind == "progress":
                ends[rank].last = payload
            else:
                ends[rank].outcome = payload
                if payload.error is not None or (payload.result is not None and payload.result.error is not None):
                    ends[rank].state = "failed"
                    failures += 1
                    ends[rank].order = failures
                    failed_at = failed_at or time.monotonic()
    for rank in list(open_):  # still running past the limit: its stack, then it goes
        end = ends[rank]
        end.state = "stopped"
        failures += 1
        end.order = failures
        end.stack = _stack_of(procs[rank], stacks[rank])
    return ends


def _stack_of(proc: Any, path: str) -> str | None:
    """Ask a running rank for its stack (faulthandler writes every thread's on SIGUSR1), then kill it."""
    if proc.pid is not None and proc.is_alive():
        try:
            os.kill(proc.pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + STACK_S
        while time.monotonic() < deadline and not (os.path.exists(path) and os.path.getsize(path)):
            time.sleep(0.05)
        time.sleep(0.1)  # let it finish writing
        proc.kill()
    try:
        return Path(path).read_text() or None
    except OSError:
        return None


def _rank_streams(rank: int, name: str) -> str:
    return name if name == "host" else f"rank{rank} {name}"


def merged_verdict(verdicts: list[ReplayVerdict]) -> ReplayVerdict:
    """One replay's verdict over every rank: stale when any rank's was."""
    return ReplayVerdict(
        stale_units=sum(v.stale_units for v in verdicts),
        read_units=sum(v.read_units for v in verdicts),
        stale_reads=sum(v.stale_reads for v in verdicts),
        layers=frozenset().union(*(v.layers for v in verdicts)),
        pools=frozenset().union(*(v.pools for v in verdicts)),
        final_state_layers=frozenset().union(*(v.final_state_layers for v in verdicts)),
        output_differs=any(v.output_differs for v in verdicts),
        backup_layers=frozenset().union(*(v.backup_layers for v in verdicts)),
    )


def _error_line(ends: list[_End]) -> str | None:
    """The scenario's error when a rank did not finish: every rank's end, in one line."""
    if all(e.state == "finished" for e in ends):
        return None
    parts = []
    for e in sorted(ends, key=lambda e: (e.order == 0, e.order)):  # the first to fail first: the cause
        if e.state == "failed" and e.outcome is not None:
            why = e.outcome.error or (e.outcome.result.error if e.outcome.result is not None else None)
            parts.append(f"rank {e.rank} failed: {why}")
        elif e.state == "stopped":
            parts.append(f"rank {e.rank} stopped at {e.last} (no end within the time allowed; "
                         "its stack is in the tp section)")
        elif e.state.startswith("died"):
            parts.append(f"rank {e.rank} {e.state} at {e.last}")
        else:
            parts.append(f"rank {e.rank} finished")
    return "; ".join(parts)


def merge(scenario: Scenario, ends: list[_End], make_result: Callable[[Scenario], Any],
          on_replay: Callable[[int, ReplayVerdict], None] | None = None) -> Any:
    """The ranks' results as the scenario's one result, with its `tp` (`CrossRank`) filled in."""
    result = make_result(scenario)
    tallies, per_rank = [], []
    for e in ends:
        out, view = e.outcome, rank_view(scenario, e.rank)
        t = RankTally(e.rank, fault=view.fault.describe(), fence=view.fence, state=e.state,
                      stack=e.stack or (out.stack if out is not None else None))
        r = out.result if out is not None else None
        if out is not None:
            t.graph_nodes, t.collective_nodes = out.graph_nodes, out.collective_nodes
            t.error = out.error or (r.error if r is not None else None)
        if r is not None:
            t.findings = len(r.findings)
            t.graph_findings = len(r.graph.findings) if r.graph is not None else 0
            result.findings += [dataclasses.replace(f, copy_stream=_rank_streams(e.rank, f.copy_stream),
                                                    access_stream=_rank_streams(e.rank, f.access_stream))
                                for f in r.findings]
            if r.graph is not None:
                if result.graph is None:
                    result.graph = r.graph
                else:
                    result.graph = dataclasses.replace(result.graph, graphs=result.graph.graphs + r.graph.graphs,
                                                       findings=result.graph.findings + r.graph.findings)
            result.timeline += [Span(f"rank{e.rank} {s.stream}", s.name, s.kind, s.start_us, s.end_us)
                                for s in r.timeline]
            result.clock = r.clock
            seen = set(result.timeline_stale_layers) | set(r.timeline_stale_layers)
            result.timeline_stale_layers = tuple(sorted(seen))
            result.timeline_fault = result.timeline_fault or (r.timeline_fault if r.timeline_fault != "none" else "")
            result.fault_mode = result.fault_mode or r.fault_mode
            result.replay_s = max(result.replay_s, r.replay_s)
        tallies.append(t)
        per_rank.append(out.verdicts if out is not None else [])
    rows = [[RankReplay(v.stale_reads > 0, v.output_differs, v.stale) for v in vs] for vs in per_rank]
    result.tp = cross_rank(tallies, rows)
    result.error = _error_line(ends)
    if result.error is None:
        for i in range(min((len(vs) for vs in per_rank), default=0)):
            v = merged_verdict([vs[i] for vs in per_rank])
            result.tally.add(v)
            if on_replay is not None:
                on_replay(i, v)
    result.timeline_fault = result.timeline_fault or "none"
    return result


def describe(tp: CrossRank | None) -> str:
    """The cross-rank verdict in words ("" for a scenario on one rank)."""
    return tp.describe() if tp is not None else ""
