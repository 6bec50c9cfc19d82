"""fence-harness engine-matrix: the engine scenarios once per release of an engine (SGLang, or vLLM
with `--engine vllm`), each in its own process.

Each release is installed with `pip install --no-deps --target DIR/ENGINE-VERSION
ENGINE==VERSION` beside the one environment this command runs in (its dependencies are
that environment's: the `.[sglang]` or `.[vllm]` extra), unless the folder already holds it (a GPU
host with no package index gets it carried in). Then, per release, a child process
(`python -m harness engine-matrix --in-process`, a hidden option) with `PYTHONPATH`
pointing at that folder runs the scenario files and writes its own results; the parent
prints one table (release x scenario: verdict, stale replays, findings) and writes one
results.json whose every row names its release.

What each scenario expects on each release is the scenario file's (`expect_by_release`);
this command only says which releases to run. A newer release runs as it is.

Exit codes: 0 every scenario met its expectation on every release; 1 one did not, or
ended in an error; 2 bad input, or a release that cannot be installed or imported;
130 / 143 interrupted.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.frontends.cli_args import device_arguments, out_argument, positive_int

RELEASES = ("0.5.20", "0.5.21", "0.5.22", "0.5.23")
ROOT = Path(__file__).resolve().parents[2]
FILES = tuple(ROOT / "scenarios" / "engine" / name
              for name in ("sglang.toml", "sglang_cow.toml", "sglang_host_hit.toml"))
# The serving shapes: 8,192-token prefixes at hidden 1,024 with no injected fault. The race
# they show comes from real copy and compute times, so they run on a GPU only.
GPU_FILES = (ROOT / "scenarios" / "engine" / "serving.toml",)


@dataclass(frozen=True)
class EngineReleases:
    """One engine's part of the matrix: its releases, scenario files, and where each release's own
    results go under --out (`results` is the folder of the engine's merged results.json).

    `file_releases`: a default file's name -> the releases it drives (a PEP 440 specifier), where
    the code it drives is only in some releases; a release runs the default files whose range holds
    it (files given on the command line run on every release)."""

    name: str
    releases: tuple[str, ...]
    files: tuple[Path, ...]
    gpu_files: tuple[Path, ...]
    out_prefix: str  # a release's folder under --out: PREFIX + VERSION
    results: str  # the merged results.json's folder under --out ("" : --out itself)
    file_releases: tuple[tuple[str, str], ...] = ()

    def files_for(self, version: str, files: list[Path]) -> list[Path]:
        """The default files `version` runs (files not among the defaults run as they are)."""
        from packaging.specifiers import SpecifierSet

        ranges = dict(self.file_releases)
        return [f for f in files if f.name not in ranges or version in SpecifierSet(ranges[f.name])]


# vLLM: 0.13.0, before vllm-project/vllm#31341 (the offloading store's wait on the compute stream, first
# in 0.14.0; scenarios/engine/vllm_offload.toml), the releases on either side of #31057
# (requires_piecewise_for_cudagraph and VllmConfig's downgrade of FULL to PIECEWISE for it: first in
# 0.17.0; vllm.toml), those on either side of #46278 (SimpleCPUOffloadConnector's store ordered after
# the compute stream and read in stream order, first in 0.24.0; the connector is in 0.19.0 on;
# vllm_simple_offload.toml) and of #50696 (the offloading load's wait on the compute stream, first in
# 0.28.0; vllm_offload_load.toml; the same worker's store: vllm_offload_store.toml). The connector
# contract and the store's handlers (kv_offload/worker/cpu_gpu.py) are driven on the releases the
# adapter was built against (0.13.0-0.17.0; 0.23.0 on keep unified_attention elsewhere);
# SimpleCPUOffloadConnector's worker from 0.19.0; the OffloadingConnector's worker of 0.27.0 on
# (kv_offload/cpu/gpu_worker.py) from 0.27.0.
MATRIX = {
    "sglang": EngineReleases("sglang", RELEASES, FILES, GPU_FILES, "", ""),
    "vllm": EngineReleases("vllm", ("0.13.0", "0.16.0", "0.17.0", "0.23.0", "0.24.0", "0.27.0", "0.28.0"),
                           (ROOT / "scenarios" / "engine" / "vllm.toml",
                            ROOT / "scenarios" / "engine" / "vllm_offload.toml",
                            ROOT / "scenarios" / "engine" / "vllm_simple_offload.toml",
                            ROOT / "scenarios" / "engine" / "vllm_offload_store.toml",
                            ROOT / "scenarios" / "engine" / "vllm_offload_load.toml"),
                           (ROOT / "scenarios" / "engine" / "vllm_serving.toml",), "vllm-", "vllm",
                           (("vllm.toml", "<0.18.0"), ("vllm_offload.toml", "<0.18.0"),
                            ("vllm_serving.toml", "<0.18.0"),
                            ("vllm_simple_offload.toml", ">=0.19.0"), ("vllm_offload_store.toml", ">=0.27.0"),
                            ("vllm_offload_load.toml", ">=0.27.0"))),
}
# --small: the model dimensions the CPU computes in seconds (the layer pattern, batch and
# fault are the scenario's own).
SMALL: dict[str, Any] = {"hidden": 64, "heads": 2, "kv_heads": 1, "head_dim": 32, "state": 4}


def add_command(subparsers) -> None:
    p = subparsers.add_parser("engine-matrix", help="the engine scenarios on each release, one process each")
    p.add_argument("files", nargs="*", type=Path,
                   help="scenario files (default: scenarios/engine/sglang.toml, sglang_cow.toml and "
                        "sglang_host_hit.toml, on a GPU also serving.toml; with --engine vllm: "
                        "scenarios/engine/vllm.toml and vllm_offload.toml up to 0.17.0 (on a GPU also "
                        "vllm_serving.toml), vllm_simple_offload.toml from 0.19.0, vllm_offload_store.toml "
                        "and vllm_offload_load.toml from 0.27.0)")
    p.add_argument("--engine", choices=sorted(MATRIX), default="sglang",
                   help="whose releases (default: %(default)s)")
    p.add_argument("--releases", default=None,
                   help="comma-separated versions (default: sglang " + ",".join(RELEASES) + "; vllm "
                        + ",".join(MATRIX["vllm"].releases) + ")")
    p.add_argument("--engines-dir", type=Path, default=ROOT / ".engines", metavar="DIR",
                   help="where each release is installed, as DIR/ENGINE-VERSION (default: .engines)")
    p.add_argument("--replays", type=positive_int, help="replays per scenario (default: each scenario's own)")
    p.add_argument("--small", action=argparse.BooleanOptionalAction, default=None,
                   help="shrink the models' dimensions so the CPU computes them (default: on the simulator)")
    device_arguments(p)
    out_argument(p, "reports/engine-matrix", "results.json and each release's own folder")
    p.add_argument("--install-only", action="store_true",
                   help="install each release into its folder (as a run would) and stop")
    # How each release's own process runs: FILES here, on the sglang this process imports.
    p.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)


@dataclass(frozen=True)
class Row:
    release: str
    scenario: str
    expect: str
    observed: str | None
    met: bool
    stale_replays: int
    replays: int
    findings: int
    error: str | None
    not_restored: str | None = None  # observed wrong: the slots the landed load op left unrestored

    def line(self) -> str:
        verdict = self.observed or "error"
        ok = "ok  " if self.met else "FAIL"
        tail = f"  {self.error}" if self.error else f"  not restored: {self.not_restored}" if self.not_restored else ""
        return (f"{ok} {self.release:8s} {self.scenario:40s} expected {self.expect:5s} observed {verdict:5s} "
                f"stale {self.stale_replays:4d}/{self.replays:<4d} findings {self.findings:3d}{tail}")


def release_dir(engines_dir: Path, version: str, engine: str = "sglang") -> Path:
    return engines_dir / f"{engine}-{version}"


def install(version: str, engines_dir: Path, engine: str = "sglang") -> Path:
    """The release's own folder, installed with --no-deps unless it is already there; a vLLM release
    with its own Transformers where it needs another than the .[vllm] extra's (`own_transformers`)."""
    target = release_dir(engines_dir, version, engine)
    if not (target / engine / "__init__.py").is_file():
        print(f"installing {engine} {version} into {target}", flush=True)
        _pip(target, [f"{engine}=={version}"], version)
    if engine == "vllm":
        own_transformers(target, version)
    return target


# Transformers 5 and what it imports beyond the .[vllm] extra (huggingface_hub 1 imports httpx), pinned as
# CI runs them: vLLM 0.24.0 on refuses Transformers 4 when vllm.config is imported, and the extra pins 4
# for 0.13.0-0.23.0.
TRANSFORMERS5 = ("transformers==5.19.0", "tokenizers==0.23.2", "huggingface_hub==1.33.0", "httpx==0.29.0",
                 "httpcore==1.0.9")


def own_transformers(target: Path, version: str) -> None:
    """Put TRANSFORMERS5 in a release's folder (ahead of the environment's on its PYTHONPATH) where the
    release's metadata asks for a Transformers this environment's does not meet and the folder has none."""
    import importlib.metadata

    from packaging.requirements import InvalidRequirement, Requirement

    if (target / "transformers" / "__init__.py").is_file():
        return
    needed = None
    for meta in target.glob("*.dist-info/METADATA"):
        for line in meta.read_text(errors="replace").splitlines():
            if not line.startswith("Requires-Dist:"):
                continue
            try:
                req = Requirement(line.partition(":")[2].strip())
            except InvalidRequirement:
                continue
            if req.name.lower() == "transformers" and req.marker is None:
                needed = req.specifier
    try:
        have = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return  # nothing here to stand in the way of whatever the release finds
    if needed is None or needed.contains(have, prereleases=True):
        return
    print(f"installing {', '.join(TRANSFORMERS5)} into {target} (the release asks for transformers {needed}; "
          f"this environment has {have})", flush=True)
    _pip(target, list(TRANSFORMERS5), version)


def _pip(target: Path, packages: list[str], version: str) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                           *packages], check=False)
    if done.returncode != 0:
        from harness.records.errors import InputError

        raise InputError("--releases", version, f"pip could not install {' '.join(packages)} into {target}")


