"""The harness's own work per replay, made cheap, keeps its teeth (CPU: the simulator, and plain tensors).

The poisoning and the look are captured into graphs and write each replay's row through a cursor on
the device: a stale replay is still caught at its own index of a batch, captured or not; a look
that went missing or ran twice is an error, not a verdict moved to its neighbour. The probe arena is
poisoned in one element a unit: a unit the forward did not write is still stale. The value comparison's
fast form agrees with isclose; join allocates no events after its first.
"""

from __future__ import annotations

import pytest
import torch

from harness.devices.sim import SimDevice
from harness.model.arena import arena_layout
from harness.model.stack import ProbeSet
from harness.protocol.layout import plan_layout
from harness.records.scenario import Backend, DType, Expect, Fault, ModelShape, Request, Scenario, Tolerance
from harness.records.trace import Kernel, Replay
from harness.run.oracle import Oracle, _not_within
from harness.run.replay import Replayer, Stopwatch
from harness.studies.checking_speed import checked_replayer
from tests.support.builders import SMALL_HYBRID, small_scenario
from tests.support.paths import PLUGINS

SHAPE = SMALL_HYBRID


@pytest.fixture
def some_skip(monkeypatch) -> str:
    monkeypatch.syspath_prepend(str(PLUGINS))
    return "some_replays_skip:schedule"


def scenario(**kw) -> Scenario:
    return small_scenario(**{**dict(name="graphs", batch=(Request(32, 4), Request(16, 2)), expect=Expect.CLEAN,
                                  fence="final_event", replays=10), **kw})


def replayer(s: Scenario) -> Replayer:
    return checked_replayer(SimDevice(), s)  # the loop run_scenario builds


def uncaptured(r: Replayer) -> Replayer:
    r.observer.poison_graph = r.observer.look_graph = None
    return r


@pytest.mark.parametrize("captured", [True, False])
def test_a_stale_replay_is_caught_at_its_own_index_of_a_batch(some_skip, captured):
    r = replayer(scenario(schedule=some_skip))
    assert (r.observer.poison_graph is not None and r.observer.look_graph is not None) is True
    if not captured:
        uncaptured(r)
    verdicts = list(r.replays(range(70), Fault()))  # a batch of 64, then one of 6
    assert [i for i, v in enumerate(verdicts) if v.stale] == [5, 37, 66]
    assert all(v.layers == {1} and v.slots for v in verdicts if v.stale)


def test_a_look_that_went_missing_is_an_error_not_a_shifted_verdict(some_skip):
    r = replayer(scenario(schedule=some_skip))
    graph = r.observer.look_graph
    assert graph is not None
    real, calls = graph.replay, []

    def replay() -> None:
        calls.append(1)
        if len(calls) != 3:  # the third replay's look never runs: every later row would shift
            real()

    graph.replay = replay  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="wrote 9 rows"):
        list(r.replays(range(10), Fault()))


def test_a_look_that_ran_twice_is_an_error_too(some_skip):
    r = replayer(scenario(schedule=some_skip))
    graph = r.observer.look_graph
    assert graph is not None
    real = graph.replay
    graph.replay = lambda: (real(), real())  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="wrote 8 rows"):
        list(r.replays(range(4), Fault()))


class _NoForward:
    """A runner that runs nothing: no probe is written."""

    def run(self) -> None:
        pass


def test_a_probe_unit_the_forward_did_not_write_is_stale_with_one_element_poisoned():
    r = replayer(scenario(fence="none"))
    assert not any(v.stale for v in r.replays(range(3), Fault()))  # the probes now hold ground truth
    r.runner = _NoForward()
    v = next(r.replays([3], Fault()))
    assert v.stale_reads == r.oracle.read_units  # every probe row kept last replay's (right) bytes
    # Teeth: without the probes' poison the same replay would look clean.
    runner = r.runner = r.tb.runner(Backend.FULL)
    assert not next(r.replays([4], Fault())).stale  # the probes hold ground truth again
    r.observer._firsts = torch.zeros(0, dtype=torch.long)
    r.observer.poison_graph = None  # the captured poisoning holds the old index
    r.runner = _NoForward()
    assert next(r.replays([5], Fault())).stale_reads == 0
    del runner


def test_the_traced_replay_shows_the_harness_kernels_not_a_graph():
    r = replayer(scenario())
    dev = r.tb.dev
    with dev.tracing() as trace:
        v = r(-1, Fault())
    assert not v.stale
    kernels = [op.what for op in trace.ops if isinstance(op, Kernel)]
    assert "poison probes" in kernels and "compare" in kernels
    harness = {r.observer.poison_graph.id, r.observer.look_graph.id}  # type: ignore[union-attr]
    assert not [op for op in trace.ops if isinstance(op, Replay) and op.graph in harness]


