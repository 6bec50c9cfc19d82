"""The pressure fault: contention from outside the scenario, as production has it.

A serving GPU is never quiet: other workers' GEMMs keep its SMs busy, and other transfers
(write-backs, other load-backs, another tenant's uploads) share the PCIe lanes and copy
engines with the load-back. On a quiet H200 an unfenced full graph at 2,048 cached tokens
read nothing stale in 300 replays: its copies land first. With a second process on the GPU
running bf16 GEMMs and 256 MiB pinned host-to-device copies, 261 of 300 replays read stale.

`Workload` is the contention itself: bf16 GEMMs issued back to back on `gemm_streams`
streams, and pinned copies of `copy_mib` MiB issued back to back, each direction on a stream
of its own; every stream keeps at most DEPTH items in flight, so the device stays busy and
the queue never grows. It runs

- in another process (`process = "separate"`, the default): `python -m harness pressure-workload`
  (a hidden command that runs `serve`), a second CUDA context on the same GPU, time-sliced
  with the harness's as another tenant's would be. It says "ready" once each of its streams
  has finished one item, and stops on end-of-file on its stdin, SIGTERM, or its parent's
  death (PR_SET_PDEATHSIG on Linux; the stdin pipe closes with the parent anywhere), then
  prints what it achieved as one JSON line.
  `OtherProcess` starts it, waits for "ready" with a timeout, and stops it: end-of-file, then
  SIGTERM, then SIGKILL, each after a grace period, so no child outlives its scenario;
- or in threads of the harness's own process (`process = "same"`, `InProcess`): its streams
  share the harness's CUDA context, as a serving engine's own background work does. Started
  only once every graph is captured (a capture in progress forbids other threads' CUDA calls).

On the simulator there is no other work to contend with: `contention` gives a handle that
does nothing and says so (`fault_mode`, and `pressure.mode = "none"` in results.json).
A correct fence must be clean under any of it; the unfenced graph shows what contention
does to the race window.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import torch

from harness.faults.registry import fault_strategy
from harness.records.errors import PressureError
from harness.records.plain import as_plain
from harness.records.scenario import CopyDirection, Fault, Pressure, PressureProcess

DEPTH = 2  # items in flight per stream: enough to keep it busy, little for a device sync to drain
START_TIMEOUT_S = 60.0  # a process that is not ready by then (torch import, CUDA start) is stuck
STOP_GRACE_S = 10.0  # after end-of-file, and again after SIGTERM, before the next, harder, step
READY = "ready"
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # where `harness` imports from
_PR_SET_PDEATHSIG = 1


@dataclass
class Achieved:
    """What the contention did while it ran."""

    seconds: float = 0.0
    gemms: int = 0
    copies: int = 0
    gemm_tflops: float = 0.0  # bf16 TFLOP/s over the whole time, all GEMM streams together
    copy_gbps: float = 0.0  # GB/s copied, all directions together


# ---------------------------------------------------------------- the contention itself


class Workload:
    """GEMMs and pinned copies on streams of their own, each stream fed by its own thread.

    `device` is a CUDA device; a CPU device runs the same loops on plain tensors with no
    streams (what the tests of the process's life cycle run where there is no GPU).
    """

    def __init__(self, spec: Pressure, device: torch.device):
        self.spec, self.device = spec, device
        self.cuda = device.type == "cuda"
        self._stop = threading.Event()
        self._started = threading.Barrier(len(self._jobs()) + 1)
        self._threads: list[threading.Thread] = []
        self._counts: dict[str, int] = {}
        self._errors: list[BaseException] = []
        self._t0 = 0.0

    def _jobs(self) -> list[tuple[str, Callable[[], Callable[[], object]]]]:
        """(name, build): `build()` allocates a job's tensors and returns one item of its work."""
        jobs: list[tuple[str, Callable[[], Callable[[], object]]]] = []
        if self.spec.gemm:
            jobs += [(f"gemm{i}", self._gemm_item) for i in range(self.spec.gemm_streams)]
        if self.spec.copy_mib:
            if self.spec.copy in (CopyDirection.H2D, CopyDirection.BOTH):
                jobs.append(("h2d", lambda: self._copy_item(to_device=True)))
            if self.spec.copy in (CopyDirection.D2H, CopyDirection.BOTH):
                jobs.append(("d2h", lambda: self._copy_item(to_device=False)))
        return jobs

    def _gemm_item(self) -> Callable[[], object]:
        n = self.spec.gemm
        dtype = torch.bfloat16 if self.cuda else torch.float32  # a CPU's bf16 GEMM is emulated, slowly
        a, b = (torch.randn(n, n, device=self.device).to(dtype) for _ in range(2))
        out = torch.empty(n, n, device=self.device, dtype=dtype)
        return lambda: torch.matmul(a, b, out=out)

    def _copy_item(self, to_device: bool) -> Callable[[], object]:
        count = self.spec.copy_mib * 2**20
        host = torch.empty(count, dtype=torch.uint8, pin_memory=self.cuda)
        dev = torch.empty(count, dtype=torch.uint8, device=self.device)
        if to_device:
            return lambda: dev.copy_(host, non_blocking=True)
        return lambda: host.copy_(dev, non_blocking=True)

    def start(self, timeout_s: float) -> None:
        """Start every stream's thread; return once each has finished one item (raise after `timeout_s`)."""
        for name, build in self._jobs():
            thread = threading.Thread(target=self._run, args=(name, build, timeout_s), daemon=True,
                                      name=f"pressure-{name}")
            thread.start()
            self._threads.append(thread)
        try:
            self._started.wait(timeout_s)
        except threading.BrokenBarrierError:
            self.stop()
            raise PressureError(self._why_not_started(timeout_s)) from None
        self._t0 = time.perf_counter()

    def _why_not_started(self, timeout_s: float) -> str:
        if self._errors:
            e = self._errors[0]
            return f"pressure workload failed to start: {type(e).__name__}: {_first_line(str(e))}"
        return f"pressure workload did not start within {timeout_s:g}s"

    def _run(self, name: str, build: Callable[[], Callable[[], object]], timeout_s: float) -> None:
        try:
            stream = torch.cuda.Stream(self.device) if self.cuda else None
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                item = build()
                item()  # the first item warms up (allocations, the GEMM library): not counted
                self._drain([self._record(stream)])
                self._counts[name] = 0
                self._started.wait(timeout_s)
                pending: deque = deque()
                while not self._stop.is_set():
                    item()
                    if stream is None:
                        time.sleep(0.002)  # a CPU workload (tests) runs synchronously: leave the core some air
                    pending.append(self._record(stream))
                    if len(pending) > DEPTH:
                        self._drain([pending.popleft()])
                        self._counts[name] += 1
                self._drain(pending)
                self._counts[name] += len(pending)
        except threading.BrokenBarrierError:
            pass  # start() gave up on another thread; stop() follows
        except BaseException as e:  # noqa: BLE001 - reported by start() or stop(), never lost
            self._errors.append(e)
            self._started.abort()

    def _record(self, stream: Any) -> Any:
        if stream is None:
            return None
        event = torch.cuda.Event()
        event.record(stream)
        return event

    @staticmethod
    def _drain(events: Iterable[Any]) -> None:
        for event in events:
            if event is not None:
                event.synchronize()  # releases the GIL while it waits

    def stop(self) -> Achieved:
        self._stop.set()
        for thread in self._threads:
            thread.join(STOP_GRACE_S)
        seconds = time.perf_counter() - self._t0 if self._t0 else 0.0
        gemms = sum(n for name, n in self._counts.items() if name.startswith("gemm"))
        copies = sum(n for name, n in self._counts.items() if not name.startswith("gemm"))
        per_gemm = 2 * self.spec.gemm ** 3 / 1e12
        per_copy = self.spec.copy_mib * 2**20 / 1e9
        return Achieved(round(seconds, 3), gemms, copies, _rate(gemms * per_gemm, seconds),
                        _rate(copies * per_copy, seconds))

    @property
    def error(self) -> str | None:
        if not self._errors:
            return None
        e = self._errors[0]
        return f"{type(e).__name__}: {_first_line(str(e))}"


def _rate(amount: float, seconds: float) -> float:
    return float(f"{amount / seconds:.4g}") if seconds else 0.0  # four significant digits, tiny or not


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or ["(no detail)"])[0]


