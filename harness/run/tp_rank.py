"""One rank of a tensor-parallel scenario, in its own process (`harness.run.tp` starts it).

It joins the group, opens its own device and runs the ordinary pipeline on its view of the
scenario: the testbed sees the group and builds the rank's share of the model. What it sends back
is its result without the op list (the closures in it stay here), each counted replay's verdict,
and the node counts of its captured graphs (all-reduces among them). Whatever ends it, an exception
of its own or a peer that failed, it sends its traceback; asked (SIGUSR1), it writes the stack of
every thread to its stack file, so a rank stuck in a collective can say where.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import re
import signal
import traceback
from multiprocessing.connection import Connection

from harness.devices.collective import current_group, join_group, leave_group
from harness.records.device_settings import SimCosts
from harness.records.trace import Collective, Replay
from harness.run.oracle import ReplayVerdict
from harness.run.pipeline import run_scenario
from harness.run.tp import RankJob, RankOutcome

PROGRESS_EVERY = 8  # counted replays between progress messages


def main(job: RankJob, conn: Connection) -> None:
    stack_file = open(job.stack_file, "w")  # noqa: SIM115 - open until the process ends
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    out = RankOutcome(job.rank)

    def send(kind: str, payload: object) -> None:
        try:
            conn.send((kind, payload))
        except (BrokenPipeError, OSError):
            pass  # the coordinator has gone: nothing to tell

    try:
        import torch

        torch.set_num_threads(1)  # the ranks share the host's cores
        send("progress", "joining the group")
        cuda = job.device == "cuda"
        if cuda:
            torch.cuda.set_device(job.rank)
        join_group(job.rank, job.world, job.init_method, cuda=cuda, timeout_s=job.timeout_s)
        dev = _open(job)
        send("progress", "set-up (ground truth, capture, traced replay)")
        verdicts: list[ReplayVerdict] = []

        def on_replay(i: int, v: ReplayVerdict) -> None:
            verdicts.append(dataclasses.replace(v, bits=None, units=None))
            if i % PROGRESS_EVERY == 0:
                send("progress", f"replay {i}")

        result = run_scenario(job.scenario, dev, replays=job.replays, timeout_s=job.timeout_s,
                              on_replay=on_replay, counted=job.counted)
        if result.graph is not None:
            out.graph_nodes = sum(g.nodes for g in result.graph.graphs)
        if result.trace is not None:  # the collectives captured into the graphs the traced replay ran
            bodies = {op.graph: op.body for op in result.trace.ops if isinstance(op, Replay)}
            out.collective_nodes = sum(isinstance(op, Collective) for body in bodies.values() for op in body)
        result.trace = None  # its closures stay in this process
        out.result, out.verdicts = result, verdicts
    except BaseException as e:  # noqa: BLE001 - whatever ends a rank is reported, never lost
        group = current_group()
        if group is not None and group.broken is not None:
            out.error = f"its all-reduce failed ({_short(group.broken)})"
        else:
            first = (str(e).strip().splitlines() or [""])[0]
            out.error = f"{type(e).__name__}: {first}" if first else type(e).__name__
        out.stack = traceback.format_exc()
    send("done", out)
    try:
        if current_group() is not None and (out.error is None and (out.result is None or out.result.error is None)):
            leave_group()  # a peer that failed could hold up the group's teardown: then the process just ends
    finally:
        conn.close()


def _open(job: RankJob):
    if job.device == "cuda":
        from harness.devices.cuda import CudaDevice

        return CudaDevice()
    from harness.devices.sim import SimDevice

    return SimDevice(SimCosts(**(job.sim_costs or {})))


def _short(message: str) -> str:
    """A collective's error in a few words: gloo's names its source file first and advice after."""
    text = re.sub(r"^\[[^\]]*\]\s*", "", message.strip().splitlines()[0] if message.strip() else "")
    return text.split(". ")[0][:120] or "no detail"
