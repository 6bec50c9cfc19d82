"""The commands that prepare and serve runs on a GPU host, beside the scenario runs themselves:

    fence-harness engine-pack [--engine sglang|vllm] [--releases V,V] [--engines-dir DIR] [--out DIR]
                              [--no-wheels]
                                   SGLang (or vLLM) releases, stubs and wheels for a GPU host with
                                   no package index (harness.frontends.engine_pack, engine_pack_vllm)
    fence-harness gpu-workers count               the number of usable GPUs (1 when none)
    fence-harness gpu-workers check RESULTS.json  which worker of a merged run ran on which GPU
                                   (harness.frontends.gpu_workers)

and the ones the harness starts in a process of its own, hidden from the help: the pressure
fault's workload (`pressure-workload`, harness.faults.contention) and `engine-pack --list`.
This module only parses their arguments; each handler imports what it runs (torch among it)
when it runs, so the parser stays torch-free.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.frontends.engine_matrix import ROOT

# What `engine-pack` packs unless --releases says otherwise: sglang on either side of its fix (0.5.23),
# vllm on either side of vllm-project/vllm#31057 (0.17.0).
RELEASES = {"sglang": "0.5.22,0.5.23", "vllm": "0.16.0,0.17.0"}


def add_commands(subparsers) -> None:
    pack = subparsers.add_parser("engine-pack", help="pack SGLang or vLLM releases, stubs and wheels for a GPU host "
                                                     "with no package index (`make engine-pack`)")
    pack.add_argument("--engine", choices=sorted(RELEASES), default="sglang",
                      help="whose releases (default: %(default)s)")
    pack.add_argument("--releases", default=None,
                      help="comma-separated versions (default: sglang " + RELEASES["sglang"] + "; vllm "
                           + RELEASES["vllm"] + ")")
    pack.add_argument("--engines-dir", type=Path, default=ROOT / ".engines", metavar="DIR",
                      help="where each release is installed first, as DIR/ENGINE-VERSION (default: .engines)")
    pack.add_argument("--out", type=Path, default=ROOT / ".engines" / "carry", metavar="DIR",
                      help="where the pack goes (default: .engines/carry)")
    pack.add_argument("--no-wheels", dest="wheels", action="store_false",
                      help="leave out the wheels of the third-party packages the GPU image lacks")
    pack.add_argument("--python-version", default="3.12", metavar="X.Y",
                      help="with --engine vllm: the CPython the compiled wheels are for (default: %(default)s, the "
                           "GPU image's)")
    # How engine_pack.imported_files lists what a release imports, in a process of its own.
    pack.add_argument("--list", action="store_true", help=argparse.SUPPRESS)
    pack.add_argument("--cuda-branches", action="store_true", help=argparse.SUPPRESS)
    # How `make engine-from-pack` asks, on the GPU host, which of a pack's vLLM wheels to install.
    pack.add_argument("--host-wheels", type=Path, metavar="PACK", help=argparse.SUPPRESS)

    workers = subparsers.add_parser("gpu-workers", help="one pytest worker per GPU: how many (count), and which "
                                                        "GPU each worker of a merged run used (check)")
    what = workers.add_subparsers(dest="what", required=True, metavar="count|check")
    what.add_parser("count", help="the number of usable GPUs (1 when none): `make gpu-test`'s workers")
    check = what.add_parser("check", help="which worker ran on which GPU; exit 1 if two workers shared one or a "
                                          "scenario is not on its worker's GPU, 2 if the file is not a results.json")
    check.add_argument("results", type=Path, metavar="RESULTS.json")

    # No help=: a sub-command without one is left out of the command list (help=SUPPRESS is not,
    # on Python 3.11). OtherProcess starts it; nobody types it.
    workload = subparsers.add_parser("pressure-workload", description="the pressure fault's contention, until "
                                                                     "end-of-file on stdin")
    workload.add_argument("--device", default="cuda")
    workload.add_argument("--spec", default="{}", help="the Pressure record as JSON")
    workload.add_argument("--parent", type=int, help="the harness's pid: stop when it is gone")


def cmd_engine_pack(args: argparse.Namespace) -> int:
    import sys

    from harness.frontends import engine_pack, engine_pack_vllm

    releases = [r.strip() for r in (args.releases or RELEASES[args.engine]).split(",") if r.strip()]
    if args.engine == "vllm":
        if args.host_wheels is not None:
            wheels, why = engine_pack_vllm.host_wheels(args.host_wheels)
            print(f"vllm: {why}", file=sys.stderr)
            print("\n".join(map(str, wheels)))
            return 0
        if args.list:
            engine_pack_vllm.print_imported(args.cuda_branches)
            return 0
        engine_pack_vllm.pack(releases, args.engines_dir, args.out, args.wheels, args.python_version)
        return 0
    if args.list:
        engine_pack.print_imported(args.cuda_branches)
        return 0
    engine_pack.pack(releases, args.engines_dir, args.out, args.wheels)
    return 0


def cmd_gpu_workers(args: argparse.Namespace) -> int:
    from harness.frontends import gpu_workers

    if args.what == "count":
        print(max(1, gpu_workers.gpu_count()))  # -n 1 on a host without GPUs still runs the suite
        return 0
    return gpu_workers.check(args.results)


def cmd_pressure_workload(args: argparse.Namespace) -> int:
    from harness.faults.contention import serve

    return serve(args.device, args.spec, args.parent)


HANDLERS = {"engine-pack": cmd_engine_pack, "gpu-workers": cmd_gpu_workers, "pressure-workload": cmd_pressure_workload}
