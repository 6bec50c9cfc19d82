"""The fault injector, hazards and kill matrix on a real GPU (skipped without CUDA)."""

from __future__ import annotations

import pytest

from harness.input.scenario_file import SCENARIO_DIR, default_files, load_file, load_files
from harness.protocol.loadback import plan_copies, stale_by_chunk
from harness.records.scenario import Expect, Fault, FaultKind
from harness.run.mutants import Role, classify, matrix_ok
from harness.run.pipeline import run_scenario
from harness.run.testbed import Testbed
from tests.support.replays import GATE_REPLAYS

pytestmark = pytest.mark.gpu

MATRIX = load_file(SCENARIO_DIR / "mutants" / "kill_matrix.toml")
FAULTS = {s.name: s for s in load_files(default_files())}


@pytest.fixture(scope="module")
def cuda():
    from harness.devices.cuda import CudaDevice

    return CudaDevice()


@pytest.mark.nightly  # the gate runs every variant as an item (--harness-mutants); this adds "every replay"
def test_kill_matrix_every_mutant_caught_in_the_data_and_every_correct_variant_clean(cuda):
    rows = [classify(run_scenario(s, cuda, replays=50)) for s in MATRIX]
    assert matrix_ok(rows), [(r.name, r.outcome.value, r.error) for r in rows if not r.ok]
    for r in rows:
        if r.role is Role.MUTANT:  # on the GPU the stale data itself shows, every replay
            assert r.stale_replays == r.replays, (r.name, r.stale_replays, r.replays)


def test_gate_makes_full_none_stale_in_every_replay_and_the_fence_clean(cuda):
    race = run_scenario(FAULTS["gate-full-none"], cuda, replays=GATE_REPLAYS)
    assert race.fault_mode == "gate (cuStreamWaitValue32)"
    assert race.tally.stale_replays == GATE_REPLAYS, race.tally
    fenced = run_scenario(FAULTS["gate-full-final_event"], cuda, replays=GATE_REPLAYS)
    assert fenced.error is None and fenced.tally.stale_replays == 0


def test_chunked_staleness_is_whole_chunks_late_in_copy_order(cuda):
    s = FAULTS["chunked-full-none"]
    assert s.fault == Fault(FaultKind.CHUNKED, 1000.0, chunks=4)  # gaps longer than a replay
    b = Testbed(s, cuda)
    chunks = plan_copies(b.layout, b.host, b.pool, 4)
    verdicts = []
    r = run_scenario(s, cuda, replays=GATE_REPLAYS, on_replay=lambda i, v: verdicts.append(v))
    assert r.error is None and r.tally.stale_replays == GATE_REPLAYS
    for v in verdicts:
        for layer, pieces, stale in stale_by_chunk(v.slots, chunks):
            # The stale slots are the late chunks: fresh chunks, at most one chunk caught in
            # flight (a copy is not atomic to a concurrent read), then wholly stale chunks.
            whole = [st == set(range(reg.start, reg.stop)) for st, reg in zip(stale, pieces, strict=False)]
            first = next((j for j, st in enumerate(stale) if st), len(stale))
            assert all(whole[j] for j in range(first + 1, len(stale))), (layer, stale)
            flags = [bool(st) for st in stale]
            assert flags == sorted(flags), (layer, flags)  # once late, later chunks are late too


def test_a_gate_never_opened_times_out_as_an_error_and_the_device_still_works(cuda, stuck_gate):
    s = FAULTS["gate-full-final_event"].with_overrides(schedule=stuck_gate)
    r = run_scenario(s, cuda, replays=3, timeout_s=2.0)
    assert r.error is not None and r.error.startswith("gate-timeout in replay"), r.error
    after = run_scenario(FAULTS["gate-full-final_event"], cuda, replays=5)
    assert after.error is None and after.tally.stale_replays == 0


def test_without_cuda_bindings_the_gate_falls_back_to_a_long_delay_and_says_so(cuda, monkeypatch):
    import harness.devices.cuda as cuda_module

    monkeypatch.setattr(cuda_module, "_driver", lambda: None)
    r = run_scenario(FAULTS["gate-full-none"], cuda, replays=20)
    assert r.fault_mode.startswith("delay 20000us first (gate fallback: cuda.bindings is not importable")
    assert r.tally.stale_replays == 20


def test_sweep_detection_rises_to_certainty_and_fenced_stays_clean(cuda):
    race = run_scenario(FAULTS["sweep-full-none"], cuda, replays=GATE_REPLAYS)
    assert [p.us for p in race.sweep] == [0, 5, 20, 50, 200, 1000]
    assert race.sweep[-1].tally.stale_rate == 1.0
    fenced = run_scenario(FAULTS["sweep-full-final_event"], cuda, replays=GATE_REPLAYS)
    assert fenced.tally.stale_replays == 0 and fenced.scenario.expect is Expect.CLEAN
