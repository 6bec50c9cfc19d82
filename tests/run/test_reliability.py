"""Reliability: bad input stops before anything runs, and a run that hangs, runs out of
memory, is interrupted or loses its device still ends in results, an exit code and a
results.json that is whole (the old one or a complete new one)."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

import pytest
import torch

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from harness.devices.sim import SimDevice
from harness.frontends import cli
from harness.frontends.cli import main
from harness.input.scenario_file import load_files
from harness.records.errors import InputError, ReplayTimeout
from harness.run import pipeline, replay, testbed
from tests.support.paths import ROOT

BAD = ROOT / "tests" / "data" / "bad_scenarios"
EXPECTED = tomllib.loads((BAD / "EXPECTED.toml").read_text(encoding="utf-8"))
BAD_FILES = sorted(p.name for p in BAD.glob("*.toml") if p.name != "EXPECTED.toml")
ACROSS = BAD / "across_files"
ACROSS_EXPECTED = tomllib.loads((ACROSS / "EXPECTED.toml").read_text(encoding="utf-8"))
OLD_REPORT = '{"schema_version": 1, "note": "the previous run"}\n'

MODEL = """
[models.tiny]
layers = "AM"
hidden = 32
heads = 2
kv_heads = 1
head_dim = 16
state = 4
dtype = "fp32"

[defaults]
model = "tiny"
batch = [{ prefix = 20, new = 4 }]
replays = 2
backend = "full"
fence = "final_event"
fault = { kind = "gate" }
expect = "clean"
"""


def scenario_file(tmp_path: Path, *names: str, extra: dict[str, str] | None = None) -> Path:
    """A file of tiny fenced scenarios with these names; `extra` adds lines to one of them."""
    extra = extra or {}
    tables = "".join(f'\n[[scenario]]\nname = "{n}"\n{extra.get(n, "")}\n' for n in names)
    path = tmp_path / "scenarios.toml"
    path.write_text(MODEL + tables)
    return path


def results(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())


def one_stderr_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ---------------------------------------------------------------- bad input, process by process

# Each run is its own process, started as `python -m harness run FILE --device sim --out DIR`
# starts: the harness's __main__ with that argv, its exit status, its stderr. One
# interpreter imports the harness once and forks a child per run, because a fresh
# interpreter per file would import torch every time (about a second apiece).
DRIVER = r"""
import json, os, runpy, sys, traceback
# Imported once, before the forks: the command line itself imports no torch (its parser must be
# fast), so the modules a run needs are loaded here for every child to share.
import harness.devices.sim, harness.frontends.cli, harness.run.pipeline  # noqa: F401, E401

def run(argv, log):
    pid = os.fork()
    if pid == 0:
        os.dup2(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 2)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        sys.argv = ["harness", *argv]
        code = 0
        try:
            runpy.run_module("harness", run_name="__main__", alter_sys=True)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:  # what the interpreter does with an uncaught exception
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

for job in json.loads(sys.stdin.read()):
    print(run(job["argv"], job["log"]), flush=True)
