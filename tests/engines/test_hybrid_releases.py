"""Mamba and hybrid models through SGLang's own hybrid load chain on a release with the bug
(0.5.22) and on the release with the fix (0.5.23), each release in its own process
(`make test-engine`; a release missing from `.engines/` is installed there with --no-deps,
as `make engine-matrix` does).

The release's own `PrefillCudaGraphRunner.execute` must replay before the load lands on
0.5.22 (stale in every replay) and wait for it on 0.5.23 (clean in the data and in the
happens-before analysis); with the engine's waits dropped it must be stale on both. Each
load op must have gone through `HybridCacheController.start_loading` and each Mamba layer
through `MambaPoolHost.load_to_device_per_layer`, so the verdicts are the chain's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("sglang", reason="the release folders need the engine venv's packages: `make test-engine`")

from harness.frontends import engine_matrix as em  # noqa: E402

CHILD = r"""
import dataclasses, json, logging, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
from harness.devices.sim import SimDevice
from harness.engines import sglang as adapter
from harness.frontends.engine_matrix import FILES, SMALL
from harness.run.pipeline import run_scenario
from harness.input.scenario_file import load_file

eng = adapter.load()
m = eng.modules
calls = {}

def spy(klass, name):
    original = getattr(klass, name)
    def counted(self, *a, **k):
        key = klass.__name__ + "." + name
        calls[key] = calls.get(key, 0) + 1
        return original(self, *a, **k)
    setattr(klass, name, counted)

spy(m[adapter.HYBRID].HybridCacheController, "start_loading")
spy(m[adapter.HOST_MAMBA].MambaPoolHost, "load_to_device_per_layer")
rows = []
for s in load_file(FILES[0]):
    if "M" not in s.model.layers or not s.fence.startswith("engine_execute"):
        continue
    s = s.with_overrides(model=dataclasses.replace(s.model, **SMALL))
    calls.clear()
    r = run_scenario(s, SimDevice(), replays=3)
    rows.append(dict(name=s.name, fence=s.fence, mamba_layers=len(s.model.mamba_layers), expect=s.expect.value,
                     observed=r.observed and r.observed.value, stale=r.tally.stale_replays,
                     replays=r.tally.replays, findings=len(r.findings), error=r.error,
                     loads=calls.get("HybridCacheController.start_loading", 0),
                     mamba_loads=calls.get("MambaPoolHost.load_to_device_per_layer", 0)))
print(json.dumps({"version": eng.version, "rows": rows}))
"""


@pytest.mark.parametrize("release, fixed", [("0.5.22", False), ("0.5.23", True)])
def test_mamba_and_hybrid_through_the_engines_chain_are_stale_before_the_fix_and_clean_with_it(release, fixed):
    target = em.install(release, em.ROOT / ".engines")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(target), str(em.ROOT)]))
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=900,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    assert doc["version"] == release
    rows = doc["rows"]
    assert {(r["name"].split(".")[1].split("-")[0], r["fence"]) for r in rows} == {
        (model, fence) for model in ("mamba", "hybrid") for fence in ("engine_execute", "engine_execute_nowait")}
    for r in rows:
        assert r["error"] is None, r
        assert r["loads"] >= r["replays"] == 3, r  # every replay's load op: the engine's controller
        assert r["mamba_loads"] == r["loads"] * r["mamba_layers"], r  # its Mamba host pool, every layer
        clean = fixed and r["fence"] == "engine_execute"
        if clean:
            assert (r["observed"], r["stale"], r["findings"]) == ("clean", 0, 0), r
        else:
            assert r["observed"] == "race" and r["stale"] == r["replays"] and r["findings"], r
        assert r["expect"] == r["observed"], r  # the scenario file says the same per release


INDEX_CHILD = r"""
import dataclasses, json, logging, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
from harness.devices.sim import SimDevice
from harness.engines import sglang as adapter
from harness.frontends.engine_matrix import FILES, SMALL
from harness.run.pipeline import run_scenario
from harness.input.scenario_file import load_file

eng = adapter.load()
rows = []
for s in load_file(next(f for f in FILES if f.name == "sglang_host_hit.toml")):
    if not s.model.indexer:
        continue
    r = run_scenario(s.with_overrides(model=dataclasses.replace(s.model, **SMALL)), SimDevice(), replays=3)
    rows.append(dict(name=s.name, expect=s.expect.value, observed=r.observed and r.observed.value,
                     not_restored=r.not_restored, stale=r.tally.stale_replays, replays=r.tally.replays,
                     findings=len(r.findings), error=r.error))
print(json.dumps({"version": eng.version, "rows": rows}))
"""


@pytest.mark.parametrize("release, restores", [("0.5.21", False), ("0.5.23", True)])
def test_a_host_hit_leaves_the_index_unrestored_before_its_host_pool_and_restores_it_after(release, restores):
    """sgl-project/sglang#39830 on the releases either side of the index's host pool: 0.5.21 restores
    the KV and the Mamba state and leaves the index of every attention layer as it was (wrong, in
    ground truth, whatever the fence); 0.5.23 restores it and orders its read."""
    target = em.install(release, em.ROOT / ".engines")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(target), str(em.ROOT)]))
    done = subprocess.run([sys.executable, "-c", INDEX_CHILD], env=env, capture_output=True, text=True, timeout=900,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    assert doc["version"] == release and len(doc["rows"]) == 5
    for r in doc["rows"]:
        assert r["error"] is None and r["expect"] == r["observed"], r
        if restores:
            assert r["not_restored"] is None and r["replays"] == 3, r
        else:
            assert r["observed"] == "wrong" and r["replays"] == 0 and not r["findings"], r
            assert r["not_restored"] == "idx[L3, slots 16:80], idx[L7, slots 16:80]", r  # page 0 is padding
