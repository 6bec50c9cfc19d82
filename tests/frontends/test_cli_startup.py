"""The command line starts fast and stops cleanly: its parser imports no torch, the help lists
every command and exit code, no command is a usage error, and an interrupt while it is still
importing is one line and exit 130."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from harness.frontends import cli
from harness.frontends.cli import main
from harness.records.device_settings import SimCosts
from tests.support.paths import ROOT

TINY = ROOT / "tests" / "data" / "tiny.toml"
COMMANDS = ("run", "repro", "mutants", "report", "merge", "compare", "fences", "bench", "soak", "list", "engine-pack",
            "gpu-workers")
# Started by the harness itself in a process of its own; nobody types them.
HIDDEN = ("pressure-workload",)


def harness(*argv: str, python_flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *python_flags, "-m", "harness", *argv],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


def imported(importtime_log: str) -> set[str]:
    """The modules a `python -X importtime` run imported (its log's last column)."""
    return {line.rsplit("|", 1)[-1].strip() for line in importtime_log.splitlines() if "|" in line}


def test_building_the_parser_imports_no_torch():
    code = ("import sys; from harness.frontends.cli import _parser; _parser(); "
            "print(sorted(m for m in sys.modules if m in ('torch', 'scipy') "
            "or m.startswith(('torch.', 'rich', 'scipy.'))))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


@pytest.mark.parametrize("argv,code", [
    (("--help",), 0),
    (("run", "--help"), 0),
    (("bench", "--help"), 0),
    (("run", "--replays", "0"), 2),  # an argument error
    (("nope",), 2),
    ((), 2),
])
def test_help_and_usage_errors_import_no_torch(argv, code):
    proc = harness(*argv, python_flags=("-X", "importtime"))
    assert proc.returncode == code, proc.stderr[-2000:]
    modules = imported(proc.stderr)
    assert "harness.frontends.cli" in modules  # the log is the one asked for
    assert "torch" not in modules and not any(m.startswith("harness.run.pipeline") for m in modules)


def test_the_help_lists_every_command_and_exit_code():
    proc = harness("--help")
    for command in COMMANDS:
        assert f"\n    {command} " in proc.stdout, command
    for code in ("0", "1", "2", "130", "143"):
        assert f"\n  {code} " in proc.stdout, code
    assert "With no command, this help goes to stderr and the exit code is 2" in proc.stdout
    assert not any(command in proc.stdout for command in HIDDEN) and "SUPPRESS" not in proc.stdout


@pytest.mark.parametrize("command", ["run", "mutants", "fences", "bench", "soak"])
def test_a_commands_help_shows_its_defaults_and_the_cost_keys(command):
    help_text = " ".join(harness(command, "--help").stdout.split())  # argparse wraps at any space
    assert "--device {auto,cuda,sim}" in help_text and "(default: auto)" in help_text
    out = "reports/soak" if command == "soak" else "reports"
    assert "--out DIR where " in help_text and f"(default: {out})" in help_text
    for key in SimCosts.keys():
        assert f"{key} (default {getattr(SimCosts, key):g})" in help_text, key


def test_no_command_prints_the_command_list_and_exits_2():
    proc = harness()
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("usage: fence-harness") and "Traceback" not in proc.stderr
    assert all(f"\n    {command} " in proc.stderr for command in COMMANDS)


def test_no_command_in_process_is_2(capsys):
    assert main([]) == 2
    assert "commands:" in capsys.readouterr().err


# ---------------------------------------------------------------- an interrupt while starting up

# Runs `python -m harness ARGS` with a finder that sends this process SIGINT when MODULE is
# first imported: a Ctrl-C that lands while the command line is still loading its modules.
INTERRUPTED_IMPORT = r"""
import os, runpy, signal, sys

module, argv = sys.argv[1], sys.argv[2:]

class CtrlC:
    def find_spec(self, name, path=None, target=None):
        if name == module:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, CtrlC())
sys.argv = ["harness", *argv]
runpy.run_module("harness", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("module,argv", [
    # while `python -m harness` imports the command line: before any handler of the harness
    ("harness.frontends.cli", ["run", str(TINY), "--device", "sim"]),
    # while a command imports the device (torch): main's own interrupt path
    ("harness.devices", ["run", str(TINY), "--device", "sim"]),
])
def test_ctrl_c_while_modules_import_is_one_line_and_130(module, argv, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_IMPORT, module, *argv, "--out", str(tmp_path / "out")],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
        # Ctrl-C as from a terminal, whatever the test runner left SIGINT as.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.strip() == "fence-harness: interrupted (SIGINT)"
    assert not (tmp_path / "out").exists()


def test_main_turns_an_interrupt_before_the_command_into_one_line(monkeypatch, capsys):
    # The console script calls main(): an interrupt while it builds its parser, before the
    # command's handlers are in place, is the same one line.
    def parser():
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_parser", parser)
    assert main(["run"]) == 130
    assert capsys.readouterr().err.strip() == "fence-harness: interrupted (SIGINT)"