def _child_env(target: Path) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(target), str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def cmd_engine_matrix(args: argparse.Namespace) -> int:
    if args.in_process:
        return one_release(args)
    from harness.devices import device_kind
    from harness.report.results import write_results

    kind = device_kind(args.device)
    part = MATRIX[args.engine]
    files = [Path(f) for f in args.files] or [*part.files, *(part.gpu_files if kind == "cuda" else ())]
    if not args.files and kind != "cuda":
        for f in part.gpu_files:
            print(f"skipped on {kind}: {_shown(f)} (serving shapes, GPU only: their race comes from real copy and "
                  "compute times)", flush=True)
    small = args.small if args.small is not None else kind == "sim"
    releases = [r.strip() for r in (args.releases or ",".join(part.releases)).split(",") if r.strip()]
    if args.install_only:
        for version in releases:
            install(version, args.engines_dir, part.name)
        return 0
    started = time.time()
    docs: dict[str, dict] = {}
    codes: dict[str, int] = {}
    for version in releases:
        target = install(version, args.engines_dir, part.name)
        out = args.out / f"{part.out_prefix}{version}"
        cmd = [sys.executable, "-m", "harness", "engine-matrix", "--in-process", "--out", str(out),
               "--device", args.device, "--timeout", str(args.timeout), *[f"--sim-cost={c}" for c in args.sim_costs],
               *(["--replays", str(args.replays)] if args.replays else []), *(["--small"] if small else []),
               *map(str, files if args.files else part.files_for(version, files))]
        print(f"== {part.name} {version} ({target})", flush=True)
        codes[version] = subprocess.run(cmd, env=_child_env(target), check=False).returncode
        path = out / "results.json"
        if codes[version] in (0, 1) and path.is_file():
            docs[version] = json.loads(path.read_text())
    rows = [row for version, doc in docs.items() for row in rows_of(version, doc)]
    print(table(rows))
    missing = [v for v in releases if v not in docs]
    doc = merged(docs, rows, codes, started)
    path = write_results(args.out / part.results if part.results else args.out, doc)
    print(f"results: {path} ({time.time() - started:.0f} s)")
    if missing:
        print(f"fence-harness: engine-matrix: no results from {part.name} {', '.join(missing)} "
              f"(exit {', '.join(str(codes[v]) for v in missing)})", file=sys.stderr)
        return 2
    return 0 if all(r.met for r in rows) else 1


