"""`fence-harness calibrate`: the simulator's cost model measured on the GPU of this host
(harness.studies.calibration), written as the file `SimCosts` takes its defaults from.

    fence-harness calibrate [--out FILE]     default: harness/records/sim_costs.json

Prints each measured point beside the fitted cost's prediction, then the costs. Exit 2 without
CUDA (the simulator has nothing to measure). The parser imports no torch.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness.frontends.cli_args import positive_int
from harness.records.device_settings import CALIBRATION


def add_command(subparsers) -> None:
    c = subparsers.add_parser("calibrate", help="measure the simulator's costs (copies, kernels, host calls) on "
                                                "this host's GPU and write them where the simulator reads them")
    c.add_argument("--out", type=Path, default=CALIBRATION, metavar="FILE",
                   help="the calibration file to write (default: the package's own, which the simulator reads)")
    c.add_argument("--repeats", type=positive_int, default=200,
                   help="timed replays per reference forward (default 200)")


def cmd_calibrate(args: argparse.Namespace) -> int:
    import datetime

    from harness.devices import device_kind, open_device
    from harness.report.results import command_line, git_commit, run_environment
    from harness.studies import calibration as cal

    if device_kind("auto") != "cuda":
        print("fence-harness: calibrate: no CUDA device here: it measures a GPU (the simulator has nothing to "
              "measure)", file=sys.stderr)
        return 2
    dev = open_device("cuda")
    copies = cal.measure_copies(dev)
    kernels = cal.measure_kernels(dev)
    forwards = cal.measure_forwards(dev, repeats=args.repeats)
    host = cal.measure_host(dev)
    env = {k: v for k, v in run_environment(dev.describe()).items() if k != "host"}  # no machine's name
    env.update(git_commit=git_commit(), date=datetime.date.today().isoformat())
    doc = cal.calibration_doc(copies, kernels, forwards, host, cal.enqueues_per_replay(), env, command_line(sys.argv))
    costs = doc["costs"]
    latency, bandwidth = costs["copy_latency_us"], costs["bandwidth_gbps"]
    print(f"{'copy bytes':>12s} {'measured us':>12s} {'fitted us':>10s}")
    for p in copies:
        print(f"{p.nbytes:12,d} {p.us:12.3f} {latency + p.nbytes / (bandwidth * 1e3):10.3f}")
    print(f"\n{'kernel':40s} {'pools':>5s} {'us':>8s}")
    for k in kernels:
        print(f"{k.shape + ': ' + k.what:40.40s} {'yes' if k.access else '':>5s} {k.us:8.3f}")
    print(f"\n{'forward (graph replay)':22s} {'access':>6s} {'other':>6s} {'measured us':>12s} {'costs add to':>12s}")
    for f in doc["forwards"]:
        print(f"{f['shape']:22s} {f['access_ops']:6d} {f['other_ops']:6d} {f['us']:12.2f} {f['predicted_us']:12.2f}")
    print("\nhost: " + ", ".join(f"{h.what} {h.us:.2f} us" for h in host)
          + f"; a replay's enqueue holds {doc['enqueues_per_replay']} ops")
    print("costs: " + ", ".join(f"{k}={v:g}" for k, v in costs.items()))
    print(f"fit: copies within {doc['fit']['copy_residual_us']:g} us of the line; the costs add up to each "
          f"graph replay within {doc['fit']['forward_error']:.1%}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"written: {args.out}")
    return 0


HANDLERS = {"calibrate": cmd_calibrate}
