"""Timeline lanes: one per stream that carries a span, named for the stream and what it carries
("forward stream: graph 21", "load stream: H2D copies, injected delay"), the same in the plot and
the Chrome trace; a stream that only records an event gets a thin lane with its marker in it."""

from __future__ import annotations

import time

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from harness.report.plots import THIN, lane_rows, timeline_figure
from harness.report.timeline import Lane, carries, chrome_trace, lanes, stream_name
from tests.support.paths import DATA


def _span(stream, name, kind, start, end) -> dict:
    return {"stream": stream, "name": name, "kind": kind, "start_us": start, "end_us": end}


# What the simulator traces for an unfenced full graph, cut short: the forward stream's replay of
# graph 21, the load stream's copies under a delay, the default stream's one start-event record.
SIM = {"clock": "virtual", "stale_layers": [0], "fault": "delay 1000us each", "spans": [
    _span("forward", "poison", "harness", 0, 20),
    _span("default", "record e29", "record", 25, 25),
    _span("load", "wait e29", "wait", 26, 26),
    _span("load", "delay 1000us", "delay", 26, 1026),
    _span("load", "H2D k[L0, slots 16:48]", "copy", 1026, 1027),
    _span("load", "record e30", "record", 1027, 1027),
    _span("forward", "replay graph 21", "replay", 30, 130),
    _span("forward", "compare", "harness", 1030, 1040),
]}


def test_streams_are_named_as_a_reader_calls_them():
    assert stream_name("forward") == "forward stream"
    assert stream_name("write-back") == "write-back stream"
    assert stream_name("host") == "host"  # the host is no stream
    assert stream_name("stream7") == "stream7"


def test_a_lane_names_its_work_and_only_then_what_orders_it():
    by = {lane.stream: lane for lane in lanes(SIM["spans"])}
    assert by["forward"].carries == "graph 21"  # not the harness's own steps around it
    assert by["load"].carries == "H2D copies, injected delay"  # not its waits and records
    assert by["default"].carries == "1 event record"
    assert [lane.label for lane in lanes(SIM["spans"])] == [
        "forward stream: graph 21", "load stream: H2D copies, injected delay", "default stream: 1 event record"]


def test_graphs_are_named_by_their_ids():
    replays = [_span("forward", f"replay graph {g}", "replay", i, i + 1) for i, g in enumerate((3, 5, 5))]
    assert carries(replays) == "graphs 3, 5"
    many = [_span("forward", f"replay graph {g}", "replay", g, g + 1) for g in (79, 82, 85, 88, 91)]
    assert carries(many) == "5 graphs: 79, 82, …, 91"
    assert carries([_span("forward", "graph replay", "replay", 0, 1)]) == "graph replay"  # an older file
    assert carries([_span("x", "w", "wait", 0, 0), _span("x", "r", "record", 0, 0)]) == "waits, event records"
    assert carries([_span("x", "odd", "novel", 0, 1)]) == "novel"  # a kind this report does not know


def test_only_streams_with_spans_get_a_lane_and_record_only_ones_are_thin():
    rows = lanes(SIM["spans"])
    assert [lane.stream for lane in rows] == ["forward", "load", "default"]
    assert [lane.marks_only for lane in rows] == [False, False, True]
    assert lane_rows(rows) == [0.5, 1.5, 2.0 + THIN / 2]


def _ticks(fig) -> list[tuple[float, str]]:
    ax = fig.axes[0]
    return list(zip(ax.get_yticks(), (t.get_text() for t in ax.get_yticklabels()), strict=True))


def _drawn_at(fig) -> set[float]:
    """The lane centres that hold something drawn: a bar's vertical middle, or a marker's lane."""
    ax = fig.axes[0]
    ys = set()
    for c in ax.collections:
        for path in c.get_paths():
            box = path.get_extents()
            ys.add(round((box.y0 + box.y1) / 2 * 4) / 4)  # bars are centred on their lane, to a quarter
    for line in ax.get_lines():
        ys.update(float(y) for y in line.get_ydata())
    return ys


def test_the_plot_labels_each_lane_and_draws_no_empty_one():
    fig = timeline_figure("sim-full-none", SIM)
    FigureCanvasAgg(fig).draw()
    ticks = _ticks(fig)
    assert [label for _, label in ticks] == ["forward stream\ngraph 21", "load stream\nH2D copies, injected delay",
                                             "default stream\n1 event record"]
    drawn = _drawn_at(fig)
    for centre, label in ticks:
        # A marker sits above a lane of work (centre - 0.3) or at the centre of a thin lane.
        assert any(abs(y - centre) <= 0.35 for y in drawn), f"lane {label!r} has nothing drawn in it"
    default = ticks[2][0]
    assert default in {float(y) for line in fig.axes[0].get_lines() for y in line.get_ydata()}


def test_a_long_title_wraps_instead_of_running_off_the_figure():
    from matplotlib.text import Text

    name = "writeback-store-no_write_fence-with-a-long-suffix-for-good-measure"
    fig = timeline_figure(name, {**SIM, "backup_stale_layers": [0, 1, 2, 3]})
    title = fig.axes[0].get_title(loc="left")
    assert "\n" in title and title.replace("\n", " ").startswith(name)
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    shown = next(t for t in fig.findobj(Text) if t.get_text() == title)
    extent = shown.get_window_extent(renderer)
    assert extent.x0 >= 0 and extent.x1 <= fig.bbox.width


def test_the_chrome_trace_names_its_threads_as_the_lanes():
    trace = chrome_trace(SIM, "sim-full-none")
    names = [e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"]
    assert names == [lane.label for lane in lanes(SIM["spans"])]


@pytest.fixture(scope="module")
def sim_timeline() -> dict:
    from harness.devices import open_device
    from harness.input.scenario_file import load_files
    from harness.report.results import build_results
    from harness.run.pipeline import run_scenario

    dev = open_device("sim")
    scenario = next(s for s in load_files([DATA / "tiny_attention.toml"]) if s.name == "tiny-full-none")
    doc = build_results([run_scenario(scenario, dev, replays=1)], dev.describe(), time.time(), time.time())
    return doc["scenarios"][0]["timeline"]


def test_a_simulator_run_names_its_lanes_by_stream_and_graph(sim_timeline):
    spans = sim_timeline["spans"]
    graph = next(s["name"] for s in spans if s["kind"] == "replay").removeprefix("replay ")
    rows = {lane.stream: lane for lane in lanes(spans)}
    assert rows["forward"] == Lane("forward", "forward stream", graph, False)
    assert rows["load"].label.startswith("load stream: H2D copies")
    assert all(not lane.stream.startswith("stream") for lane in rows.values())  # every stream by its name
    # A stream that only recorded an event (the scheduling side's start event) is a thin lane.
    assert all(lane.marks_only == all(s["kind"] == "record" for s in spans if s["stream"] == lane.stream)
               for lane in rows.values())
    fig = timeline_figure("tiny-full-none", sim_timeline)
    labels = [label for _, label in _ticks(fig)]
    assert labels[0] == f"forward stream\n{graph}" and len(labels) == len(rows)
