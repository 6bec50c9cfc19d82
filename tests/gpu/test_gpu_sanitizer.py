"""harness.sanitizer on a GPU: the plain-PyTorch example (a side-stream H2D copy and a graph that
reads its target) and the default set's full-graph scenarios. Each race test has its fenced twin."""

from __future__ import annotations

import pytest
import torch

from harness.examples.h2d_graph_race import run
from harness.records.errors import RacesFound
from harness.sanitizer import sanitize

pytestmark = pytest.mark.gpu
pytest_plugins = ["pytester"]


# Under the sanitizer the example runs smaller and shorter: the sanitizer judges the order of the
# operations, which neither the copy's size nor the count of replays changes (the data runs keep both).
WATCHED = {"replays": 5, "numel": 1 << 20}


def test_the_example_is_stale_without_a_fence_and_the_sanitizer_says_why():
    assert run("none", 20) > 0  # the data: the replay reads the poison
    with sanitize() as s:
        run("none", **WATCHED)
    assert s.races, s.report()
    race = next(r for r in s.races if r.later.graph)
    assert race.kind.value == "read-after-write"
    assert race.earlier.use.site.operator == "aten::copy_" and not race.earlier.graph
    assert race.later.use.site.operator.startswith("aten::mul")
    assert race.later.use.span.overlaps(race.earlier.use.span)
    assert race.times == WATCHED["replays"]  # every replay
    assert any("h2d_graph_race.py" in f for f in race.later.use.site.stack)  # captured here
    assert any("h2d_graph_race.py" in f for f in race.later.replay_stack)  # replayed here


@pytest.mark.parametrize("fence", ["wait_stream", "event", "in_graph"])
def test_the_example_with_a_fence_is_clean_and_the_sanitizer_is_silent(fence):
    assert run(fence, 20) == 0
    with sanitize() as s:
        run(fence, **WATCHED)
    assert s.races == [], s.report()


def test_raise_on_race():
    with pytest.raises(RacesFound):
        with sanitize(raise_on_race=True):
            run("none", 3)


def test_an_eager_race_is_seen_as_pytorchs_sanitizer_sees_it():
    side = torch.cuda.Stream()
    x = torch.zeros(1 << 20, device="cuda")
    torch.cuda.synchronize()
    with sanitize() as s:
        with torch.cuda.stream(side):
            x.fill_(1)
        x.sum()
    assert [r.kind.value for r in s.races] == ["read-after-write"]
    torch.cuda.synchronize()
    with sanitize() as s:
        with torch.cuda.stream(side):
            x.fill_(1)
        torch.cuda.current_stream().wait_stream(side)
        x.sum()
    assert s.races == []


def test_the_fixture(pytester):
    # In this process (a subprocess would pay for torch and a CUDA context again, seconds of the gate).
    pytester.makepyfile(test_fix="""
        from harness.examples.h2d_graph_race import run

        def test_fenced(stream_sanitizer):
            run("wait_stream", 3)  # a race here would fail this test at teardown

        def test_unfenced(stream_sanitizer):
            run("none", 3)
    """)
    result = pytester.runpytest_inprocess("-p", "harness.frontends.pytest_plugin", "-p", "no:cacheprovider")
    try:
        # pytest counts the unfenced test's call as passed and its teardown as an error: 2 and 1.
        result.assert_outcomes(passed=2, errors=1)
    except AssertionError as e:  # the inner run's own words, not only its counts
        raise AssertionError(f"{e}\n{result.stdout.str()[-4000:]}\n{result.stderr.str()[-2000:]}") from None
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_unfenced*", "*read-after-write race*"])


@pytest.mark.parametrize("model", ["attention", "hybrid"])
def test_a_full_graph_scenario_races_unfenced_and_not_with_the_final_event(model):
    from harness.devices.cuda import CudaDevice
    from harness.input.scenario_file import default_files, load_files
    from harness.run.pipeline import run_scenario

    scenarios = {s.name: s for s in load_files(default_files())}
    dev = CudaDevice()
    found = {}
    for fence in ("none", "final_event"):
        with sanitize() as s:
            result = run_scenario(scenarios[f"{model}-full-{fence}"], dev, replays=5)
        assert result.error is None
        found[fence] = s
    assert found["none"].races, "unfenced full graph: no race found"
    assert any(r.later.graph or r.earlier.graph for r in found["none"].races)
    assert found["final_event"].races == [], found["final_event"].report()



def _reused_after_a_side_read(recorded: bool):
    """A tensor read on a side stream behind a long kernel, freed (`del`) with or without
    `record_stream(side)`, and the same size allocated and written on the allocating stream at once:
    (the new tensor got the old block, the side stream's read saw the new owner's values, the sanitizer)."""
    side, main = torch.cuda.Stream(), torch.cuda.current_stream()
    n = 1 << 20
    torch.cuda.synchronize()
    with sanitize() as s:
        x = torch.ones(n, device="cuda")
        side.wait_stream(main)
        with torch.cuda.stream(side):
            torch.cuda._sleep(20_000_000)  # tens of milliseconds: the read comes well after the reuse
            total = x.sum()
        if recorded:
            x.record_stream(side)
        old = x.data_ptr()
        del x
        y = torch.empty(n, device="cuda")
        y.fill_(2.0)
        main.wait_stream(side)
        torch.cuda.synchronize()
    return y.data_ptr() == old, total.item() != n, s


@pytest.mark.parametrize("recorded", [False, True])
def test_a_tensor_freed_while_a_side_stream_reads_it_races_with_its_next_owner_unless_recorded(recorded):
    stale = []
    for _ in range(3):
        reused, was_stale, s = _reused_after_a_side_read(recorded)
        stale.append(was_stale)
        if recorded:  # the allocator held the block back until the side stream's read was done
            assert not was_stale and s.races == [], s.report()
            continue
        assert reused  # handed out again at once, on the stream it was allocated on
        assert len(s.races) == 1, s.report()
        (race,) = s.races
        assert race.kind.value == "write-after-read", s.report()
        assert race.earlier.use.site.operator == "aten::sum" and race.earlier.freed
        assert race.later.use.site.operator == "aten::fill_.Scalar"
    assert any(stale) != recorded  # unrecorded, the side stream read the new owner's values