def test_the_stopwatch_splits_each_replays_device_time():
    r = replayer(scenario())
    sw = Stopwatch()
    sw.ready(r.tb.dev, r.tb.forward, 70)
    assert len(list(r.replays(range(70), Fault(), sw))) == 70
    assert sw.times.replays == 0  # nothing read inside the replay loop
    t = sw.read(r.tb.dev)
    assert t.replays == 70 and len(t.load_replay_each_ms) == 70 and len(sw.rows) == 70  # a Marks per replay
    assert t.load_replay_ms > 0 and t.poison_ms > 0 and t.look_ms > 0 and t.idle_ms >= 0
    assert sw.rows[0].begin is not None and sw.rows[0].looked is not None


def test_join_records_the_same_events_every_time():
    dev = SimDevice()
    a, b, c = dev.Stream("a"), dev.Stream("b"), dev.Stream("c")
    made = []
    real = dev.Event
    dev.Event = lambda **k: made.append(1) or real(**k)  # type: ignore[method-assign]
    with dev.stream(a):
        dev.join(a)
        first = len(made)
        for _ in range(5):
            dev.join(a)
    others = len(dev._made_streams()) - 1  # b, c and the simulator's default stream
    assert first == others == 3 and len(made) == others  # one per other stream, once
    # and each join still orders `a` after the work enqueued on `b` before it
    out = torch.zeros(1)
    with dev.stream(b):
        dev.delay(100.0)
        dev.launch(lambda: out.fill_(1.0))
    with dev.stream(a):
        dev.join(a)
        seen = []
        dev.launch(lambda: seen.append(float(out[0])))
    dev.synchronize()
    assert seen == [1.0]
    del c


def test_the_value_comparison_agrees_with_isclose():
    g = torch.Generator().manual_seed(3)
    want = torch.randn(4096, generator=g).to(torch.bfloat16)
    got = want.clone()
    got[::7] += (torch.randn(got[::7].shape, generator=g) * 0.02).to(torch.bfloat16)
    got[1::97] = float("nan")
    got[2::101] = float("inf")
    got[3::103] = float("-inf")
    for rtol, atol in ((1e-2, 1e-2), (0.0, 0.0), (1e-3, 1e-5)):
        want_f = want.float()
        fast = _not_within(got, want_f, atol + rtol * want_f.abs())
        ref = ~torch.isclose(got.float(), want.float(), rtol=rtol, atol=atol)
        assert torch.equal(fast, ref)
        into = torch.zeros_like(ref)
        _not_within(got, want_f, atol + rtol * want_f.abs(), out=into)  # the comparer's form
        assert torch.equal(into, ref)
        assert ref.any() and not ref.all()


def _layout():
    shape = ModelShape(layers="AMAM", hidden=16, heads=2, kv_heads=1, head_dim=8, state=4, conv=3, expand=2,
                       page_size=4, dtype=DType.FP32)
    return plan_layout(shape, (Request(prefix=5, new=3), Request(prefix=2, new=6)))


def test_an_infinite_truth_is_compared_as_isclose_does():
    layout = _layout()
    arena = arena_layout(layout)
    truth = torch.randn(arena.size, generator=torch.Generator().manual_seed(0))
    p = ProbeSet(layout, torch.device("cpu"))
    p.arena.copy_(truth)
    p.out[0, 0] = float("inf")
    oracle = Oracle(arena, p.arena.clone(), Tolerance())
    assert not oracle.judge(p.arena).stale  # inf == inf: close
    p.out[0, 0] = 1.0
    assert oracle.judge(p.arena).output_differs


def test_unit_starts_are_each_units_first_element():
    layout = _layout()
    p = ProbeSet(layout, torch.device("cpu"))
    p.arena.copy_(torch.arange(p.arena.numel(), dtype=p.arena.dtype))
    starts = [i for r in p.layout.unit_starts() for i in r]
    assert len(starts) == len(p.layout.units)
    firsts = [p.k[a, r, 0, 0] for a in range(p.k.shape[0]) for r in range(p.k.shape[1])]
    firsts += [p.v[a, r, 0, 0] for a in range(p.v.shape[0]) for r in range(p.v.shape[1])]
    assert [float(x) for x in firsts] == [float(p.arena[i]) for i in starts[:len(firsts)]]
    assert float(p.arena[starts[-1]]) == float(p.out[-1, 0])  # the last unit: the last output token