# ---------------------------------------------------------------- handles for one scenario


@dataclass
class Contention:
    """No contention: a fault other than pressure. The base of the handles the pipeline holds.

    `ready(timeout_s)` is called once every graph is captured, before the first replay: it
    returns the fault mode to report (None: nothing to say). `stop()` ends the contention and
    returns results.json's `pressure` record (None: no pressure fault). `failed` says why the
    contention did not last the scenario out, when it did not.
    """

    spec: Pressure | None = None
    failed: str | None = field(default=None, init=False)

    def ready(self, timeout_s: float = START_TIMEOUT_S) -> str | None:
        return None

    def stop(self) -> dict | None:
        return None

    def _record(self, mode: str, achieved: Achieved | None, **more: Any) -> dict:
        return {"mode": mode, "settings": as_plain(self.spec), "achieved": as_plain(achieved) if achieved else None,
                **more}


NO_DEVICE = "none on the simulator: it models no work but the scenario's, so nothing contends (ran quiet)"


@dataclass
class Quiet(Contention):
    """A pressure fault on a device with nothing to contend for (the simulator)."""

    def ready(self, timeout_s: float = START_TIMEOUT_S) -> str | None:
        return f"pressure: {NO_DEVICE}"

    def stop(self) -> dict | None:
        return self._record("none", None, why=NO_DEVICE)


