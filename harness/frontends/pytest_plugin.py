"""pytest plugin: scenario files as test items, fixtures for race tests, results.json.

Loaded by the `fence_harness` pytest11 entry point where the package is
installed, or with `-p harness.frontends.pytest_plugin` where it is only on the path.

    pytest --harness-scenarios scenarios/default.toml [--harness-device sim]
           [--harness-replays N] [--harness-report DIR] [--harness-shard K/N] [-n N]

Every scenario becomes an item `FILE::NAME`, marked `gpu` (CUDA device) or `sim`;
it passes when the scenario meets its expectation. Each setting can also come
from the environment (FENCE_HARNESS_DEVICE, ...) or the ini file (harness_device,
...); the command line wins over the environment, which wins over the ini file.

The engine knows nothing of pytest: this module only calls `run_scenario`,
`open_device` and `results`. Harness modules are imported when first needed,
so a session that does not use the harness does not pay for torch.

PYTEST_DONT_REWRITE: the module holds no asserts, and it may already be imported
when pytest loads it as a plugin.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness.frontends import gpu_workers

ENTRY_POINT = "fence_harness"
PARTS_KEY = "fence_harness_parts"  # workerinput: where a worker writes its part
FINDINGS_SHOWN = 3


# ---------------------------------------------------------------- registration


def pytest_plugin_registered(plugin: Any, manager: pytest.PytestPluginManager) -> None:
    # The entry point and `-p harness.frontends.pytest_plugin` name this one module twice, and
    # pluggy refuses a plugin registered under a second name: the first name blocks the other.
    if plugin is not sys.modules[__name__]:
        return
    name = manager.get_name(plugin)
    other = __name__ if name == ENTRY_POINT else ENTRY_POINT
    if manager.get_plugin(other) is None and not manager.is_blocked(other):
        manager.set_blocked(other)


# ---------------------------------------------------------------- settings


def _device(raw: str) -> str:
    from harness.devices import DEVICE_NAMES

    if raw not in DEVICE_NAMES:
        raise ValueError(f"expected one of {', '.join(DEVICE_NAMES)}")
    return raw


def _replays(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError("expected a positive integer")
    return value


def _paths(raw: str) -> list[str]:
    paths = shlex.split(raw)
    if not paths:
        raise ValueError("expected one or more scenario files")
    return paths


def _shard(raw: str):
    from harness.input.shard import parse_shard

    return parse_shard(raw)  # a ValueError says what is valid


def _path(raw: str) -> str:
    if not raw.strip():
        raise ValueError("expected a folder")
    return raw


@dataclass(frozen=True)
class _Setting:
    name: str  # --harness-NAME, FENCE_HARNESS_NAME, harness_NAME
    parse: Callable[[str], Any]  # raises ValueError with what would be valid
    help: str
    is_path: bool = False  # relative paths: to the invocation folder, or the ini file's

    @property
    def flag(self) -> str:
        return f"--harness-{self.name}"

    @property
    def env(self) -> str:
        return f"FENCE_HARNESS_{self.name.upper()}"

    @property
    def ini(self) -> str:
        return f"harness_{self.name}"


SETTINGS = (
    _Setting("device", _device, "auto (cuda when torch sees one), cuda or sim; default auto"),
    _Setting("replays", _replays, "replays per scenario (default: each scenario's own)"),
    _Setting("scenarios", _paths, "scenario TOML files; each scenario becomes a test item", is_path=True),
    _Setting("mutants", _paths, "kill-matrix TOML files: each scenario becomes a test item that passes when "
             "a mutant is killed or a correct variant is clean; the report gets the kill matrix", is_path=True),
    _Setting("report", _path, "folder for results.json and summary.md (default: reports/ at the rootdir)",
             is_path=True),
    _Setting("shard", _shard, "run only shard K of N of the items (a CI matrix's job K; `fence-harness merge` "
             "combines the shards' results.json): scenario items by a stable hash of the scenario's name, the "
             "same split as `fence-harness run --shard K/N`, every other test by its node id; the rest are "
             "deselected. A shard that holds none of the scenarios given is a usage error: use fewer shards"),
)


@dataclass
class Settings:
    device: str = "auto"
    replays: int | None = None
    scenarios: list[Path] = field(default_factory=list)
    mutants: list[Path] = field(default_factory=list)
    report: Path = Path("reports")
    shard: Any = None  # harness.input.shard.Shard: --harness-shard


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fence-harness", "fence-harness race scenarios")
    for s in SETTINGS:
        extra: dict[str, Any] = {"nargs": "+", "action": "extend"} if s.parse is _paths else {}
        group.addoption(s.flag, dest=s.ini, default=None, metavar="FILE" if extra else s.name.upper(),
                        help=f"{s.help} [env {s.env}, ini {s.ini}]", **extra)
        parser.addini(s.ini, f"{s.help} (--harness-{s.name} and {s.env} override it)", default="")


def _raw_value(config: pytest.Config, s: _Setting, environ: dict[str, str]):
    """(text, how to show it, where it came from, folder relative paths start from), or None."""
    given = config.getoption(s.ini)
    if given is not None:
        text = shlex.join(given) if isinstance(given, list) else given  # a list of files
        return text, f"{s.flag}={text}", "command line", None
    if environ.get(s.env, "") != "":
        return environ[s.env], f"{s.env}={environ[s.env]}", "environment", None
    text = config.getini(s.ini)
    if text != "":
        # An ini file's paths are relative to the ini file, as pytest's own are.
        return text, f"{s.ini}={text}", "ini file", config.inipath.parent if config.inipath else config.rootpath
    return None


def read_settings(config: pytest.Config, environ: dict[str, str]) -> Settings:
    """Each setting from the command line, else the environment, else the ini file, else the default."""
    values: dict[str, Any] = {"report": config.rootpath / "reports"}
    for s in SETTINGS:
        found = _raw_value(config, s, environ)
        if found is None:
            continue
        text, shown, source, base = found
        try:
            value = s.parse(text)
        except ValueError as e:
            raise pytest.UsageError(f"{shown} ({source}): {e}") from None
        if s.is_path and base is not None:
            value = [base / v for v in value] if isinstance(value, list) else base / value
        values[s.name] = value
    settings = Settings(**values)
    settings.scenarios = [Path(p) for p in settings.scenarios]
    settings.mutants = [Path(p) for p in settings.mutants]
    settings.report = Path(settings.report)
    return settings


# ---------------------------------------------------------------- per-session state


@dataclass
class _State:
    settings: Settings
    scenarios: list = field(default_factory=list)  # harness.records.scenario.Scenario, in file order
    files: set[Path] = field(default_factory=set)  # the scenario files, resolved
    matrix_files: set[Path] = field(default_factory=set)  # those of them that are kill-matrix files
    results: dict = field(default_factory=dict)  # name -> ScenarioResult, in run order
    matrix_rows: dict = field(default_factory=dict)  # name -> harness.run.mutants.MatrixRow, kill-matrix items
    skipped: dict = field(default_factory=dict)  # name -> why: scenario items this device does not run
    started: float = field(default_factory=time.time)  # the session's start
    parts_dir: Path | None = None  # controller under xdist: where workers write their parts
    report_path: Path | None = None
    journal: Any = None  # harness.report.journal.Journal of this process, from its first result
    worker_id: str | None = None  # an xdist worker's id ("gw0"); None: the controller
    stopped_by: str | None = None  # "SIGTERM" once the session's SIGTERM handler ran
    _device: Any = None
    _description: dict | None = None

    def record(self, name: str, result) -> None:
        """A scenario item's result: kept for the report, and journaled at once (a session killed
        before it ends writes no report; `fence-harness report DIR` rebuilds one from the journal)."""
        from harness.report import journal
        from harness.report.results import run_environment, scenario_entry

        self.results[name] = result
        if self.journal is None:
            self.journal = journal.Journal(self.settings.report, self.worker_id or "main")
            self.journal.start(run_environment(self.describe()), self.started)
        self.journal.add(scenario_entry(result))

    def device(self):
        if self._device is None:
            from harness.devices import open_device

            self._device = open_device(self.settings.device)
        return self._device

    def describe(self) -> dict:
        if self._description is None:
            self._description = self.device().describe()
        return self._description

    def marker(self) -> str:
        """gpu or sim, the mark of this session's items, without opening the device."""
        from harness.devices import device_kind

        return "gpu" if device_kind(self.settings.device) == "cuda" else "sim"

    def gpu_uuid(self) -> str | None:
        dev = self.device()
        if dev.torch_device.type != "cuda":
            return None
        from harness.devices import nvml

        found = nvml.torch_uuid(dev.torch_device)
        if found:
            return found
        pinned = os.environ.get(gpu_workers.VISIBLE, "")  # an older torch: the worker's pin, if any
        return pinned if pinned.startswith("GPU-") and "," not in pinned else None


