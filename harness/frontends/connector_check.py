"""fence-harness connector-check: is a vLLM V1 KV connector's `requires_piecewise_for_cudagraph`
declaration honest?

The connector (`package.module:ConnectorClass`, a subclass of vLLM's `KVConnectorBase_V1`) is named to
vLLM by module path in a whole VllmConfig that asks for FULL cudagraphs; vLLM makes the worker's
instance and settles on the graph mode (`harness.engines.vllm_graphs`). Its load and save hooks then
run on the harness's attention-only model (`AAAA`, the scenario `vllm.layerwise-false.gate` shrunk),
its load under the gate fault (the load stream held until the forward has run, so an unordered read
is stale in every replay), through vLLM's own `unified_attention`:

1. in the mode vLLM settled on: a race (stale data, or the analyser or graph check finding a read not
   ordered after its load) means its waits do not order the graph's reads after the loads: exit 1;
2. where vLLM settled on PIECEWISE for it, once more as one FULL graph: clean there too means the
   declaration costs a piecewise graph for nothing (a note, exit 0); a race there means the
   declaration is what keeps it correct (exit 0).

`--release VERSION` runs the check on `.engines/vllm-VERSION` (installed there as `engine-matrix`
installs it) in its own process. Bad input (no such module or class, not a V1 connector, vLLM not
importable) is one line, exit 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness.frontends.cli_args import device_arguments, positive_int
from harness.records.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = "vllm.layerwise-false.gate"
SMALL: dict[str, Any] = {"hidden": 64, "heads": 2, "kv_heads": 1, "head_dim": 32}


def add_command(subparsers) -> None:
    p = subparsers.add_parser("connector-check",
                              help="is a vLLM KV connector's requires_piecewise_for_cudagraph declaration honest?")
    p.add_argument("connector", help="the connector class, package.module:ConnectorClass")
    p.add_argument("--release", help="a vLLM version: run on .engines/vllm-VERSION, in its own process")
    p.add_argument("--engines-dir", type=Path, default=ROOT / ".engines", metavar="DIR",
                   help="where --release is installed, as DIR/vllm-VERSION (default: .engines)")
    p.add_argument("--extra-config", default="{}", metavar="JSON",
                   help="the connector's kv_connector_extra_config (default: {})")
    p.add_argument("--replays", type=positive_int, default=5, help="replays per run (default: %(default)s)")
    device_arguments(p)


def connector_class(spec: str) -> type:
    """The class `package.module:ConnectorClass`, a V1 connector; InputError (exit 2) otherwise."""
    from harness.engines import vllm as adapter

    module_name, sep, name = spec.partition(":")
    if not sep or not module_name or not name:
        raise InputError("connector-check", spec, "expected package.module:ConnectorClass")
    engine = adapter.load("connector-check", spec)
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - any import failure is the same answer
        raise InputError("connector-check", spec, f"cannot import {module_name!r}: {type(e).__name__}: {e}") from None
    cls = getattr(module, name, None)
    if cls is None:
        raise InputError("connector-check", spec, f"module {module_name!r} has no {name!r}")
    base = engine.module(adapter.CONNECTOR).KVConnectorBase_V1
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise InputError("connector-check", spec, f"{name} is not a vLLM V1 KV connector (a subclass of "
                                                  "KVConnectorBase_V1)")
    return cls


@dataclasses.dataclass
class Run:
    mode: str  # what vLLM settled on
    backend: str  # what ran
    stale: int
    replays: int
    findings: int
    graph_findings: int
    error: str | None

    @property
    def race(self) -> bool:
        return bool(self.stale or self.findings or self.graph_findings)

    def line(self) -> str:
        if self.error:
            return f"error: {self.error}"
        return (f"stale {self.stale}/{self.replays} replays, {self.findings} findings, graph check "
                f"{self.graph_findings} findings")


def _run(fence: str, replays: int, dev: Any) -> Run:
    from harness.input.scenario_file import SCENARIO_DIR, load_file
    from harness.run.pipeline import run_scenario

    template = next(s for s in load_file(SCENARIO_DIR / "engine" / "vllm.toml") if s.name == TEMPLATE)
    s = template.with_overrides(model=dataclasses.replace(template.model, **SMALL), fence=fence,
                                name=f"connector-check.{fence}")
    r = run_scenario(s, dev, replays=replays)
    from harness.engines import vllm_load

    mode = vllm_load.current().mode if vllm_load._current is not None else "?"
    graph = len(r.graph.findings) if r.graph is not None else 0
    return Run(mode, "full" if fence == "vllm_check_full" or mode == "FULL" else "breakable", r.tally.stale_replays,
               r.tally.replays, len(r.findings), graph, r.error)


def cmd_connector_check(args: argparse.Namespace) -> int:
    import json

    if args.release:
        return _in_release(args)
    try:
        extra = json.loads(args.extra_config)
    except ValueError as e:
        raise InputError("--extra-config", args.extra_config, f"not JSON: {e}") from None
    if not isinstance(extra, dict):
        raise InputError("--extra-config", args.extra_config, "expected a JSON object")
    cls = connector_class(args.connector)
    from harness.devices import open_device
    from harness.engines import vllm as adapter
    from harness.engines import vllm_graphs

    engine = adapter.load()
    declares = bool(cls.requires_piecewise_for_cudagraph(extra)) if hasattr(cls, "requires_piecewise_for_cudagraph") \
        else None
    dev = open_device(args.device, args.sim_costs)
    vllm_graphs.checking(cls, extra)
    try:
        first = _run("vllm_check", args.replays, dev)
        name = cls.__name__
        said = "declares nothing (this release has no requires_piecewise_for_cudagraph)" if declares is None \
            else f"declares requires_piecewise_for_cudagraph {declares}"
        print(f"{name} ({cls.__module__}) on vllm {engine.version}: {said}; vLLM settled on {first.mode}")
        print(f"  {first.mode} ({first.backend}): {first.line()}")
        if first.error:
            print(f"fence-harness: connector-check: {name} did not run on the harness's device: {first.error}",
                  file=sys.stderr)
            return 2
        if first.race:
            print(f"race: {name}'s waits do not order the graph's reads after its loads under {first.mode}"
                  + (" (this release does not read the declaration)" if declares and first.mode == "FULL" else ""))
            return 1
        if first.mode != "FULL":
            full = _run("vllm_check_full", args.replays, dev)
            print(f"  FULL (full, the downgrade not taken): {full.line()}")
            if full.error:
                print(f"fence-harness: connector-check: the FULL run ended in an error: {full.error}", file=sys.stderr)
                return 2
            if not full.race:
                print(f"honest, at a cost: {name} declares True, but a FULL graph was clean too: PIECEWISE costs "
                      "graph launches and eager attention for nothing here")
                return 0
            print(f"honest: {name} needs PIECEWISE (a FULL graph races) and declares it")
            return 0
        print(f"honest: {name}'s waits order the FULL graph's reads after its loads")
        return 0
    finally:
        vllm_graphs.checking(None)


def _in_release(args: argparse.Namespace) -> int:
    from harness.frontends.engine_matrix import install

    target = install(args.release, args.engines_dir, "vllm")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(target), str(ROOT), os.getcwd(),
                                         *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]])
    cmd = [sys.executable, "-m", "harness", "connector-check", args.connector, "--extra-config", args.extra_config,
           "--replays", str(args.replays), "--device", args.device, "--timeout", str(args.timeout),
           *[f"--sim-cost={c}" for c in args.sim_costs]]
    return subprocess.run(cmd, env=env, check=False).returncode