@dataclass
class InProcess(Contention):
    """The workload in threads of this process, on streams of their own."""

    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    _workload: Workload | None = field(default=None, init=False)
    _achieved: Achieved | None = field(default=None, init=False)

    def ready(self, timeout_s: float = START_TIMEOUT_S) -> str | None:
        assert self.spec is not None
        self._workload = Workload(self.spec, self.device)
        self._workload.start(timeout_s)
        return f"pressure (same process: {self.spec.load_text()})"

    def stop(self) -> dict | None:
        if self._workload is not None and self._achieved is None:
            self._achieved = self._workload.stop()
            if self._workload.error:
                self.failed = f"pressure workload failed while the replays ran: {self._workload.error}"
        return self._record("same process", self._achieved)


@dataclass
class OtherProcess(Contention):
    """The workload in a child process, started at once (its start-up overlaps the scenario's)
    and stopped, whatever happens, by `stop()`."""

    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    argv: list[str] | None = None  # the child's command line (tests give their own)
    _proc: subprocess.Popen | None = field(default=None, init=False)
    _stderr: IO[bytes] | None = field(default=None, init=False)
    _out: bytes = field(default=b"", init=False)
    _final: dict | None = field(default=None, init=False)
    _ready: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        assert self.spec is not None
        argv = self.argv or [sys.executable, "-m", "harness", "pressure-workload", "--device", str(self.device),
                             "--spec", json.dumps(as_plain(self.spec)), "--parent", str(os.getpid())]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_ROOT, env.get("PYTHONPATH")]))
        self._stderr = tempfile.TemporaryFile()  # a file, not a pipe: a chatty child cannot block on it
        try:
            self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                          env=env, close_fds=True)
        except OSError as e:
            self._stderr.close()
            raise PressureError(f"pressure process could not be started: {e}") from None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def ready(self, timeout_s: float = START_TIMEOUT_S) -> str | None:
        assert self._proc is not None and self._proc.stdout is not None and self.spec is not None
        deadline = time.monotonic() + timeout_s
        with selectors.DefaultSelector() as sel:
            sel.register(self._proc.stdout, selectors.EVENT_READ)
            while b"\n" not in self._out:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    self._kill()
                    raise PressureError(f"pressure process (pid {self.pid}) was not ready within {timeout_s:g}s"
                                        f"{self._stderr_tail(': ')}")
                chunk = os.read(self._proc.stdout.fileno(), 4096)
                if not chunk:
                    code = self._proc.wait()
                    raise PressureError(f"pressure process exited with code {code} before it was ready"
                                        f"{self._stderr_tail(': ')}")
                self._out += chunk
        line, _, self._out = self._out.partition(b"\n")
        if line.decode(errors="replace").strip() != READY:
            self._kill()
            raise PressureError(f"pressure process said {line[:80]!r} where it should say {READY!r}")
        self._ready = True
        return f"pressure (separate process, pid {self.pid}: {self.spec.load_text()})"

    def stop(self) -> dict | None:
        if self._final is not None or self._proc is None:
            return self._final
        proc = self._proc
        died = proc.poll()  # before we asked: it did not last the scenario out
        if died is not None and died != 0:
            self.failed = f"pressure process (pid {proc.pid}) died with code {died} while the replays ran" \
                          f"{self._stderr_tail(': ')}"
        # communicate() closes the child's stdin first: end-of-file, and a ready child stops and
        # reports; then SIGTERM, then SIGKILL, each after a grace period. One never ready (its
        # scenario ended first) may still be starting: no grace for it, SIGTERM at once.
        steps = (None, proc.terminate, proc.kill) if self._ready else (proc.terminate, proc.kill)
        for step in steps:
            if step is not None:
                step()
            try:
                out, _ = proc.communicate(timeout=STOP_GRACE_S)
                self._out += out or b""
                break
            except subprocess.TimeoutExpired:
                continue
        achieved = _last_json(self._out)
        self._final = self._record("separate process", Achieved(**achieved) if achieved else None,
                                     pid=proc.pid, exit_code=proc.returncode)
        if self._stderr is not None:
            self._stderr.close()
        return self._final

    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def _stderr_tail(self, prefix: str) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        lines = [line for line in self._stderr.read().decode(errors="replace").splitlines() if line.strip()]
        return f"{prefix}{lines[-1].strip()[:300]}" if lines else ""


