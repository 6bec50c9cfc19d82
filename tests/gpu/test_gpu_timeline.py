"""The stream timeline on a real GPU (skipped without CUDA): after many testbeds in one process,
each testbed's forward and load streams still have lanes of their own, named for what they carry.
torch hands its pooled CUDA streams out again (32 a priority, round robin), so a later testbed's
forward stream is a CUDA stream an earlier one made as its load stream."""

from __future__ import annotations

import pytest

from harness.input.scenario_file import default_files, load_files
from harness.run.pipeline import run_scenario

pytestmark = pytest.mark.gpu

DEFAULT = {s.name: s for s in load_files(default_files())}


def test_forward_and_load_keep_their_own_lanes_after_the_stream_pool_wraps():
    from harness.devices.cuda import CudaDevice

    dev = CudaDevice()
    scenario = DEFAULT["attention-full-final_event"]
    for _ in range(20):  # two streams a testbed: well past the pool's 32
        r = run_scenario(scenario, dev, replays=1)
        assert r.error is None, r.error
        lanes = {(sp.kind, sp.stream) for sp in r.timeline}
        assert {s for k, s in lanes if k == "copy"} == {"load"}, sorted(lanes)
        assert {s for k, s in lanes if k == "replay"} == {"forward"}, sorted(lanes)