_STATE = pytest.StashKey[_State]()


def _state(config: pytest.Config) -> _State:
    return config.stash[_STATE]


def settings(config: pytest.Config) -> Settings:
    """The session's resolved settings (after command line, environment and ini file)."""
    return _state(config).settings


def _sigterm_interrupts(state: _State) -> None:
    """SIGTERM (a CI runner's limit, `timeout`) stops the session as Ctrl-C does: pytest then ends
    it, and this plugin and pytest's JUnit writer still write what finished, marked partial.
    A handler someone else set, or SIGTERM ignored, is left alone."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        from harness.records.errors import Interrupted

        def interrupt(signum: int, frame: object) -> None:
            state.stopped_by = signal.Signals(signum).name
            raise Interrupted(signum)

        signal.signal(signal.SIGTERM, interrupt)


def pytest_load_initial_conftests() -> None:
    # Before any conftest can import and initialise CUDA.
    gpu_workers.pin_worker()


def pytest_configure(config: pytest.Config) -> None:
    gpu_workers.pin_worker()  # again, for a plugin loaded too late for the hook above
    for marker in ("gpu: needs a CUDA device", "sim: runs on the CPU simulator",
                   "slow: takes long; deselect with -m 'not slow'"):
        config.addinivalue_line("markers", marker)
    state = _State(read_settings(config, dict(os.environ)))
    config.stash[_STATE] = state
    paths = state.settings.scenarios + state.settings.mutants
    if not paths:
        return
    workerinput = getattr(config, "workerinput", None)
    state.worker_id = workerinput["workerid"] if workerinput is not None else None
    if workerinput is None:  # the controller, before any worker starts: a new run, a new journal
        from harness.report import journal

        journal.clear(state.settings.report)
    _sigterm_interrupts(state)
    from harness.input.scenario_file import load_files
    from harness.records.errors import InputError

    try:  # one load: a name used in two files is an error, as it is for `fence-harness run`
        state.scenarios = load_files(paths)
        if state.settings.shard is not None:  # a matrix job that would test no scenario must not go green
            from harness.input.shard import select

            select(state.scenarios, state.settings.shard, lambda s: s.name, "--harness-shard")
    except InputError as e:
        raise pytest.UsageError(str(e)) from None
    state.matrix_files = {p.resolve() for p in state.settings.mutants}
    # The files join the collection whatever paths were given, unless already among them.
    given = {Path(a.split("::")[0]).resolve() for a in config.args}
    for path in (p.resolve() for p in paths):
        if path not in given | state.files:
            config.args.append(str(path))
        state.files.add(path)


# ---------------------------------------------------------------- collection


def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    state = parent.config.stash.get(_STATE, None)
    if state and file_path.resolve() in state.files:
        return ScenarioFile.from_parent(parent, path=file_path)
    return None


class ScenarioFile(pytest.File):
    def collect(self):
        state = _state(self.config)
        marker = state.marker()
        for scenario in state.scenarios:
            if Path(scenario.source).resolve() == self.path.resolve():
                item = ScenarioItem.from_parent(self, name=scenario.name, scenario=scenario,
                                                kill_matrix=self.path.resolve() in state.matrix_files)
                item.add_marker(marker)
                yield item


FIXTURES = ("harness_device", "run_harness_scenario", "harness_ground_truth")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Tests built on the fixtures carry the device's marker too, so `-m gpu` on a GPU
    # runner picks them, and a conftest that skips `gpu` tests without CUDA sees it.
    marker = None
    for item in items:
        if set(FIXTURES) & set(getattr(item, "fixturenames", ())):
            marker = marker or _state(config).marker()
            item.add_marker(marker)
    shard = _state(config).settings.shard
    if shard is not None:
        # Every xdist worker of every runner computes the same split: no one hands out the items.
        kept, others = shard.split(items, shard_key)
        if others:
            config.hook.pytest_deselected(items=others)
            items[:] = kept


def shard_key(item: pytest.Item) -> str:
    """What --harness-shard hashes: a scenario's name (as `fence-harness run --shard` does, so the
    two split a set alike), else the test's node id."""
    return item.scenario.name if isinstance(item, ScenarioItem) else item.nodeid


