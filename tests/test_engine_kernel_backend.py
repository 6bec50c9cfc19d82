"""The attention chain on a server's default I/O backend (`kernel`, `layer_first`) on a release
with the bug (0.5.22) and on the release with the fix (0.5.23), each release in its own process
(`make test-engine`; a release missing from `.engines/` is installed there with --no-deps, as
`make engine-matrix` does).

Every load op must have gone through the release's `HiCacheController.move_indices` on the
kernel backend (the host rows moved to the device without a wait, the device slots left
there) and every layer through the harness's stand-in for the compiled kernel, given device
index tensors it never reads on the host. The release's own `PrefillCudaGraphRunner.execute`
must then replay before the load lands on 0.5.22 (stale in every replay) and wait for it on
0.5.23 (clean in the data and in the happens-before analysis); without the engine's wait
(`execute-nowait`) it is stale on both.
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
import torch
from harness.devices.sim import SimDevice
from harness.engines import sglang as adapter
from harness.engines.sglang_load import EngineLoad
from harness.frontends.engine_matrix import FILES, SMALL
from harness.run.pipeline import run_scenario
from harness.run.scenario_file import load_file

eng = adapter.load()
calls = {"moves": 0, "kernel": 0, "backends": set(), "host_read": 0}
cls = eng.controller.HiCacheController
move = cls.move_indices
def moved(self, host_indices, device_indices):
    calls["moves"] += 1
    calls["backends"].add(self.io_backend)
    return move(self, host_indices, device_indices)
cls.move_indices = moved
given = set()
copy = EngineLoad._copy_layer
def kernel(self, name, pairs, src, dst):
    calls["kernel"] += 1
    given.update({id(src), id(dst)})
    try:
        copy(self, name, pairs, src, dst)
    finally:
        given.clear()
EngineLoad._copy_layer = kernel
for name in ("tolist", "cpu", "item", "numpy", "__bool__", "__int__", "__index__", "__iter__"):
    method = getattr(torch.Tensor, name)
    def read(self, *a, _method=method, **k):
        if id(self) in given:
            calls["host_read"] += 1
        return _method(self, *a, **k)
    setattr(torch.Tensor, name, read)
rows = []
for s in load_file(FILES[0]):
    if s.model.layers.strip("A") or not s.fence.startswith("engine_execute"):
        continue
    s = s.with_overrides(model=dataclasses.replace(s.model, **SMALL))
    calls.update(moves=0, kernel=0, host_read=0)
    r = run_scenario(s, SimDevice(), replays=3)
    rows.append(dict(name=s.name, fence=s.fence, layers=s.model.num_layers, expect=s.expect.value,
                     observed=r.observed and r.observed.value, stale=r.tally.stale_replays,
                     replays=r.tally.replays, findings=len(r.findings), error=r.error,
                     moves=calls["moves"], kernel=calls["kernel"], host_read=calls["host_read"]))
print(json.dumps({"version": eng.version, "backends": sorted(calls["backends"]), "rows": rows}))
"""


@pytest.mark.parametrize("release, fixed", [("0.5.22", False), ("0.5.23", True)])
def test_the_kernel_backend_chain_is_stale_before_the_fix_and_clean_with_it(release, fixed):
    target = em.install(release, em.ROOT / ".engines")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(target), str(em.ROOT)]))
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=900,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    assert doc["version"] == release and doc["backends"] == ["kernel"]
    rows = doc["rows"]
    assert {r["fence"] for r in rows} == {"engine_execute", "engine_execute_nowait"}
    for r in rows:
        assert r["error"] is None, r
        assert r["moves"] >= r["replays"] == 3, r  # every replay's load op: the engine's move_indices
        assert r["kernel"] == r["moves"] * r["layers"], r  # and the kernel's stand-in, every layer
        assert r["host_read"] == 0, r  # never a host read of the kernel's index tensors
        if fixed and r["fence"] == "engine_execute":
            assert (r["observed"], r["stale"], r["findings"]) == ("clean", 0, 0), r
        else:
            assert r["observed"] == "race" and r["stale"] == r["replays"] and r["findings"], r
        assert r["expect"] == r["observed"], r  # the scenario file says the same per release