def _shown(path: Path) -> str:
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return str(path)


def rows_of(version: str, doc: dict) -> list[Row]:
    return [
        Row(version, e["name"], e["expect"], e["observed"], bool(e["met"]), int(e["stale_replays"]),
            int(e["replays"]), len(e["findings"]), e["error"], e.get("not_restored"))
        for e in doc["scenarios"]
    ]


def table(rows: list[Row]) -> str:
    met = sum(r.met for r in rows)
    releases = sorted({r.release for r in rows})
    lines = [r.line() for r in rows]
    lines.append(f"{met} of {len(rows)} met their expectation on {len(releases)} releases ({', '.join(releases)})")
    return "\n".join(lines)


def merged(docs: dict[str, dict], rows: list[Row], codes: dict[str, int], started: float) -> dict:
    """One results.json: every release's scenarios, each named and marked with its release."""
    from harness.report.results import git_commit

    scenarios = [
        {**e, "name": f"{version}/{e['name']}", "release": version}
        for version, doc in docs.items() for e in doc["scenarios"]
    ]
    first = next(iter(docs.values()), {})
    return {
        "schema_version": first.get("schema_version", 1),
        "run_id": first.get("run_id", ""),
        "git_commit": git_commit(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": _command_line(),
        "environment": first.get("environment", {}),
        "summary": {"scenarios": len(scenarios), "met": sum(r.met for r in rows),
                    "errors": sum(r.error is not None for r in rows)},
        "scenarios": scenarios,
        "engine_matrix": {
            "releases": [{"release": v, "exit_code": codes[v], "ran": v in docs} for v in codes],
            "rows": [dataclasses.asdict(r) for r in rows],
        },
    }


# ---------------------------------------------------------------- one release (its own process)


def one_release(args: argparse.Namespace) -> int:
    """One release, in this process (`engine-matrix --in-process`, which the parent starts once per
    release): run the files and write this release's results.json."""
    from harness.devices import open_device
    from harness.frontends.console import plain_line
    from harness.frontends.session import run_scenarios
    from harness.input.scenario_file import load_files
    from harness.report.results import build_results, write_results

    if not args.files:
        from harness.records.errors import InputError

        raise InputError("engine-matrix --in-process", "FILES", "give the scenario files to run")
    from harness.frontends.console import skip_lines

    dev = open_device(args.device, args.sim_costs)
    # A file's scenarios that run only on another device (`devices`) are skipped, each file said once;
    # none left to run is an InputError (exit 2), never a release that met every expectation of nothing.
    loaded = load_files(args.files)
    scenarios = [s for s in loaded if s.runs_on(dev.name)]
    for line in skip_lines([s for s in loaded if not s.runs_on(dev.name)], dev.name):
        print(f"skipped {line}", flush=True)
    if not scenarios:
        from harness.records.errors import InputError

        files = ", ".join(sorted({s.shown_source for s in loaded}))
        raise InputError(files, "devices", f"each of its {len(loaded)} scenarios runs only on another device; "
                                           f"none runs on {dev.name}")
    if args.small:
        scenarios = [s.with_overrides(model=dataclasses.replace(s.model, **SMALL)) for s in scenarios]
    results = []

    def done(r) -> None:
        results.append(r)
        print(plain_line(r), flush=True)

    started = time.time()
    run_scenarios(scenarios, lambda: dev, args.replays, args.timeout, done)
    write_results(args.out, build_results(results, dev.describe(), started, time.time()))
    return 0 if all(r.met for r in results) and len(results) == len(scenarios) else 1


def _command_line() -> list[str]:
    from harness.report.results import command_line  # lazily: results imports much of the package

    return command_line()
