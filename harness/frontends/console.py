"""What `fence-harness run` prints while it runs.

On a terminal: a progress bar, one coloured line per finished scenario above it,
and a table at the end. Anywhere else (a pipe, a CI log, a file), or where rich
is not installed (a GPU runner's own Python): plain lines with no colour codes
and no bar, one per scenario, that grep and diff can read.

    console = RunConsole()
    console.start(len(scenarios), dev.name, [s.name for s in scenarios])
    for s in scenarios:
        console.scenario_done(run_scenario(s, dev))
    console.finish(results, path)
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from harness.records.scenario import Scenario
    from harness.run.pipeline import ScenarioResult

NAME_WIDTH = 34  # the plain line's scenario column; a run with a longer name widens it

try:
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TaskID,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.table import Table
except ImportError:
    # None marks rich absent (checked below); mypy cannot type a class that may be None
    Console = None  # type: ignore[assignment, misc]


def _layers(r: ScenarioResult) -> str:
    """Layers read stale; then, after "host", layers whose write-back host copy came out wrong."""
    reads = ",".join(str(k) for k in sorted(r.tally.layer_counts))
    backups = ",".join(str(k) for k in sorted(r.tally.backup_layer_counts))
    return " ".join(part for part in (reads, f"host {backups}" if backups else "") if part) or "-"


def _expected(r: ScenarioResult) -> str:
    s = r.scenario
    return f"{s.expect.value} ({s.evidence.value})" if s.evidence else s.expect.value


def _observed(r: ScenarioResult) -> str:
    """The verdict: 'race (data, analysis)', 'race (analysis)', 'clean'."""
    return r.verdict.describe() if r.verdict else "-"


def rate(replays_per_s: float) -> str:
    """Replays per second: whole numbers from 1 up, a decimal below (a slow GPU scenario is not 0)."""
    if replays_per_s >= 1 or replays_per_s == 0:
        return f"{replays_per_s:.0f}"
    return f"{replays_per_s:.1f}" if replays_per_s >= 0.1 else f"{replays_per_s:.2g}"


def name_width(names: Sequence[str]) -> int:
    """The scenario column of a run's plain lines: wide enough for its longest name."""
    return max([NAME_WIDTH, *(len(n) for n in names)])


def plain_line(r: ScenarioResult, status: str | None = None, width: int = NAME_WIDTH) -> str:
    """One scenario as one fixed-width line; `status` replaces the ok / FAIL column, `width` is
    the scenario column's (`name_width` of the run's names keeps a long name from shifting it)."""
    t = r.tally
    status = status or ("ok  " if r.met else "FAIL")
    name = f"{r.scenario.name:{width}s}"
    if r.error:
        return f"{status} {name} expected {_expected(r):12s}  error: {r.error}"
    if r.not_restored:
        return f"{status} {name} expected {_expected(r):12s}  observed wrong: not restored: {r.not_restored}"
    return (
        f"{status} {name} expected {_expected(r):12s} "
        f"observed {_observed(r):28s} stale {t.stale_replays:>5d}/{t.replays:<5d} "
        f"({t.stale_rate:6.1%}) layers {_layers(r):8s} findings {len(r.findings):3d} "
        f"{rate(r.replays_per_s):>6s} replays/s{_ranks(r)}"
    )


def _ranks(r: ScenarioResult) -> str:
    """A tensor-parallel scenario's cross-rank verdict, after the line ("" on one rank)."""
    return f"  tp {r.tp.tp}: {r.tp.describe()}" if r.tp is not None else ""


def summary_line(results: Sequence[ScenarioResult], report: object = None) -> str:
    met = sum(r.met for r in results)
    where = f"; results: {report}" if report is not None else ""
    return f"{met}/{len(results)} scenarios met their expectation{where}"


def _live_line(r: ScenarioResult, status: str | None) -> str:
    """A shorter, coloured line: a terminal may be narrower than the plain line."""
    style = "green" if r.met else "bold red"
    head = f"[{style}]{escape(status or ('ok' if r.met else 'FAIL'))}[/] [bold]{r.scenario.name}[/]"
    head += f" expected {_expected(r)}"
    if r.error:
        return f"{head} [red]error[/] {escape(r.error)}"
    if r.not_restored:
        return f"{head} observed wrong: not restored: {escape(r.not_restored)}"
    t = r.tally
    return (f"{head} observed {_observed(r)}  stale {t.stale_replays}/{t.replays} "
            f"({t.stale_rate:.1%})  layers {_layers(r)}  findings {len(r.findings)}  "
            f"{rate(r.replays_per_s)} replays/s{escape(_ranks(r))}")


