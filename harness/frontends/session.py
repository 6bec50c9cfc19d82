"""A command's scenario loop, and how it stops early: SIGINT, SIGTERM or a lost device.

Every command that runs scenarios (run, mutants, soak, graph-check) goes through `run_scenarios`,
so a stop is handled one way: the scenario in progress is dropped, the finished ones
are kept, and `write_partial` writes them as a partial results.json with one line on
stderr. SIGTERM becomes an interrupt only while a command runs (`signals_interrupt`).
A command that ends normally writes results.json and then `write_report` (summary.md,
report.html) beside it.

Torch and the pipeline are imported when a scenario runs, not with this module: the
command line imports it to handle an interrupt that comes while it is still starting.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from harness.records.errors import DeviceLost, Interrupted
from harness.records.rates import Until
from harness.records.scenario import Scenario

if TYPE_CHECKING:
    from harness.devices.base import Device
    from harness.run.pipeline import ScenarioResult


def interrupt_signal(e: KeyboardInterrupt) -> signal.Signals:
    """The signal behind an interrupt; a plain KeyboardInterrupt is Ctrl-C."""
    return signal.Signals(getattr(e, "signum", signal.SIGINT))


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """SIGINT and SIGTERM raise `Interrupted` while the command runs, and only then.

    The caller's handlers come back afterwards (main() also runs in-process, under
    pytest). A signal ignored on entry (a background job of a script) stays ignored.
    Python can only install handlers from the main thread.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise Interrupted(signum)

    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            previous[sig] = signal.signal(sig, interrupt)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, signal.SIG_DFL if old is None else old)


def _is_device_error(e: BaseException) -> bool:
    import torch  # loaded by then: the scenario that raised ran on it

    if isinstance(e, torch.OutOfMemoryError):
        return False  # one scenario's problem: run_scenario records it and the run goes on
    accelerator = getattr(torch, "AcceleratorError", ())
    return isinstance(e, accelerator) or (isinstance(e, RuntimeError) and "CUDA error" in str(e))


def run_one(s: Scenario, dev: Device, replays: int | None, timeout_s: float,
            until: Until | None = None, counted: bool = True) -> ScenarioResult:
    """run_scenario, with a lost device raised as DeviceLost (carrying the scenario's error)."""
    from harness.run.pipeline import ScenarioResult, run_scenario

    t0 = time.perf_counter()
    try:
        return run_scenario(s, dev, replays=replays, timeout_s=timeout_s, until=until, counted=counted)
    except RuntimeError as e:
        if not _is_device_error(e):
            raise
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        r = ScenarioResult(s, error=f"device lost: {first}", wall_s=time.perf_counter() - t0)
        raise DeviceLost(f"{s.name}: {r.error}", r) from None


@dataclass(frozen=True)
class Stop:
    """Why a command's loop ended early."""

    why: str  # "SIGINT", "SIGTERM" or "device-lost"
    exit_code: int
    reason: str  # for the one stderr line


def run_scenarios(
    scenarios: Iterable[Scenario],
    device: Callable[[], Device],
    replays: int | None,
    timeout_s: float,
    done: Callable[[ScenarioResult], None],
    begin: Callable[[], None] = lambda: None,
    until: Until | None = None,
    counted: bool = True,
) -> Stop | None:
    """`begin()`, then each scenario on `device()`, calling `done(result)` after each; how the
    loop stopped early, or None. `until`: run --until-confidence's stopping rule, or None.
    `counted=False`: each scenario stops after its graph check (`run_scenario`), as graph-check does.

    An interrupt (from `begin` on: once it has printed, a run has started) drops the
    scenario in progress; a lost device ends the loop after its scenario, which `done`
    gets as an error. So whatever `begin` prints is the mark that a stop from then on
    is this loop's, ending in `write_partial`'s line ("no scenario finished" at worst).
    """
    try:
        begin()
        for s in scenarios:
            try:
                r = run_one(s, device(), replays, timeout_s, until, counted)
            except DeviceLost as e:
                from harness.run.pipeline import ScenarioResult

                assert isinstance(e.result, ScenarioResult)
                done(e.result)
                return Stop("device-lost", e.exit_code, str(e))
            done(r)
    except KeyboardInterrupt as e:
        sig = interrupt_signal(e)
        return Stop(sig.name, 128 + sig, f"interrupted ({sig.name})")
    return None


def write_partial(stop: Stop, results: list[ScenarioResult], device: dict, out: Path, started: float,
                  sections: dict, finished: int, total: int | None = None) -> int:
    """A run cut short: what finished as a partial results.json, one stderr line; the exit code.

    `results` are the scenario entries to keep, `sections` the command's own parts
    (`not_run`, the kill matrix, the soak's counts), `finished` how many scenarios ran
    to the end (of `total`, when the command knew it). With nothing finished nothing is
    written, so the previous results.json stays as it was; otherwise the new one
    replaces it whole (atomically), with summary.md beside it (what CI shows of a job);
    report.html is not rebuilt here (`fence-harness report` makes it from the file): a run
    being stopped should stop soon.
    """
    from harness.report.results import build_results, write_results

    if finished:
        doc = build_results(results, device, started, time.time(),
                            {**sections, "partial": True, "interrupted": stop.why})
        path = write_results(out, doc)
        _partial_summary(doc, out)
        of = f"{finished}/{total}" if total is not None else f"{finished}"
        kept = f"partial results of {of} scenarios: {path}"
    else:
        kept = f"no scenario finished; {out / 'results.json'} left as it was"
    print(f"fence-harness: {stop.reason}; {kept}", file=sys.stderr)
    return stop.exit_code


def _partial_summary(doc: dict, out: Path) -> None:
    from harness.frontends.report_commands import append_step_summary
    from harness.report.summary import write_summary

    try:
        append_step_summary(write_summary(doc, out / "summary.md"))
    except Exception as e:  # noqa: BLE001 - results.json is written; the summary is a view of it
        print(f"fence-harness: warning: summary.md not written: {e}", file=sys.stderr)


def write_report(doc: dict, out: Path) -> None:
    """summary.md and report.html next to results.json; a failure here never loses the results."""
    from harness.frontends.report_commands import append_step_summary, write_all

    try:
        write_all(doc, out)
        append_step_summary(out / "summary.md")
    except Exception as e:  # noqa: BLE001 - results.json is written; the report is a view of it
        print(f"fence-harness: warning: report not written: {e}", file=sys.stderr)
