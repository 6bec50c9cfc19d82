"""The simulator's cost model, measured on a GPU (`fence-harness calibrate`).

The simulator (`harness.devices.sim`) charges every op a fixed cost (`SimCosts`): a copy its
latency plus its bytes over the copy bandwidth, a kernel `access_us` (it touches pool memory: a
layer's core) or `kernel_us`, the host `launch_us` per enqueue, `replay_us` per graph launch and
`poll_us` per event query. Where those costs are off, so are the simulator's timing races: with a
copy charged no latency and a layer's core charged 20 us, a copy of a few KB enqueued after a
graph replay landed, on the simulator, while the replay still read, and on an H200 after the replay
had finished with it.

Each cost is measured as the harness incurs it, through the harness's own device:

- **copies**: `copy_async` of each size from host memory (pinned), back to back on one stream
  behind a spin (`Device.delay`: the host enqueues them all while the stream is busy, so the
  markers time the device alone); the time per copy; latency and bandwidth are the
  non-negative least-squares line through the sizes.
- **kernels**: every kernel of each reference shape's full-graph forward (`FORWARD_SHAPES`),
  launched on its own between two markers, back to back behind a spin, gives the ratio of a
  pool-touching kernel's mean device time to any other's; the graph replays of the same forwards
  (no load pending), timed from launch to end, give the level: `access_us` and `kernel_us` keep
  that ratio and add up to the replays' total. How far each replay is from its kernels' sum is
  the fit's `forward_error`.
- **host**: the median host time of one call through the device: an async copy, a kernel
  launch, an event record, an event query (`poll_us`) and a replay of the reference forward's
  graph (`replay_us`); and of one whole replay's enqueue as the harness makes it, whose ops
  (counted on the simulator) share what the graph launch leaves of it: `launch_us`, the host's
  Python between the calls included.

The same measuring runs on the simulator, where it gives back the simulator's own device costs
(its virtual time): that is how it is tested without a GPU. Fitting is pure (`fit`). The output,
with every point, the check and the environment, is `harness/records/sim_costs.json`, where
`SimCosts` takes its defaults from.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy.optimize import nnls

from harness.devices.base import Device, Graph
from harness.records.device_settings import SimCosts
from harness.records.scenario import Backend, Expect, ModelShape, Request, Scenario

COPY_SIZES = (512, 4 << 10, 32 << 10, 256 << 10, 2 << 20, 16 << 20)  # bytes
SPIN_US = 5000.0  # the spin ahead of a measured run: longer than the host takes to enqueue it


@dataclass(frozen=True)
class Shape:
    name: str
    scenario: Scenario


def _shape(name: str, layers: str, requests: tuple[Request, ...]) -> Shape:
    # The scenario sets' small model (hidden 256, GQA 4/2 x 64, state 16, bf16), unfenced, no fault:
    # what the simulator runs most.
    model = ModelShape(layers=layers, hidden=256, heads=4, kv_heads=2, head_dim=64, state=16)
    return Shape(name, Scenario(name, model, requests, Backend.FULL, Expect.RACE, fence="none"))


DEFAULT_BATCH = (Request(256, 32), Request(128, 16))
# Attention, Mamba and both, at the sets' batch and at a tiny one: the kernels the sets run.
FORWARD_SHAPES = (
    _shape("attention-4", "AAAA", DEFAULT_BATCH),
    _shape("mamba-4", "MMMM", DEFAULT_BATCH),
    _shape("hybrid-4", "AMAM", DEFAULT_BATCH),
    _shape("hybrid-4-tiny", "AMAM", (Request(16, 8),)),
)


@dataclass(frozen=True)
class CopyPoint:
    nbytes: int
    us: float  # device time of one copy, back to back on one stream (median over rounds)


@dataclass(frozen=True)
class KernelPoint:
    shape: str
    what: str  # the kernel, as the model names it
    access: bool  # it reads or writes pool memory
    us: float  # its device time, launched alone behind a spin (median over rounds)


@dataclass(frozen=True)
class ForwardPoint:
    shape: str
    access_ops: int  # kernels of the graph that read or write pool memory
    other_ops: int  # the graph's other kernels
    us: float  # device time of one replay of the graph with no load pending (median)


@dataclass(frozen=True)
class HostPoint:
    what: str  # the call
    us: float  # median host time of one call


@dataclass(frozen=True)
class Fit:
    """The costs, and how far the measured points are from what the costs predict."""

    costs: SimCosts
    copy_residual_us: float  # the largest |measured - predicted| over the copies
    forward_error: float  # the largest |predicted - measured| / measured over the graph replays


def fit_copies(points: Sequence[CopyPoint]) -> tuple[float, float]:
    """(latency in us, bandwidth in GB/s): the least-squares line us = latency + bytes / bandwidth,
    both held at zero or above, each point weighted by its own time (a 16 MB copy's microseconds
    must not drown a 512-byte copy's latency)."""
    if len({p.nbytes for p in points}) < 2:
        raise ValueError("a copy line needs at least two sizes")
    a = np.array([[1.0, float(p.nbytes)] for p in points])
    b = np.array([p.us for p in points])
    w = 1.0 / np.maximum(b, 1e-3)
    (latency, per_byte), _ = nnls(a * w[:, None], b * w)
    if per_byte <= 0:
        raise ValueError("the copy times do not grow with size: no bandwidth to fit")
    return float(latency), float(1.0 / per_byte / 1e3)  # bytes per us -> GB/s


def fit_kernels(kernels: Sequence[KernelPoint], forwards: Sequence[ForwardPoint]) -> tuple[float, float]:
    """(access_us, kernel_us): in the ratio of the mean device time of the pool-touching kernels to
    that of the others, each launched alone, and at the level of the graph replays (a graph runs
    its kernels closer together than launches one by one do): the two costs add up to the replays'
    total time over every forward measured."""
    access = [p.us for p in kernels if p.access]
    other = [p.us for p in kernels if not p.access]
    if not access or not other:
        raise ValueError("the kernel costs need kernels of both kinds")
    mean_access, mean_other = statistics.fmean(access), statistics.fmean(other)
    eager = sum(mean_access * f.access_ops + mean_other * f.other_ops for f in forwards)
    level = sum(f.us for f in forwards) / eager if forwards and eager > 0 else 1.0
    return mean_access * level, mean_other * level


def predicted_forward_us(costs: SimCosts, p: ForwardPoint) -> float:
    """What the simulator charges one replay of the forward: its kernels, back to back."""
    return costs.access_us * p.access_ops + costs.kernel_us * p.other_ops


def fit(copies: Sequence[CopyPoint], kernels: Sequence[KernelPoint], forwards: Sequence[ForwardPoint],
        host: Sequence[HostPoint], enqueues: int) -> Fit:
    """The simulator's costs from the measured points (pure: no device). `enqueues`: the host ops of
    the replay whose enqueue was timed (`enqueues_per_replay`): `launch_us` is the host's time per op
    as the harness enqueues them, its Python between the calls included, which a call timed alone
    leaves out."""
    latency, bandwidth = fit_copies(copies)
    access, other = fit_kernels(kernels, forwards)
    by_what = {h.what: h.us for h in host}
    launch = max(by_what["enqueue"] - by_what["replay"], 0.0) / max(enqueues, 1)
    costs = SimCosts(bandwidth_gbps=round(bandwidth, 2), copy_latency_us=round(latency, 3),
                     launch_us=round(launch, 3), replay_us=round(by_what["replay"], 3),
                     access_us=round(access, 3), kernel_us=round(other, 3), poll_us=round(by_what["query"], 3))
    copy_residual = max(abs(p.us - (costs.copy_latency_us + p.nbytes / (costs.bandwidth_gbps * 1e3)))
                        for p in copies)
    forward_error = max((abs(predicted_forward_us(costs, p) - p.us) / p.us for p in forwards if p.us > 0),
                        default=0.0)
    return Fit(costs, round(copy_residual, 3), round(forward_error, 4))


def calibration_doc(copies: Sequence[CopyPoint], kernels: Sequence[KernelPoint], forwards: Sequence[ForwardPoint],
                    host: Sequence[HostPoint], enqueues: int, environment: dict, command: list[str]) -> dict:
    """What `calibrate` writes: the costs, the points they come from, the check, and the machine."""
    f = fit(copies, kernels, forwards, host, enqueues)
    return {
        "costs": asdict(f.costs),
        "fit": {"copy_residual_us": f.copy_residual_us, "forward_error": f.forward_error},
        "copies": [asdict(p) for p in copies],
        "kernels": [asdict(p) for p in kernels],
        "forwards": [{**asdict(p), "predicted_us": round(predicted_forward_us(f.costs, p), 3)} for p in forwards],
        "host": [asdict(p) for p in host],
        "enqueues_per_replay": enqueues,
        "environment": environment,
        "command": command,
    }


# ---- measuring, through a device -----------------------------------------------------------------
def _full_graph(arm) -> Graph:
    from harness.model.runners import FullGraphRunner

    runner = arm.replay.runner
    if not isinstance(runner, FullGraphRunner):
        raise ValueError("the calibration's forwards are full graphs")
    return runner.graph


def _timed_back_to_back(dev: Device, stream, calls: Sequence[Callable[[], object]], rounds: int) -> list[float]:
    """Each call's device time (us), median over `rounds`: the calls enqueued back to back between
    markers, behind a spin, so that the device never waits for the host."""
    samples: list[list[float]] = [[] for _ in calls]
    with dev.stream(stream):
        for _ in range(rounds + 1):  # the first warms up
            dev.delay(SPIN_US)
            marks = [dev.mark(stream)]
            for call in calls:
                call()
                marks.append(dev.mark(stream))
            dev.synchronize()
            us = [dev.marker_us(m) for m in marks]
            for i in range(len(calls)):
                a, b = us[i], us[i + 1]
                if a is not None and b is not None:
                    samples[i].append(b - a)
    return [statistics.median(s[1:] or s) for s in samples]


def measure_copies(dev: Device, sizes: Sequence[int] = COPY_SIZES, rounds: int = 7) -> list[CopyPoint]:
    import torch

    from harness.records.trace import Region

    stream = dev.Stream("calibration")
    points = []
    for nbytes in sizes:
        count = max(4, min(32, (64 << 20) // nbytes))
        src = dev.empty_host((nbytes,), torch.uint8)
        src.fill_(1)
        dst = torch.empty(nbytes, dtype=torch.uint8, device=dev.torch_device)
        region = Region("calibration", 0, 0, nbytes)
        def copy(dst=dst, src=src, region=region) -> None:
            dev.copy_async(dst, src, region)

        each = _timed_back_to_back(dev, stream, [copy] * count, rounds)
        # The copies after the first: the first may start while the spin's end is still draining.
        points.append(CopyPoint(nbytes, round(statistics.median(each[1:]), 4)))
    return points


def measure_kernels(dev: Device, shapes: Sequence[Shape] = FORWARD_SHAPES, rounds: int = 7,
                    timeout_s: float = 30.0) -> list[KernelPoint]:
    from harness.records.trace import Kernel
    from harness.studies.fence_cost import Arm

    points = []
    for shape in shapes:
        arm = Arm(dev, shape.scenario, timeout_s)
        kernels = [op for op in _full_graph(arm).body if isinstance(op, Kernel)]
        calls = [(lambda k=k: dev.launch(k.fn, k.reads, k.writes, k.what)) for k in kernels]
        times = _timed_back_to_back(dev, arm.forward, calls, rounds)
        points += [KernelPoint(shape.name, k.what, k.touches_pools, round(us, 4))
                   for k, us in zip(kernels, times, strict=True)]
    return points


def measure_forwards(dev: Device, shapes: Sequence[Shape] = FORWARD_SHAPES, repeats: int = 200,
                     timeout_s: float = 30.0) -> list[ForwardPoint]:
    """Each shape's full-graph forward with no load pending: the device time of its replay, as the
    fence benchmark times its compute bound (`fence_cost.Arm`)."""
    from harness.records.trace import Kernel
    from harness.studies.fence_cost import Arm

    points = []
    for shape in shapes:
        arm = Arm(dev, shape.scenario, timeout_s)
        kernels = [op for op in _full_graph(arm).body if isinstance(op, Kernel)]
        access = sum(1 for k in kernels if k.touches_pools)
        times = [arm.time(load=False)[0] for _ in range(repeats + 10)][10:]  # the first ten warm up
        points.append(ForwardPoint(shape.name, access, len(kernels) - access, round(statistics.median(times), 3)))
    return points


def _median_host_us(call: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        call()
        samples.append((time.perf_counter_ns() - t0) / 1e3)
    return statistics.median(samples)


def measure_host(dev: Device, shape: Shape = FORWARD_SHAPES[2], repeats: int = 25) -> list[HostPoint]:
    """The host's time per call through the device (wall-clock time: on the simulator it measures
    Python, not the model's virtual host time)."""
    import torch

    from harness.records.trace import Region
    from harness.studies.fence_cost import Arm

    src = dev.empty_host((1024,), torch.float32)
    dst = torch.empty(1024, dtype=torch.float32, device=dev.torch_device)
    region = Region("calibration", 0, 0, 1024)
    x = torch.zeros(1024, device=dev.torch_device)
    event = dev.Event()
    stream = dev.Stream("calibration-host")
    calls: dict[str, Callable[[], object]] = {
        "copy": lambda: dev.copy_async(dst, src, region),
        "kernel": lambda: dev.launch(lambda: x.add_(1.0), writes=(region,)),
        "record": lambda: event.record(),
    }
    arm = Arm(dev, shape.scenario, 30.0)
    graph = _full_graph(arm)
    points = [HostPoint("enqueue", round(_enqueue_us(dev, arm), 3))]
    for what, call in calls.items():
        with dev.stream(stream):
            points.append(HostPoint(what, round(_rounds(dev, call, repeats), 3)))
    event.record(stream)
    dev.synchronize()
    points.append(HostPoint("query", round(_rounds(dev, event.query, repeats), 3)))
    with dev.stream(arm.forward):
        points.append(HostPoint("replay", round(_rounds(dev, graph.replay, repeats), 3)))
    return points


def _enqueue_us(dev: Device, arm, rounds: int = 50) -> float:
    """The host time of one whole replay's enqueue as the harness makes it (the load op, the fence,
    the graph launch, the hazard's work): median over rounds, the device drained between them."""
    from harness.records.scenario import Fault

    samples = []
    for i in range(rounds + 5):  # the first five warm up
        t0 = time.perf_counter_ns()
        arm.replay.enqueue(i, Fault())
        samples.append((time.perf_counter_ns() - t0) / 1e3)
        dev.synchronize()
    return statistics.median(samples[5:])


def enqueues_per_replay(shape: Shape = FORWARD_SHAPES[2]) -> int:
    """How many ops one replay of `shape` enqueues from the host (its graph launch apart): counted on
    the simulator, which charges each of them `launch_us` of host time, by running the enqueue that
    `_enqueue_us` times with a launch at 1 us and every other host cost next to nothing."""
    from harness.devices.sim import SimDevice
    from harness.records.scenario import Fault
    from harness.studies.fence_cost import Arm

    dev = SimDevice(SimCosts(launch_us=1.0, replay_us=1e-9, poll_us=1e-9))
    arm = Arm(dev, shape.scenario, 30.0)
    dev.synchronize()
    before = dev.host_clock
    arm.replay.enqueue(0, Fault())
    return round(dev.host_clock - before)


def _rounds(dev: Device, call: Callable[[], object], repeats: int, rounds: int = 9) -> float:
    """The median over rounds of a round's median host time per call; the device drained between
    rounds, so that its queue never fills and blocks the host."""
    out = []
    for _ in range(rounds + 1):  # the first warms up
        out.append(_median_host_us(call, repeats))
        dev.synchronize()
    return statistics.median(out[1:])