"""


def run_each_in_a_process(jobs: list[dict]) -> list[int]:
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER], input=json.dumps(jobs), capture_output=True, text=True,
        cwd=ROOT, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    return [int(x) for x in proc.stdout.split()]


def test_every_bad_file_exits_2_with_one_line_and_leaves_the_report_alone(tmp_path):
    cases = []  # (file named in the message, key, out dir, stderr log, was there a report)
    inputs = [([BAD / name], name, EXPECTED[name]["key"]) for name in BAD_FILES]
    inputs += [([ACROSS / f for f in want["files"]], want["source"], want["key"])
               for want in ACROSS_EXPECTED.values()]
    jobs = []
    for n, (files, named, key) in enumerate(inputs):
        for had_report in (False, True):
            out = tmp_path / f"out{n}-{had_report}"
            if had_report:
                out.mkdir()
                (out / "results.json").write_text(OLD_REPORT)
            log = tmp_path / f"err{n}-{had_report}.txt"
            argv = ["run", *map(str, files), "--device", "sim", "--out", str(out)]
            jobs.append({"argv": argv, "log": str(log)})
            cases.append((named, key, out, log, had_report))

    codes = run_each_in_a_process(jobs)

    assert len(codes) == len(cases)
    problems = []
    for (named, key, out, log, had_report), code in zip(cases, codes, strict=False):
        err = log.read_text()
        lines = err.strip().splitlines()
        if code != 2 or len(lines) != 1 or "Traceback" in err:
            problems.append(f"{named}: exit {code}, stderr {err!r}")
        elif (f"{named}: {key}: " if key else f"{named}: ") not in lines[0]:
            problems.append(f"{named}: the line does not name the file and {key!r}: {lines[0]!r}")
        left = sorted(p.name for p in out.iterdir()) if out.exists() else []
        if had_report and (left != ["results.json"] or (out / "results.json").read_text() != OLD_REPORT):
            problems.append(f"{named}: the previous report changed: {left}")
        if not had_report and left:
            problems.append(f"{named}: wrote {left}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", sorted(ACROSS_EXPECTED))
def test_files_fine_alone_fail_together(name):
    want = ACROSS_EXPECTED[name]
    files = [ACROSS / f for f in want["files"]]
    for f in files:
        assert load_files([f])  # each one alone loads
    with pytest.raises(InputError) as info:
        load_files(files)
    err = info.value
    assert Path(err.source) == ACROSS / want["source"]
    assert err.key == want["key"] and want["message"] in err.message
    assert "\n" not in str(err)


def test_a_bad_file_in_a_fresh_interpreter_is_the_same_one_line(tmp_path):
    # The process-per-file test above forks one interpreter; this one starts a new one.
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "run", str(BAD / "plugin_no_such_module.toml"),
         "--device", "sim", "--out", str(out)],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )
    assert proc.returncode == 2
    line = one_stderr_line(proc.stderr)
    assert "plugin_no_such_module.toml: scenario[0].fence: cannot import 'no_such_pkg.mod'" in line
    assert not out.exists()


# ---------------------------------------------------------------- hangs

def test_a_stuck_gate_is_that_scenarios_error_and_the_run_goes_on(tmp_path, stuck_gate, capsys):
    stuck = f'fence = "none"\nschedule = "{stuck_gate}"\nexpect = "race"'
    path = scenario_file(tmp_path, "stuck", "normal", extra={"stuck": stuck})
    out = tmp_path / "out"
    assert main(["run", str(path), "--device", "sim", "--out", str(out), "--timeout", "2"]) == 1
    first, second = results(out)["scenarios"]
    assert first["name"] == "stuck" and first["error"].startswith("gate-timeout in replay")
    assert second["name"] == "normal" and second["met"] and second["error"] is None
    assert "error: gate-timeout" in capsys.readouterr().out


@pytest.mark.parametrize("fence, says", [
    ("value_never_written", r"stream 'forward' waits until flag f\d+ >= 5, which nothing can release: "
                            r"f\d+ holds 0, and no write of it queued on any stream reaches 5$"),
    ("record_behind_it", r"stream 'forward' waits on event e\d+, whose record is queued on stream 'load' "
                         r"behind a wait until flag f\d+ >= 5, which nothing can release: f\d+ holds 0, "
                         r"and no write of it queued on any stream reaches 5$"),
])
def test_work_that_can_never_run_is_that_scenarios_error_naming_its_wait_and_the_run_goes_on(
        tmp_path, monkeypatch, fence, says):
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "plugins"))
    path = scenario_file(tmp_path, "stuck", "normal", "after",
                         extra={"stuck": f'fence = "never_released:{fence}"'})
    out = tmp_path / "out"
    assert main(["run", str(path), "--device", "sim", "--out", str(out)]) == 1
    stuck, normal, after = results(out)["scenarios"]
    assert stuck["error"].startswith("work on the simulator can never run: "), stuck["error"]
    assert re.search(says, stuck["error"]), stuck["error"]
    assert "\n" not in stuck["error"]
    assert normal["met"] and normal["error"] is None
    assert after["met"] and after["error"] is None


def test_work_left_stuck_by_a_scenario_that_failed_otherwise_does_not_reach_the_next(tmp_path, monkeypatch):
    # The stuck scenario's host wait times out (its own error) with the wait still queued: the
    # next scenario's synchronizes must not meet it.
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "plugins"))
    path = scenario_file(tmp_path, "stuck", "normal",
                         extra={"stuck": 'fence = "never_released:host_waits_behind_it"'})
    out = tmp_path / "out"
    assert main(["run", str(path), "--device", "sim", "--out", str(out), "--timeout", "2"]) == 1
    stuck, normal = results(out)["scenarios"]
    assert stuck["error"] == "a fence's host wait did not finish within 2s"
    assert normal["met"] and normal["error"] is None, normal["error"]


def test_a_hung_replay_is_that_scenarios_error_and_the_run_goes_on(tmp_path, monkeypatch):
    replaying = []  # the scenario whose replay is running

    def call(self, i, fault, _call=replay.Replayer.__call__):
        replaying.append(self.tb.scenario.name)
        try:
            return _call(self, i, fault)
        finally:
            replaying.pop()

    def synchronize(self, timeout_s=30.0, _sync=SimDevice.synchronize):
        if replaying == ["hung"]:  # what CudaDevice.synchronize raises past its deadline
            raise ReplayTimeout(f"device work did not finish within {timeout_s:g}s (a hung replay)")
        return _sync(self, timeout_s)

    monkeypatch.setattr(replay.Replayer, "__call__", call)
    monkeypatch.setattr(SimDevice, "synchronize", synchronize)
    out = tmp_path / "out"
    path = scenario_file(tmp_path, "hung", "after")
    assert main(["run", str(path), "--device", "sim", "--out", str(out)]) == 1
    hung, after = results(out)["scenarios"]
    assert hung["error"] == "device work did not finish within 30s (a hung replay)"
    assert after["met"]


# ---------------------------------------------------------------- out of memory

OOM_SEED = 666  # the scenario whose model does not fit


@pytest.fixture
def oom(monkeypatch) -> list:
    """Building the testbed runs out of memory building the model of the scenario with OOM_SEED,
    after its pools were allocated; the list gets a weak reference to one of them."""
    pools = []

    def model(dev, layout, pool, seed, *rest, _model=testbed.HybridModel):
        if seed == OOM_SEED:
            pools.append(weakref.ref(pool.kv.k))
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0)")
        return _model(dev, layout, pool, seed, *rest)

    monkeypatch.setattr(testbed, "HybridModel", model)
    return pools


def test_out_of_memory_is_that_scenarios_error_and_the_others_run(tmp_path, oom, capsys):
    path = scenario_file(tmp_path, "before", "too-big", "after", extra={"too-big": f"seed = {OOM_SEED}"})
    out = tmp_path / "out"
    assert main(["run", str(path), "--device", "sim", "--out", str(out)]) == 1
    before, too_big, after = results(out)["scenarios"]
    assert too_big["error"] == "out of device memory: CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0)"
    assert before["met"] and after["met"]
    assert "1 scenarios met" not in capsys.readouterr().out


def test_out_of_memory_gives_the_memory_back(tmp_path, oom, monkeypatch):
    path = scenario_file(tmp_path, "too-big", extra={"too-big": f"seed = {OOM_SEED}"})
    emptied = []
    # As on a GPU: CUDA is initialised, and its cache is handed back after the error.
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(oom[0]() is None))
    r = pipeline.run_scenario(load_files([path])[0], SimDevice())
    assert r.error.startswith("out of device memory: ")
    assert emptied == [True]  # the pool was freed before the cache was emptied


# ---------------------------------------------------------------- interrupts

LONG = "replays = 1000000"  # far longer than any test waits


def start(path: Path, out: Path) -> tuple[subprocess.Popen, queue.Queue]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "run", str(path), "--device", "sim", "--out", str(out)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # Ctrl-C as from a terminal, whatever the test runner left SIGINT as.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    lines: queue.Queue = queue.Queue()  # read on a thread: a pipe read must not block the test
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    return proc, lines


def wait_for_line(proc: subprocess.Popen, lines: queue.Queue, text: str) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if text in lines.get(timeout=1):
                return
        except queue.Empty:
            assert proc.poll() is None, proc.stderr.read()
    raise AssertionError(f"no line with {text!r} within 120s")


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupt_keeps_the_finished_scenarios_as_a_partial_report(tmp_path, sig, code):
    path = scenario_file(tmp_path, "first", "long", "third", extra={"long": LONG})
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text(OLD_REPORT)
    proc, lines = start(path, out)
    wait_for_line(proc, lines, "first")  # the first scenario's line: it has finished
    proc.send_signal(sig)
    assert proc.wait(timeout=60) == code
    line = one_stderr_line(proc.stderr.read())
    assert f"interrupted ({sig.name})" in line and "partial results of 1/3 scenarios" in line
    doc = results(out)
    assert doc["partial"] is True and doc["interrupted"] == sig.name
    assert [s["name"] for s in doc["scenarios"]] == ["first"] and doc["scenarios"][0]["met"]
    assert doc["not_run"] == ["long", "third"]
    # No temporary left behind, and no journal: the partial results.json says what it did.
    assert sorted(p.name for p in out.iterdir()) == ["results.json", "summary.md"]
    assert "first" in (out / "summary.md").read_text()


def test_a_run_killed_with_sigkill_leaves_a_journal_that_report_rebuilds(tmp_path, capsys):
    from harness.frontends.cli import main

    path = scenario_file(tmp_path, "first", "second", "long", extra={"long": LONG})
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text(OLD_REPORT)
    proc, lines = start(path, out)
    wait_for_line(proc, lines, "second")  # two scenarios finished; the third never will
    proc.kill()  # SIGKILL: no handler runs, nothing is written at the end
    proc.wait(timeout=60)
    assert json.loads((out / "results.json").read_text()) == json.loads(OLD_REPORT)  # what SIGKILL leaves
    assert main(["report", str(out)]) == 0
    err = capsys.readouterr().err
    assert "rebuilt partial results of 2 finished scenarios from the journal" in err
    doc = results(out)
    assert doc["partial"] is True and doc["interrupted"] == "killed" and doc["rebuilt_from"] == "journal"
    assert [s["name"] for s in doc["scenarios"]] == ["first", "second"] and all(s["met"] for s in doc["scenarios"])
    assert doc["environment"]["device"] == "sim" and "run" in doc["command"]
    assert (out / "report.html").is_file() and (out / "summary.md").is_file()


def test_an_interrupt_before_anything_finished_leaves_the_old_report(tmp_path):
    path = scenario_file(tmp_path, "long", "second", extra={"long": LONG})
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text(OLD_REPORT)
    proc, lines = start(path, out)
    # The run's start line, which the scenario loop prints with the interrupt handlers in place:
    # a signal from then on is the loop's to handle (session.run_scenarios), never start-up's.
    wait_for_line(proc, lines, "device: sim  scenarios: 2")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    assert "no scenario finished" in one_stderr_line(proc.stderr.read())
    assert (out / "results.json").read_text() == OLD_REPORT
    assert sorted(p.name for p in out.iterdir()) == ["results.json"]


main_thread_only = pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(),
    reason="signal handlers can only be installed from the main thread")


@main_thread_only
def test_sigterm_outside_the_scenario_loop_is_one_line_and_143(monkeypatch, capsys):
    def command(args):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends
        return 0

    monkeypatch.setattr(cli, "cmd_run", command)
    assert main(["run", "x.toml"]) == 143
    assert one_stderr_line(capsys.readouterr().err) == "fence-harness: interrupted (SIGTERM)"


@main_thread_only
def test_signal_handlers_are_the_commands_only_and_an_ignored_signal_stays_ignored(monkeypatch):
    seen = {}

    def command(args):
        seen.update(int=signal.getsignal(signal.SIGINT), term=signal.getsignal(signal.SIGTERM))
        return 0

    monkeypatch.setattr(cli, "cmd_run", command)
    before_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    before_term = signal.getsignal(signal.SIGTERM)
    try:
        assert main(["run", "x.toml"]) == 0
        assert seen["int"] is signal.SIG_IGN  # a background job's SIGINT stays ignored
        assert callable(seen["term"]) and seen["term"] is not before_term
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) is before_term
    finally:
        signal.signal(signal.SIGINT, before_int)


# ---------------------------------------------------------------- a device that goes away


@pytest.mark.parametrize("error", [
    RuntimeError("CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be "
                 "asynchronously reported at some other API call"),
    torch.AcceleratorError("CUDA error: an illegal memory access was encountered"),
])
def test_a_lost_device_stops_the_run_with_partial_results_and_exit_2(tmp_path, monkeypatch, capsys, error):
    def call(self, i, fault, _call=replay.Replayer.__call__):
        if self.tb.scenario.name == "lost":
            raise error
        return _call(self, i, fault)

    monkeypatch.setattr(replay.Replayer, "__call__", call)
    path = scenario_file(tmp_path, "first", "lost", "never")
    out = tmp_path / "out"
    assert main(["run", str(path), "--device", "sim", "--out", str(out)]) == 2
    line = one_stderr_line(capsys.readouterr().err)
    assert "lost: device lost: CUDA error: an illegal memory access was encountered" in line
    doc = results(out)
    assert doc["partial"] is True and doc["interrupted"] == "device-lost"
    first, lost = doc["scenarios"]
    assert first["met"] and lost["error"] == "device lost: CUDA error: an illegal memory access was encountered"
    assert doc["not_run"] == ["never"]


def test_a_lost_device_in_the_kill_matrix_keeps_the_finished_rows(tmp_path, monkeypatch, capsys):
    def call(self, i, fault, _call=replay.Replayer.__call__):
        if self.tb.scenario.name == "lost":
            raise RuntimeError("CUDA error: unspecified launch failure")
        return _call(self, i, fault)

    monkeypatch.setattr(replay.Replayer, "__call__", call)
    path = scenario_file(tmp_path, "first", "lost")
    out = tmp_path / "out"
    assert main(["mutants", str(path), "--device", "sim", "--out", str(out)]) == 2
    one_stderr_line(capsys.readouterr().err)
    doc = results(out)
    assert doc["partial"] is True
    assert [(row["name"], row["outcome"]) for row in doc["mutants"]["matrix"]] == [
        ("first", "clean"), ("lost", "error")]