def _last_json(out: bytes) -> dict | None:
    for line in reversed(out.decode(errors="replace").splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def contention(fault: Fault, device: torch.device) -> Contention:
    """The handle for a scenario's fault on `device`: a process starts here, at once."""
    spec = fault_strategy(fault).pressure(fault)
    if spec is None:
        return Contention()
    if device.type != "cuda":
        return Quiet(spec)
    if spec.process is PressureProcess.SAME:
        return InProcess(spec, device=device)
    return OtherProcess(spec, device=device)


# ---------------------------------------------------------------- the child process


def _die_with_parent(parent: int | None) -> None:
    """Linux: SIGTERM when the parent dies, even by SIGKILL (the stdin pipe's end-of-file covers
    the rest); and if the parent is gone already, stop now."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):
            pass
    if parent is not None and os.getppid() != parent:
        sys.exit(0)


def serve(device_name: str = "cuda", spec_json: str = "{}", parent: int | None = None) -> int:
    """The workload process (`OtherProcess` starts it): the contention of the Pressure record
    `spec_json`, until end-of-file on stdin, SIGTERM, or the death of `parent` (the harness)."""
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches the harness, which stops us
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    raw = json.loads(spec_json)
    spec = Pressure(**{**raw, "copy": CopyDirection(raw.get("copy", "both")),
                       "process": PressureProcess(raw.get("process", "separate"))})
    device = torch.device(device_name)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    workload = Workload(spec, device)
    try:
        workload.start(START_TIMEOUT_S)
    except PressureError as e:
        print(e, file=sys.stderr, flush=True)
        return 1
    print(READY, flush=True)

    def watch_stdin() -> None:
        sys.stdin.buffer.read()  # returns at end-of-file: the parent closed it, or died
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    while not stop.wait(0.5):
        pass
    achieved = workload.stop()
    print(json.dumps(as_plain(achieved)), flush=True)
    if workload.error:
        print(f"pressure workload failed: {workload.error}", file=sys.stderr, flush=True)
        return 1
    return 0

