"""Command-line argument types and the device arguments every device-running command takes."""

from __future__ import annotations

import argparse

from harness.devices import DEVICE_NAMES


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


def device_arguments(sp: argparse.ArgumentParser) -> None:
    """--device, --timeout and --sim-cost, the same on run, repro, mutants, fences, bench and soak."""
    sp.add_argument("--device", default="auto", choices=DEVICE_NAMES,
                    help="cuda, sim (CPU simulator) or auto (cuda when present)")
    sp.add_argument("--timeout", type=positive_float, default=30.0,
                    help="seconds a replay may take before it is an error (default 30)")
    sp.add_argument("--sim-cost", dest="sim_costs", action="append", default=[], metavar="KEY=VALUE",
                    help="simulator cost model setting, e.g. launch_us=5 (repeatable; see SimCosts)")
