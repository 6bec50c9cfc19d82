"""Command-line argument types and the device arguments every device-running command takes.

Torch-free, as is everything the parser is built from: `--help` and a usage error
answer at once, before any of the harness's heavy modules is imported.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.records.device_settings import DEVICE_NAMES, SimCosts
from harness.records.plugin_api import API_VERSION
from harness.records.version import __version__


def version_text() -> str:
    """What `fence-harness --version` prints."""
    return f"fence-harness {__version__} (plugin API {API_VERSION})"


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got '{text}'") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value:g}")
    return value


def interval_width(text: str) -> float:
    """A confidence interval's width: a rate's interval is within [0, 1], so 0 < W < 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an interval width between 0 and 1, like 0.05, got '{text}'") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"expected an interval width between 0 and 1 (exclusive), got {value:g}")
    return value


def _sim_cost_help() -> str:
    keys = ", ".join(f"{key} (default {getattr(SimCosts, key):g})" for key in SimCosts.keys())
    return f"simulator cost model setting (repeatable), e.g. launch_us=5; keys: {keys}"


def out_argument(sp: argparse.ArgumentParser, default: str = "reports",
                 writes: str = "results.json, summary.md and report.html") -> None:
    """--out, the folder a command writes its report files into."""
    sp.add_argument("--out", type=Path, default=Path(default), metavar="DIR",
                    help=f"where {writes} go (default: %(default)s)")


def device_arguments(sp: argparse.ArgumentParser) -> None:
    """--device, --timeout and --sim-cost, the same on run, repro, mutants, fences, bench and soak."""
    sp.add_argument("--device", default="auto", choices=DEVICE_NAMES,
                    help="cuda, sim (CPU simulator) or auto (cuda when torch sees one) (default: %(default)s)")
    sp.add_argument("--timeout", type=positive_float, default=30.0,
                    help="seconds a replay may take before it is an error (default: %(default)g)")
    sp.add_argument("--sim-cost", dest="sim_costs", action="append", default=[], metavar="KEY=VALUE",
                    help=_sim_cost_help())


DEFAULT_FILES = ("scenarios/*.toml of the working directory when it has any, else the set installed with "
                 "the package (`fence-harness list scenarios` lists it)")


def selection_arguments(sp: argparse.ArgumentParser) -> None:
    """-k and --json, the same on every command that runs scenario files."""
    sp.add_argument("-k", dest="keyword", metavar="EXPR",
                    help="only scenarios whose names match EXPR, as pytest's -k: words (substrings of the name, "
                         "any case) joined by and / or / not, e.g. -k 'full and not none'")
    sp.add_argument("--json", action="store_true",
                    help="print a JSON summary on stdout for scripts (the usual lines go to stderr)")