class ScenarioFailed(Exception):
    """A scenario that did not meet its expectation (the result says how)."""

    def __init__(self, result, matrix_outcome: str | None = None):
        super().__init__(result.scenario.name)
        self.result = result
        self.matrix_outcome = matrix_outcome  # a kill-matrix item's outcome: survived, flagged, error


class ScenarioItem(pytest.Item):
    def __init__(self, *, scenario, kill_matrix: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.scenario = scenario
        # A kill-matrix item passes on the matrix's own terms: a mutant caught by stale data
        # or by the happens-before analyser, a correct variant with neither.
        self.kill_matrix = kill_matrix

    def runtest(self) -> None:
        from harness.records.errors import HarnessError
        from harness.run.pipeline import run_scenario

        state = _state(self.config)
        reason = self.scenario.skip_reason("cuda" if state.marker() == "gpu" else "sim")
        if reason:  # serving shapes on the simulator, say: skipped with the reason, never run
            state.skipped[self.scenario.name] = reason
            # At the item's own place (its file and line), as a skip mark's is, not this module's:
            # from a wheel, this module's path would name the installing machine's folders.
            raise pytest.skip.Exception(reason, _use_item_location=True)
        try:
            dev = state.device()
        except HarnessError as e:  # e.g. --harness-device cuda without CUDA: one line, no traceback
            pytest.fail(str(e), pytrace=False)
        result = run_scenario(self.scenario, dev, replays=state.settings.replays)
        state.record(self.scenario.name, result)
        self.user_properties.extend(junit_properties(result, state.describe(), state.gpu_uuid()))
        if self.kill_matrix:
            from harness.run.mutants import classify

            row = state.matrix_rows[self.scenario.name] = classify(result)
            self.user_properties.append(("kill_matrix", row.outcome.value))
            if not row.ok:
                raise ScenarioFailed(result, row.outcome.value)
        elif not result.met:
            raise ScenarioFailed(result)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, ScenarioFailed):
            failed = excinfo.value
            text = verdict(failed.result)
            return f"{text}\n  kill matrix: {failed.matrix_outcome}" if failed.matrix_outcome else text
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        from harness.records.scenario import shown_path

        # The file as a committed report may show it (relative to the working directory): a skip at
        # this item's location names it in the JUnit file, which must name no folder of the host.
        return (shown_path(str(self.path)), _name_line(self.path, self.name),
                f"scenario {self.name}: {self.scenario.describe()}")


