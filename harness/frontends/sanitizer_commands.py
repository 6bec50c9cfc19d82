"""`fence-harness sanitizer compare | cost | check`: the sanitizer's studies, on a GPU.

    compare  harness.sanitizer against PyTorch's CUDA sanitizer and against the data, per case
    cost     what harness.sanitizer costs per replay (device time, plain against sanitized)
    check    the happens-before analyser against PyTorch's CUDA sanitizer on the default set

The studies live in `harness.studies`; this module only parses their arguments. The hidden
options (`--torch-one`, `--one`) are how a study runs one case in a process of its own
(`harness.studies.children`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.frontends.cli_args import positive_int


def add_command(subparsers) -> None:
    p = subparsers.add_parser("sanitizer", help="harness.sanitizer's studies on a GPU: compare, cost, check")
    sub = p.add_subparsers(dest="study", required=True, metavar="STUDY")

    compare = sub.add_parser("compare", help="harness.sanitizer against PyTorch's sanitizer and the data")
    compare.add_argument("--replays", type=positive_int, default=20, help="counted replays per scenario")
    compare.add_argument("--example-replays", type=positive_int, default=50, help="replays of the example")
    compare.add_argument("--log", default="sanitizer_races.log", help="where each case's races are described")
    compare.add_argument("--torch-one", help=argparse.SUPPRESS)

    cost = sub.add_parser("cost", help="what harness.sanitizer costs per replay")
    cost.add_argument("--rounds", type=positive_int, default=5, help="pairs of runs (plain, sanitized) per case")
    cost.add_argument("--replays", type=positive_int, default=30, help="replays per run of a scenario")
    cost.add_argument("--example-replays", type=positive_int, default=50, help="replays per run of the example")
    cost.add_argument("--out", type=Path, default=Path("reports/sanitizer"),
                      help="folder for results.json and table.md (default: %(default)s)")

    check = sub.add_parser("check", help="the analyser against PyTorch's sanitizer, each case in its own process")
    check.add_argument("--replays", type=positive_int, default=3)
    check.add_argument("--one", nargs=2, metavar=("NAME", "on|off"), help=argparse.SUPPRESS)


def cmd_sanitizer(args: argparse.Namespace) -> int:
    if args.study == "compare":
        from harness.studies import sanitizer_compare

        if args.torch_one:
            sanitizer_compare.torch_one(args.torch_one, args.replays, args.example_replays)
            return 0
        return sanitizer_compare.run(args.replays, args.example_replays, args.log)
    if args.study == "cost":
        from harness.studies import sanitizer_cost

        return sanitizer_cost.run(args.rounds, args.replays, args.example_replays, args.out)
    from harness.studies import sanitizer_check

    if args.one:
        sanitizer_check.one(args.one[0], args.one[1] == "on", args.replays)
        return 0
    return sanitizer_check.run(args.replays)


HANDLERS = {"sanitizer": cmd_sanitizer}