class RunConsole:
    """start(total, device, names) -> scenario_done(result) per scenario -> finish(results, report)."""

    def __init__(self, file: IO[str] | None = None, *, force_terminal: bool | None = None):
        self._file = file  # None: whatever sys.stdout is at each print, so captured output works
        self.console = None if Console is None else Console(
            file=file, force_terminal=force_terminal, highlight=False)
        self.live = self.console is not None and self.console.is_terminal
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._width = NAME_WIDTH

    def _plain(self, text: str) -> None:
        # Straight to the file: rich would wrap long lines at its idea of the width.
        out = self._file or sys.stdout
        out.write(text + "\n")
        out.flush()

    def start(self, total: int, device_name: str, names: Sequence[str] = ()) -> None:
        """`names`: the run's scenarios, so that every plain line has the same columns."""
        self._width = name_width(names)
        if not self.live:
            self._plain(f"device: {device_name}  scenarios: {total}")
            return
        assert self.console is not None  # live: rich is here
        self.console.print(f"[bold]device[/] {escape(device_name)}  [bold]scenarios[/] {total}")
        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=self.console, transient=True,  # the table replaces the bar at the end
        )
        self._task = self._progress.add_task("scenarios", total=total)
        self._progress.start()

    def scenario_done(self, r: ScenarioResult, status: str | None = None) -> None:
        if not self.live:
            self._plain(plain_line(r, status, self._width))
            return
        assert self.console is not None and self._progress is not None and self._task is not None  # start() ran
        # On the progress bar's console, so the line lands above the bar.
        self.console.print(_live_line(r, status and status.strip()))
        self._progress.update(self._task, advance=1, description=r.scenario.name)

    def note(self, text: str) -> None:
        """A remark on the scenario just done (how a fault was injected, say)."""
        self._say(f"     [dim]note: {escape(text)}[/]", f"     note: {text}")

    def skipped(self, text: str) -> None:
        """Scenarios of the run that this device does not run (their `devices` leave it out)."""
        self._say(f"[yellow]skipped[/] {escape(text)}", f"skipped {text}")

    def _say(self, markup: str, plain: str) -> None:
        if self.live:
            assert self.console is not None
            self.console.print(markup)
        else:
            self._plain(plain)

    def stop(self) -> None:
        """End the progress bar (finish does it; a command with its own summary calls it)."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def finish(self, results: Sequence[ScenarioResult], report: object = None) -> None:
        self.stop()
        if not self.live:
            self._plain(summary_line(results, report))
            return
        assert self.console is not None
        self.console.print(results_table(results))
        for r in results:
            if r.error:
                self.console.print(f"[bold red]error[/] {r.scenario.name}: {escape(r.error)}")
        style = "green" if all(r.met for r in results) else "bold red"
        self.console.print(f"[{style}]{escape(summary_line(results, report))}[/]")


def results_table(results: Sequence[ScenarioResult]):
    # No cell padding: the box's own column gap is one space, so 80 columns hold every column.
    table = Table(title="fence-harness", box=box.SIMPLE_HEAD, padding=0, show_edge=False)
    longest = max((len(r.scenario.name) for r in results), default=8)
    table.add_column("scenario", no_wrap=True, min_width=longest)  # names are what people grep for
    for name in ("expected", "observed"):
        table.add_column(name, no_wrap=True)
    table.add_column("stale", justify="right", no_wrap=True)
    table.add_column("layers", overflow="fold", min_width=6)  # the one column that may wrap
    for name in ("findings", "replays/s"):
        table.add_column(name, justify="right", no_wrap=True)
    for r in results:
        t = r.tally
        # The evidence is the stale and findings columns: the word alone keeps 80 columns.
        observed = "[red]error[/]" if r.error else (r.observed.value if r.observed else "-")
        table.add_row(
            f"[{'green' if r.met else 'bold red'}]{r.scenario.name}[/]",
            _expected(r),
            observed,
            f"{t.stale_replays}/{t.replays} {t.stale_rate:.0%}",
            _layers(r),
            str(len(r.findings)),
            rate(r.replays_per_s),
        )
    return table


def skip_lines(skipped: list[Scenario], device: str) -> list[str]:
    """The scenarios a device skips, one line per file and device list: "12 of scenarios/natural.toml:
    they run only on cuda (devices = ["cuda"]), not on sim"."""
    groups: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for s in skipped:
        groups.setdefault((s.shown_source, s.devices or ()), []).append(s.name)
    lines = []
    for (source, devices), names in groups.items():
        listed = ", ".join(f'"{d}"' for d in devices)
        lines.append(f"{len(names)} of {source}: they run only on {' / '.join(devices)} "
                     f"(devices = [{listed}]), not on {device}")
    return lines