@functools.cache
def _file_lines(path: Path) -> tuple[str, ...]:
    return tuple(path.read_text(encoding="utf-8").splitlines())


def _name_line(path: Path, name: str) -> int:
    """The 0-based line of `name = "NAME"` in a scenario file (0 when not found: a name built
    from a template, say), where pytest reports the item."""
    pattern = re.compile(rf"""^\s*name\s*=\s*["']{re.escape(name)}["']""")
    try:
        lines = _file_lines(path)
    except OSError:
        return 0
    return next((i for i, line in enumerate(lines) if pattern.match(line)), 0)


def _layers(result) -> str:
    return ",".join(str(k) for k in sorted(result.tally.layer_counts)) or "-"


def verdict(result) -> str:
    """What a failed scenario item prints: enough to act on without opening results.json."""
    s, t = result.scenario, result.tally
    v = result.verdict if result.verdict is not None else result.seal()
    expected = f"{s.expect.value} ({s.evidence.value})" if s.evidence else s.expect.value
    lines = [
        f"{s.name}: expected {expected}, observed {v.describe()}"
        + (f": {v.shortfall()}" if v.shortfall() and not result.error else ""),
        f"  stale {t.stale_replays}/{t.replays} replays ({t.stale_rate:.1%}), stale layers {_layers(result)}",
        f"  findings {len(result.findings)}",
    ]
    lines += _shown(result.findings)
    if result.graph is not None and (result.graph.graphs or result.graph.findings):  # a graph was replayed
        # The graph check: nodes of the captured graph that nothing orders after a load.
        lines.append(f"  graph findings {len(result.graph.findings)}")
        lines += _shown(result.graph.findings)
    if result.error:
        lines.append(f"  error: {result.error}")
    lines.append(f"  scenario: {s.describe()} ({s.shown_source})")
    return "\n".join(lines)


