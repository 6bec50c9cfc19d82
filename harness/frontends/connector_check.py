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

A connector that is not the harness's (vLLM's own `OffloadingConnector`, a user's) runs with what a
real engine gives it (`harness.engines.vllm_scheduler`: the model's KVCacheConfig, its scheduler side
building its metadata, the batch's prefixes offloaded by earlier requests, vLLM's offloading handlers
on the harness's device) and with vLLM's scheduler deciding when each forward runs: where its scheduler
side answers that a load is asynchronous, the forward waits until its worker reports the load. Such a
connector, clean under FULL with asynchronous loads, is run once more with each forward in its load's
own step: a race there says its hooks do not order a pending load, and that the ordering is the
scheduler's. Findings of its load's copies against the forward stream's earlier writes to the same
blocks (the harness's poisoning) are reported as a note: they say what orders the load's start, not
whether the graph waits for it.

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
    # Findings of the load's copies against writes the forward stream enqueued to the same slots before
    # the load (the harness's poisoning, standing for a zeroing or an earlier owner's writes): they say
    # what orders the load's start, not whether the graph's reads wait for it.
    before_load: int = 0
    # Where vLLM's scheduler steps ran the connector (one that is not the harness's): the connector's
    # load_kv_async per request, and the worker's get_finished polls before the forwards that waited.
    asynchronous: tuple[bool, ...] = ()
    polls: int = 0

    @property
    def race(self) -> bool:
        return bool(self.stale or self.findings - self.before_load or self.graph_findings)

    def line(self) -> str:
        if self.error:
            return f"error: {self.error}"
        return (f"stale {self.stale}/{self.replays} replays, {self.findings - self.before_load} findings, graph "
                f"check {self.graph_findings} findings")


def _run(fence: str, replays: int, dev: Any) -> Run:
    from harness.input.scenario_file import SCENARIO_DIR, load_file
    from harness.records.races import RaceKind
    from harness.run.pipeline import run_scenario

    template = next(s for s in load_file(SCENARIO_DIR / "engine" / "vllm.toml") if s.name == TEMPLATE)
    s = template.with_overrides(model=dataclasses.replace(template.model, **SMALL), fence=fence,
                                name=f"connector-check.{fence}")
    r = run_scenario(s, dev, replays=replays)
    from harness.engines import vllm_load

    load = vllm_load._current
    mode = load.mode if load is not None else "?"
    graph = len(r.graph.findings) if r.graph is not None else 0
    before = sum(f.kind is RaceKind.WRITE_AFTER_WRITE and f.access_first for f in r.findings)
    decisions = load.scheduler.decisions if load is not None and load.scheduler is not None else None
    return Run(mode, "full" if fence.startswith("vllm_check_full") or mode == "FULL" else "breakable",
               r.tally.stale_replays, r.tally.replays, len(r.findings), graph, r.error, before,
               tuple(decisions.asynchronous) if decisions else (), decisions.polls if decisions else 0)


def _declares(cls: type, extra: dict[str, Any], base: type) -> str:
    """What the connector declares, and whether it says it itself or keeps the base class's answer."""
    if not hasattr(cls, "requires_piecewise_for_cudagraph"):
        return "declares nothing (this release has no requires_piecewise_for_cudagraph)"
    said = bool(cls.requires_piecewise_for_cudagraph(extra))
    own = any("requires_piecewise_for_cudagraph" in vars(c) for c in cls.__mro__[:-1] if c is not base
              and issubclass(c, base))
    return f"declares requires_piecewise_for_cudagraph {said}" + ("" if own else " (the base class's answer)")


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
    said = _declares(cls, extra, engine.module(adapter.CONNECTOR).KVConnectorBase_V1)
    dev = open_device(args.device, args.sim_costs)
    vllm_graphs.checking(cls, extra)
    try:
        first = _run("vllm_check", args.replays, dev)
        name = cls.__name__
        print(f"{name} ({cls.__module__}) on vllm {engine.version}: {said}; vLLM settled on {first.mode}")
        print(f"  {first.mode} ({first.backend}): {first.line()}")
        if first.error:
            print(f"fence-harness: connector-check: {name} did not run on the harness's device: {first.error}",
                  file=sys.stderr)
            return 2
        _loads(first)
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
        if first.asynchronous and all(first.asynchronous):
            same = _run("vllm_check_full_same_step", args.replays, dev)
            print(f"  FULL, each forward in its load's own step: {same.line()}")
            if same.error:
                print(f"fence-harness: connector-check: that run ended in an error: {same.error}", file=sys.stderr)
                return 2
            hooks = ("its hooks do not order a pending load (in the load's own step, FULL races)" if same.race
                     else "its hooks order a FULL graph's reads too")
            print(f"honest: {name}'s loads are asynchronous: vLLM's scheduler runs a request's forward only once "
                  f"the worker's get_finished reported its load, so a FULL graph never reads a pending load; {hooks}")
            return 0
        print(f"honest: {name}'s waits order the FULL graph's reads after its loads")
        return 0
    finally:
        vllm_graphs.checking(None)


def _loads(run: Run) -> None:
    """What vLLM's scheduler saw of a connector that is not the harness's, and what its loads are
    ordered after."""
    if run.asynchronous:
        n, k = len(run.asynchronous), sum(run.asynchronous)
        how = (f"asynchronous (get_num_new_matched_tokens: load_kv_async for {k} of {n} requests): each forward "
               f"ran after the worker's get_finished reported its requests loaded ({run.polls} polls)") if k else \
            f"synchronous (load_kv_async for none of {n} requests): each forward ran in its load's own step"
        print(f"  its loads: {how}")
    if run.before_load:
        print(f"  note: its loads are not ordered after the forward stream's earlier writes to their blocks "
              f"({run.before_load} write-after-write findings against the harness's poisoning, which stands for a "
              "zeroing or an earlier owner's writes: vllm-project/vllm#50696's class)")


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
