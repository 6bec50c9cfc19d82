"""The figures before they become PNGs: what can be told apart, what is in which panel, what stays visible."""

from __future__ import annotations

import itertools
import json

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex

from harness.report.plots import (
    MIN_BAR_PX,
    PARALLEL_TIMELINES,
    SPAN_STYLES,
    detection_figure,
    fence_cost_figure,
    sweep_panels,
    timeline_figure,
    timeline_png,
    timeline_pngs,
)
from harness.report.schema import SPAN_KINDS, load
from tests.support.paths import ROOT

FULL = load(ROOT / "tests" / "data" / "report" / "results-full.json")
DEFAULT = load(ROOT / "reports" / "samples" / "default-h200" / "results.json")
# The sweep of an older build (7fb9eaa: five arms, p10-p90, no hidden size), kept as test data: how
# a file of that shape reads and draws, whatever the committed sample holds now.
BENCH = load(ROOT / "tests" / "data" / "report" / "bench-older.json")


def _drawn(fig):
    """Lay the figure out as the PNG would be, and return its renderer."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def _data_lines(ax) -> list:
    """The plotted series, in drawing order (not error bars' caps, nor reference lines)."""
    if ax.containers:
        return [c.lines[0] for c in ax.containers]
    return [line for line in ax.get_lines() if line.get_label() and not line.get_label().startswith("_")]


# ---- detection ----------------------------------------------------------------------------


@pytest.mark.parametrize("doc", [FULL, DEFAULT], ids=["full", "default-h200"])
def test_detection_lines_stay_apart_and_say_how_many_replays(doc):
    fig = detection_figure(doc["scenarios"])
    ax = fig.axes[0]
    lines = _data_lines(ax)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert len(lines) == len(labels) >= 3
    assert all("replays per delay" in label and "n=" in label for label in labels)
    assert len({(line.get_marker(), str(line.get_linestyle())) for line in lines}) == len(lines)
    # Lines that agree everywhere (never stale) still sit apart: no two share an x.
    for a, b in itertools.combinations(lines, 2):
        assert not set(a.get_xdata()) & set(b.get_xdata())


def test_detection_counts_the_pooled_replays():
    labels = [t.get_text() for t in detection_figure(FULL["scenarios"]).axes[0].get_legend().get_texts()]
    assert labels == ["breakable+none (n=100 replays per delay)", "full+final_event (n=300 replays per delay)",
                      "full+none (n=300 replays per delay)"]


def test_detection_delays_are_evenly_spaced_and_their_labels_do_not_collide():
    doc = json.loads(json.dumps(DEFAULT))
    fig = detection_figure(doc["scenarios"])
    ax = fig.axes[0]
    renderer = _drawn(fig)
    ticks = ax.get_xticklabels()
    assert [t.get_text() for t in ticks] == ["0", "5", "20", "50", "200", "1000"]
    assert list(ax.get_xticks()) == [0, 1, 2, 3, 4, 5]
    boxes = [t.get_window_extent(renderer) for t in ticks]
    assert all(a.x1 < b.x0 for a, b in itertools.pairwise(boxes))


# ---- fence cost ---------------------------------------------------------------------------


def test_one_panel_per_sweep_axis_and_model():
    panels = sweep_panels(BENCH["bench"]["points"])
    assert [(p.kind, p.key) for p in panels] == [("attention", "prefix"), ("attention", "layers"),
                                                 ("hybrid", "prefix"), ("hybrid", "layers")]
    for p in panels:
        held = "layers" if p.key == "prefix" else "prefix"
        assert len({q[held] for q in p.points}) == 1  # a line never joins one sweep to the other
        assert len({q[p.key] for q in p.points}) == 4
    assert [p.title for p in panels[:2]] == ["prefix sweep at 8 layers", "layer sweep at 2048 cached tokens"]


def test_a_single_point_is_one_panel():
    points = [p for p in BENCH["bench"]["points"] if (p["model"], p["layers"], p["prefix"]) == ("attention", 8, 2048)]
    fig = fence_cost_figure({"points": points})
    assert [ax.get_title() for ax in fig.axes if ax.get_visible()] == ["attention: 8 layers, 2048 cached tokens"]


def test_fence_cost_arms_can_be_told_apart_and_none_is_marked_wrong():
    fig = fence_cost_figure(BENCH["bench"])
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert len(visible) == 4
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["none (unfenced: wrong)", "final_event", "layerwise_graph", "host_sync", "eager_fallback"]
    for ax in visible:
        lines = _data_lines(ax)
        assert len(lines) == 5
        assert len({(line.get_marker(), str(line.get_linestyle())) for line in lines}) == 5
        none = lines[0]
        assert to_hex(none.get_color()) == "#c62828" and none.get_linestyle() == ":"
        # final_event and host_sync cost the same: side by side, never on top of each other.
        final_event, host_sync = lines[1], lines[3]
        assert all(a != b for a, b in zip(final_event.get_xdata(), host_sync.get_xdata(), strict=True))


# ---- timelines ----------------------------------------------------------------------------


def _span(stream, name, kind, start, end, **extra) -> dict:
    return {"stream": stream, "name": name, "kind": kind, "start_us": start, "end_us": end, **extra}


TIMELINE = {"clock": "virtual", "stale_layers": [1], "fault": "delay 1000us each", "spans": [
    _span("load", "wait e1", "wait", 0, 0),
    _span("forward", "poison", "harness", 0, 20),
    _span("forward", "record e1", "record", 20, 20),
    _span("load", "delay 1000us", "delay", 25, 1025),
    _span("load", "H2D k[L0, slots 16:36]", "copy", 1025, 1025.02),
    _span("load", "H2D k[L1, slots 16:36]", "copy", 1025.02, 1025.04),
    _span("load", "gate 3", "gate", 1025.04, 1025.04),
    _span("forward", "L0.qkv", "kernel", 30, 32),
    _span("forward", "L1 attention", "access", 40, 60),
    _span("forward", "compare", "harness", 1030, 1032),
]}


@pytest.fixture(scope="module")
def timeline():
    fig = timeline_figure("tiny-full-none", TIMELINE)
    _drawn(fig)
    return fig


def test_lanes_forward_first_and_the_fault_in_the_title(timeline):
    ax = timeline.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["forward stream\npool kernels, compute kernels",
                                                             "load stream\nH2D copies, injected delay, gate"]
    assert ax.get_title(loc="left") == "tiny-full-none: one replay under delay 1000us each; stale layers 1"


def _bars(ax, colour: str) -> list:
    return [c for c in ax.collections if to_hex(c.get_facecolor()[0], keep_alpha=False) == colour]


def test_short_spans_are_drawn_at_least_a_few_pixels_wide(timeline):
    ax = timeline.axes[0]
    for kind in ("copy", "kernel", "gate"):
        bars = _bars(ax, SPAN_STYLES[kind].colour)
        assert bars, kind
        for bar in bars:
            box = bar.get_paths()[0].get_extents().transformed(ax.transData)
            assert box.width >= MIN_BAR_PX - 0.5, kind


def test_the_harness_looks_unlike_the_work_under_test(timeline):
    ax = timeline.axes[0]
    harness = _bars(ax, "#ffffff")
    assert len(harness) == 2
    assert all(c.get_linestyle()[0][1] is not None for c in harness)  # dashed outline
    assert all(c.get_hatch() == SPAN_STYLES["harness"].hatch for c in harness)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(label.startswith("harness's own work") and "not under test" in label for label in labels)


def test_records_stale_marks_gates_and_delays_differ(timeline):
    ax = timeline.axes[0]
    records = [line for line in ax.get_lines() if line.get_marker() == SPAN_STYLES["record"].marker]
    assert len(records) == 1
    stale = [c for c in ax.collections if c.get_hatch() == "///"]
    assert len(stale) == 2  # layer 1's copy and the read that beat it
    assert all(to_hex(c.get_edgecolor()[0]) == "#d50000" for c in stale)
    gate, delay = SPAN_STYLES["gate"], SPAN_STYLES["delay"]
    assert gate.colour != delay.colour and gate.hatch and not delay.hatch


def test_every_span_kind_has_a_style_of_its_own():
    assert set(SPAN_KINDS.values) == set(SPAN_STYLES)
    looks = {(s.colour, s.hatch, s.marker) for s in SPAN_STYLES.values()}
    assert len(looks) == len(SPAN_STYLES)


def test_many_timelines_drawn_side_by_side_are_the_bytes_drawn_one_by_one():
    timelines = {f"t{i}": {**TIMELINE, "stale_layers": [i % 2]} for i in range(PARALLEL_TIMELINES)}
    timelines["none"] = None  # a scenario without a timeline keeps its place, with no picture
    drawn = timeline_pngs(timelines)
    assert list(drawn) == list(timelines) and drawn["none"] is None
    assert all(drawn[n] == timeline_png(n, t) for n, t in timelines.items() if t)