def _shown(findings) -> list[str]:
    """The first FINDINGS_SHOWN findings as lines of a failure message, and how many more."""
    lines = [f"    - {f.describe()}" for f in findings[:FINDINGS_SHOWN]]
    if len(findings) > FINDINGS_SHOWN:
        lines.append(f"    ... and {len(findings) - FINDINGS_SHOWN} more")
    return lines


def graph_properties(graph) -> list[tuple[str, str]]:
    """The graph check in JUnit: its finding count, whether the op list matched the graph, and the
    first FINDINGS_SHOWN findings (node and kernel, region, missing edge) as `graph_finding_N`."""
    if graph is None:  # the scenario ended before its traced replay
        return [("graph_findings", "none")]
    op_list = (f"not read: {graph.unavailable}" if graph.unavailable and not graph.graphs
               else "matches" if graph.matched else f"mismatch: {graph.mismatches[0]}")
    return [("graph_findings", str(len(graph.findings))), ("graph_op_list", op_list),
            *((f"graph_finding_{i}", f.describe()) for i, f in enumerate(graph.findings[:FINDINGS_SHOWN], 1))]


def junit_properties(result, description: dict, gpu_uuid: str | None) -> list[tuple[str, str]]:
    import torch

    props = {
        "expected": result.scenario.expect.value,
        "observed": result.observed.value if result.observed else "none",
        "evidence": ",".join(e.value for e in result.verdict.evidence) if result.verdict else "",
        "stale_rate": f"{result.tally.stale_rate:.4f}",
        "stale_layers": _layers(result),
        "findings": len(result.findings),
        "device": description.get("device", "?"),
        "gpu": description.get("gpu", "none"),
        "gpu_uuid": gpu_uuid or "none",
        "torch": torch.__version__,
    }
    # Plain str: xdist ships properties to the controller, and it refuses str subclasses
    # such as torch's version string.
    return [(name, str(value)) for name, value in props.items()] + graph_properties(result.graph)


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def harness_device(pytestconfig: pytest.Config):
    """The device the session runs on (--harness-device), opened once."""
    from harness.records.errors import HarnessError

    try:
        return _state(pytestconfig).device()
    except HarnessError as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="session")
def run_harness_scenario(pytestconfig: pytest.Config, harness_device):
    """run(scenario, **kwargs) -> ScenarioResult, with --harness-replays unless kwargs say otherwise."""
    from harness.run.pipeline import run_scenario

    replays = _state(pytestconfig).settings.replays

    def run(scenario, **kwargs):
        kwargs.setdefault("replays", replays)
        return run_scenario(scenario, harness_device, **kwargs)

    return run


@pytest.fixture(scope="session")
def harness_ground_truth(harness_device):
    """build(scenario, timeout_s=30.0) -> (testbed, oracle): the built testbed and its eager ground truth."""
    from harness.run.replay import ground_truth
    from harness.run.testbed import Testbed

    def build(scenario, timeout_s: float = 30.0):
        tb = Testbed(scenario, harness_device)
        return tb, ground_truth(tb, timeout_s)

    return build


@pytest.fixture
def stream_sanitizer():
    """`harness.sanitizer` watching the test (streams, events, graph captures and replays).

    Any unordered pair of accesses fails the test at teardown, with both sides described.
    A test that means to look at the races itself sets `stream_sanitizer.raise_on_race = False`
    and reads `stream_sanitizer.races`.
    """
    from harness.records.errors import SanitizerError
    from harness.sanitizer.session import Sanitizer

    try:
        with Sanitizer(raise_on_race=True) as s:
            yield s
    except SanitizerError as e:  # the races found, or a dispatch mode the test left active
        pytest.fail(str(e), pytrace=False)


def pytest_collection_finish(session: pytest.Session) -> None:
    """torch (and, with CUDA, the GPU, CUDA and driver) as properties of the JUnit test suite.

    Only for a `--junitxml` run that has scenario items or `gpu` tests, so a session
    that does not use the harness never imports torch here. Scenario items are not
    functions (no fixtures), so this writes through pytest's own JUnit writer, as its
    `record_testsuite_property` does. xdist workers cannot add suite properties; their
    items carry the same as test properties.
    """
    from _pytest.junitxml import (
        xml_key,  # pytest's JUnit writer (record_testsuite_property's)
    )

    config = session.config
    xml = config.stash.get(xml_key, None)
    if xml is None or getattr(config, "workerinput", None) is not None:
        return
    if not any(isinstance(i, ScenarioItem) or i.get_closest_marker("gpu") for i in session.items):
        return
    import torch

    xml.add_global_property("torch", torch.__version__)
    if torch.cuda.is_available():
        xml.add_global_property("gpu", torch.cuda.get_device_name())
        xml.add_global_property("cuda", torch.version.cuda or "")
        from harness.devices import nvml

        driver = nvml.driver_version()
        if driver:
            xml.add_global_property("driver", driver)


# ---------------------------------------------------------------- reports


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist controller: tell each worker where to write its part of the results."""
    state = _state(node.config)
    if state.scenarios:
        if state.parts_dir is None:
            state.parts_dir = Path(tempfile.mkdtemp(prefix="fence-harness-parts-"))
        node.workerinput[PARTS_KEY] = str(state.parts_dir)


def _own_part(state: _State) -> dict:
    from harness.report.results import build_results
    from harness.run.mutants import matrix_section

    rows = list(state.matrix_rows.values())
    sections = {**(matrix_section(rows) if rows else {}),
                **({"skipped": [{"name": n, "why": why} for n, why in state.skipped.items()]} if state.skipped else {})}
    return build_results(list(state.results.values()), state.describe(), state.started, time.time(), sections)


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    state = config.stash.get(_STATE, None)
    if state is None:
        return
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:  # an xdist worker: hand the results to the controller
        # A part even from a worker that ran no scenario (only test functions, say): the
        # merged run then names every worker and the GPU it was pinned to.
        if PARTS_KEY in workerinput:
            gpu_workers.write_part(Path(workerinput[PARTS_KEY]), workerinput["workerid"],
                                   state.gpu_uuid(), _own_part(state))
        return
    from harness.report import journal

    interrupted = (state.stopped_by or "SIGINT") if session.exitstatus == pytest.ExitCode.INTERRUPTED else None
    parts = []
    if (state.results or state.skipped) and not interrupted:
        parts.append({**_own_part(state), "worker": "main", "gpu_uuid": state.gpu_uuid()})
    if state.parts_dir is not None:
        parts += gpu_workers.read_parts(state.parts_dir)
        shutil.rmtree(state.parts_dir, ignore_errors=True)
    if interrupted:
        # Workers stopped with the session write no part: every process's journal has what finished.
        doc = journal.rebuild(state.settings.report)
        if doc is None:
            return
        shard = state.settings.shard
        doc.update(interrupted=interrupted, rebuilt_from="journal",
                   not_run=[s.name for s in state.scenarios if s.name not in {e["name"] for e in doc["scenarios"]}
                            and s.name not in state.skipped and (shard is None or shard.holds(s.name))])
    elif not parts:
        return
    else:
        from harness.report.results import command_line

        doc = gpu_workers.merge(parts, order=[s.name for s in state.scenarios], command=command_line())
    if state.settings.shard is not None:
        from harness.report.merge import shard_sections

        doc.update(shard_sections(state.settings.shard, [s.name for s in state.scenarios]))
    from harness.frontends.report_commands import append_step_summary, write_all
    from harness.report.results import write_results

    state.report_path = write_results(state.settings.report, doc)
    journal.clear(state.settings.report)
    try:  # summary.md, report.html and the timelines: a view of results.json, never its loss
        write_all(doc, state.settings.report)
        append_step_summary(state.settings.report / "summary.md")
    except Exception as e:  # noqa: BLE001
        sys.stderr.write(f"fence-harness: warning: report not written: {e}\n")


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    state = config.stash.get(_STATE, None)
    if state is not None and state.report_path is not None:
        terminalreporter.write_sep("-", "fence-harness")
        terminalreporter.write_line(f"results: {state.report_path}")
