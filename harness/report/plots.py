"""The report's figures, as PNG bytes.

Built with matplotlib's object-oriented Figure API and rendered by the Agg canvas that
`Figure.savefig` picks for PNG: no pyplot, so no global figure registry, no GUI backend and
nothing left open between reports. Each `*_png` returns None when its data is absent; its
`*_figure` is the same drawing before rendering, for tests to look at.

Lines that can coincide (two strategies that cost the same, two variants that are never
stale) are told apart by marker, line style and a small sideways offset, and drawn widest
marker first so each stays visible over the others.
"""

from __future__ import annotations

import math
import multiprocessing
import os
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from io import BytesIO

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from harness.report.summary import (
    DEFAULT_HIDDEN,
    WRONG_ARM,
    arm_label,
    bench_arms,
    bench_points,
    matrix_rows,
    variant_label,
)
from harness.report.timeline import Lane, lanes, stale_marks

OUTCOME_COLOURS = {
    "killed": "#2e7d32",    # a mutant the harness caught
    "survived": "#c62828",  # a mutant it missed
    "clean": "#a5d6a7",     # a correct variant left alone
    "flagged": "#ef6c00",   # a correct variant reported anyway: a false alarm
    "error": "#9e9e9e",     # did not run to the end
}
EVIDENCE, NO_EVIDENCE = "#546e7a", "#eceff1"
DARK = {"#2e7d32", "#c62828", "#ef6c00", EVIDENCE}
STALE = "#d50000"


def _png(fig: Figure) -> bytes:
    buf = BytesIO()
    # No Software/Date metadata: the same results give the same bytes.
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def _png_of(fig: Figure | None) -> bytes | None:
    return None if fig is None else _png(fig)


# ---- line styles shared by the detection and fence-cost plots ------------------------------


@dataclass(frozen=True)
class LineStyle:
    colour: str
    marker: str
    dashes: str | tuple
    size: float  # marker size; series are drawn largest first
    hollow: bool = True


SERIES = (
    LineStyle("#1f77b4", "o", "-", 10),
    LineStyle("#ff7f0e", "s", "--", 8),
    LineStyle("#2ca02c", "^", "-.", 7),
    LineStyle("#9467bd", "D", (0, (5, 1.5)), 5.5, hollow=False),
    LineStyle("#8c564b", "v", (0, (1, 1.5)), 5, hollow=False),
    LineStyle("#17becf", "P", "-", 5, hollow=False),
)
# The unfenced arm is the wrong answer: red, dotted, crosses, whatever it costs.
WRONG = LineStyle("#c62828", "X", ":", 8, hollow=False)


def _line_kwargs(style: LineStyle) -> dict:
    return {"color": style.colour, "marker": style.marker, "linestyle": style.dashes,
            "markersize": style.size, "markeredgewidth": 1.5, "linewidth": 1.6,
            "markerfacecolor": "none" if style.hollow else style.colour}


def _offsets(n: int, step: float) -> list[float]:
    """Sideways offsets, centred on 0, that keep n coinciding points apart."""
    return [(i - (n - 1) / 2) * step for i in range(n)]


# ---- detection against injected delay -----------------------------------------------------


def _detection_series(scenarios: list[dict]) -> dict[str, dict[float, list[int]]]:
    """backend+fence -> delay -> [replays, stale replays], summed over the scenarios sharing it."""
    series: dict[str, dict[float, list[int]]] = {}
    for s in scenarios:
        for p in s.get("sweep") or []:
            acc = series.setdefault(variant_label(s), {}).setdefault(float(p["us"]), [0, 0])
            acc[0] += p["replays"]
            acc[1] += p["stale_replays"]
    return series


def _replays_text(points: dict[float, list[int]]) -> str:
    counts = sorted({n for n, _ in points.values()})
    n = str(counts[0]) if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"
    return f"n={n} replays per delay"


def detection_png(scenarios: list[dict]) -> bytes | None:
    return _png_of(detection_figure(scenarios))


def detection_figure(scenarios: list[dict]) -> Figure | None:
    """P(stale replay) against injected delay, one line per backend+fence.

    Scenarios sharing a backend+fence (the attention, Mamba and hybrid models) are pooled:
    replays and stale replays are summed at each delay before dividing. The delays are
    categories, evenly spaced (0, 5, 20, 50, 200, 1000 µs would crowd a log axis at its low end).
    """
    series = _detection_series(scenarios)
    if not series:
        return None
    delays = sorted({us for points in series.values() for us in points})
    fig = Figure(figsize=(8.5, 3.8), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    labels = sorted(series)
    for label, style, dx in zip(labels, _cycle(len(labels)), _offsets(len(labels), 0.12), strict=True):
        points = series[label]
        xs = sorted(points)
        ys = [points[x][1] / points[x][0] if points[x][0] else 0.0 for x in xs]
        ax.plot([delays.index(x) + dx for x in xs], ys, label=f"{label} ({_replays_text(points)})",
                **_line_kwargs(style))
    ax.set_xticks(range(len(delays)), [f"{us:g}" for us in delays])
    ax.set_xlim(-0.5, len(delays) - 0.5)
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("injected delay (µs)")
    ax.set_ylabel("P(stale replay)")
    ax.set_title("Detection against injected delay")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.01, 0.5))
    return fig


def _cycle(n: int) -> list[LineStyle]:
    return [SERIES[i % len(SERIES)] for i in range(n)]


# ---- the kill matrix ----------------------------------------------------------------------


def kill_matrix_png(mutants: dict | None) -> bytes | None:
    """One row per mutant or correct variant: its outcome, then each kind of evidence.

    Stale replays are the oracle's evidence, findings the happens-before analyser's; a mutant
    is killed on either, a correct variant flagged on either.
    """
    rows = matrix_rows(mutants)
    if not rows:
        return None
    fig = Figure(figsize=(10, 1.4 + 0.32 * len(rows)), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    grid = []
    for r, m in enumerate(rows):
        cells = [(m["outcome"], OUTCOME_COLOURS[m["outcome"]]),
                 (f"{m['stale_rate']:.0%}", EVIDENCE if m["stale_rate"] > 0 else NO_EVIDENCE),
                 (str(m["findings"]), EVIDENCE if m["findings"] > 0 else NO_EVIDENCE)]
        grid.append([_rgb(colour) for _, colour in cells])
        for c, (text, colour) in enumerate(cells):
            ax.text(c, r, text, ha="center", va="center", fontsize=8,
                    color="white" if colour in DARK else "black")
    ax.imshow(grid, aspect="auto")
    ax.set_xticks(range(3), ["outcome", "stale\nreplays", "findings"], fontsize=8)
    ax.xaxis.tick_top()
    ax.set_yticks(range(len(rows)), [m["name"] for m in rows], fontsize=8)
    # The variant in words on the right: the same rows, a second axis for their labels.
    right = ax.twinx()
    right.set_ylim(ax.get_ylim())
    right.set_yticks(range(len(rows)), [m["variant"] for m in rows], fontsize=7)
    for a in (ax, right):
        a.tick_params(length=0)
    ax.set_title("Mutant kill matrix")
    return _png(fig)


def _rgb(colour: str) -> tuple[float, float, float]:
    h = colour.lstrip("#")
    r, g, b = (int(h[i:i + 2], 16) / 255 for i in (0, 2, 4))
    return r, g, b


# ---- fence cost ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Panel:
    """One sweep axis of one model kind: the points where everything but `key` is held."""

    kind: str
    key: str  # the point's key that varies: "prefix" or "layers"
    title: str  # "prefix sweep at 8 layers"
    points: list[dict]


def sweep_panels(points: list[dict]) -> list[Panel]:
    """Per model kind, a prefix sweep (at its most common layer count) and a layer sweep (at its
    most common prefix), each only where it varies; a single point is a panel of its own.

    `fence-harness bench` sweeps prefixes at 8 layers and layer counts at 2,048 tokens: the
    point they share belongs to both, and no line joins one sweep to the other.
    """
    panels = []
    models = dict.fromkeys((p["model"], p.get("hidden", DEFAULT_HIDDEN)) for p in points)
    several = len({h for _, h in models}) > 1
    for model, hidden in models:
        # A model kind at one hidden size is one family of panels; the size is named where it varies.
        kind = f"{model}, hidden {hidden}" if several else model
        mine = [p for p in points if p["model"] == model and p.get("hidden", DEFAULT_HIDDEN) == hidden]
        layers = Counter(p["layers"] for p in mine).most_common(1)[0][0]
        prefix = Counter(p["prefix"] for p in mine).most_common(1)[0][0]
        by_prefix = [p for p in mine if p["layers"] == layers]
        by_layers = [p for p in mine if p["prefix"] == prefix]
        found = []
        if len({p["prefix"] for p in by_prefix}) > 1:
            found.append(Panel(kind, "prefix", f"prefix sweep at {layers} layers", by_prefix))
        if len({p["layers"] for p in by_layers}) > 1:
            found.append(Panel(kind, "layers", f"layer sweep at {prefix} cached tokens", by_layers))
        panels += found or [Panel(kind, "prefix", f"{layers} layers, {prefix} cached tokens", by_prefix)]
    return panels


def _arm_styles(arms: list[str]) -> dict[str, LineStyle]:
    right = [a for a in arms if a != WRONG_ARM]
    styles = dict(zip(right, _cycle(len(right)), strict=True))
    return {a: WRONG if a == WRONG_ARM else styles[a] for a in arms}


def _draw_panel(ax, panel: Panel, arms: list[str], styles: dict[str, LineStyle]) -> None:
    xs_all = sorted({p[panel.key] for p in panel.points})
    octaves = math.log2(max(xs_all) / min(xs_all))
    # Offsets in octaves: the axis is log2, so each arm sits the same distance from its point.
    for arm, dx in zip(arms, _offsets(len(arms), 0.045 * max(1.0, octaves / 4)), strict=True):
        mine = sorted((p for p in panel.points if p["strategy"] == arm), key=lambda p: p[panel.key])
        if mine:
            ys, spread = _ratios(mine)
            ax.errorbar([p[panel.key] * 2 ** dx for p in mine], ys, yerr=spread, capsize=2.5,
                        label=arm_label(arm), **_line_kwargs(styles[arm]))
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs_all, [str(x) for x in xs_all])
    ax.minorticks_off()
    pad = 2 ** max(0.3, 0.08 * octaves)
    ax.set_xlim(min(xs_all) / pad, max(xs_all) * pad)
    ax.set_xlabel({"prefix": "cached prefix (tokens)"}.get(panel.key, panel.key))
    ax.set_ylabel("median / max(load, compute)")
    ax.set_title(f"{panel.kind}: {panel.title}", fontsize=10)
    ax.grid(axis="y", alpha=0.3)


def _ratios(points: list[dict]) -> tuple[list[float], list[list[float]]]:
    """Each point's median over the bound, and its IQR (p10-p90 in older runs) scaled from
    milliseconds onto that ratio, as errorbar's [below, above]."""
    ys, lo, hi = [], [], []
    for p in points:
        ratio = p["ratio_to_bound"]
        scale = ratio / p["median_ms"] if p["median_ms"] else 0.0
        low, high = (p["p25_ms"], p["p75_ms"]) if "p25_ms" in p else (p["p10_ms"], p["p90_ms"])
        ys.append(ratio)
        lo.append(max(0.0, ratio - low * scale))
        hi.append(max(0.0, high * scale - ratio))
    return ys, [lo, hi]


def fence_cost_png(bench: dict | None) -> bytes | None:
    return _png_of(fence_cost_figure(bench))


def fence_cost_figure(bench: dict | None) -> Figure | None:
    """Median time over the bound, one line per strategy, a panel per model kind and sweep axis."""
    points = bench_points(bench)
    if not points:
        return None
    panels = sweep_panels(points)
    kinds = list(dict.fromkeys(p.kind for p in panels))
    cols = max(Counter(p.kind for p in panels).values())
    arms = bench_arms(bench)
    styles = _arm_styles(arms)
    fig = Figure(figsize=(max(9.0, 5.2 * cols), 0.7 + 3.3 * len(kinds)), dpi=100, layout="constrained")
    axes = fig.subplots(len(kinds), cols, squeeze=False)
    used = set()
    for kind_row, kind in enumerate(kinds):
        for col, panel in enumerate(p for p in panels if p.kind == kind):
            _draw_panel(axes[kind_row][col], panel, arms, styles)
            used.add((kind_row, col))
    for r in range(len(kinds)):
        for c in range(cols):
            axes[r][c].set_visible((r, c) in used)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(arms), 5), fontsize="small")
    fig.suptitle("End-to-end load-back + prefill over the bound max(load, compute); bars: IQR",
                 fontsize=11)
    return fig


# ---- stream timelines ---------------------------------------------------------------------


@dataclass(frozen=True)
class SpanStyle:
    """How one kind of span is drawn: a bar within its lane (`top` and `height` in lane units,
    the lane being 1 tall, centred on its row), or a marker for a moment that takes no time."""

    label: str
    colour: str
    top: float = -0.2
    height: float = 0.4
    hatch: str | None = None
    edge: str = "none"
    dashed: bool = False
    alpha: float = 1.0
    z: int = 3
    marker: str | None = None


SPAN_STYLES = {
    # What holds other work, drawn full height underneath it.
    "replay": SpanStyle("graph replay", "#a5d6a7", -0.36, 0.72, alpha=0.7, z=1),
    "delay": SpanStyle("injected delay", "#d6d6d6", -0.36, 0.72, z=1),
    "gate": SpanStyle("injected gate", "#ffe0b2", -0.36, 0.72, hatch="xx", edge="#ef6c00", z=1),
    "sync": SpanStyle("host synchronize", "#80cbc4", -0.36, 0.72, z=1),  # older results
    # The work itself, half height on top.
    "copy": SpanStyle("copy (load-back, H2D)", "#1e88e5"),
    "d2h": SpanStyle("copy (write-back, D2H)", "#00897b", hatch="\\\\", edge="#004d40"),
    "access": SpanStyle("kernel on the pools", "#f9a825"),
    "kernel": SpanStyle("eager compute kernel", "#6a1b9a"),
    "wait": SpanStyle("stream wait", "#ec407a", -0.12, 0.24, z=4),
    "record": SpanStyle("event record", "#263238", marker="v", z=5),
    # Not under test: thin, hollow and dashed along the lane's lower edge.
    "harness": SpanStyle("harness's own work (poison, observe, compare): not under test", "white", 0.24, 0.12,
                         hatch="....", edge="#607d8b", dashed=True, z=2),
}
MIN_BAR_PX = 3.0  # copies and kernels of a microsecond stay visible on a millisecond axis
LABEL_PX_PER_CHAR = 4.5  # at the harness labels' 6.5 pt
FIG_W = 11.0  # inches, the legend's column included
THIN = 0.5  # the height of a lane of only event records, against 1 for a lane of work
TITLE_CHARS = 110  # a longer title wraps rather than run off the figure


def _timeline_title(name: str, timeline: dict) -> str:
    import textwrap

    layers = ", ".join(str(x) for x in sorted(set(timeline.get("stale_layers") or []))) or "none"
    under = f" under {timeline['fault']}" if timeline.get("fault") else ""
    backup = ", ".join(str(x) for x in sorted(set(timeline.get("backup_stale_layers") or [])))
    wrong_copy = f"; host copy wrong: layers {backup}" if backup else ""
    return textwrap.fill(f"{name}: one replay{under}; stale layers {layers}{wrong_copy}", TITLE_CHARS)


def lane_rows(rows: list[Lane]) -> list[float]:
    """Each lane's centre on the y axis, top down: a lane of work 1 tall, a lane of only event
    records THIN, so a stream that only records an event takes little room and still shows it."""
    centres, top = [], 0.0
    for lane in rows:
        height = THIN if lane.marks_only else 1.0
        centres.append(top + height / 2)
        top += height
    return centres


def _draw_span(ax, s: dict, y: float, marked: bool, px_per_us: float, thin: bool = False) -> None:
    style = SPAN_STYLES[s["kind"]]
    min_w = MIN_BAR_PX / px_per_us
    if style.marker is not None:
        # Above the bars of a lane of work; at the centre of a lane that holds nothing else.
        ax.plot([s["start_us"]], [y if thin else y - 0.3], marker=style.marker, color=style.colour, markersize=6,
                linestyle="none", zorder=style.z)
        return
    width = max(s["end_us"] - s["start_us"], min_w)
    ax.broken_barh([(s["start_us"], width)], (y + style.top, style.height), facecolors=style.colour,
                   alpha=style.alpha, edgecolors=STALE if marked else style.edge,
                   linewidth=1.5 if marked or style.edge != "none" else 0,
                   linestyle="--" if style.dashed else "-", hatch="///" if marked else style.hatch,
                   zorder=style.z + (1 if marked else 0))
    # The harness's steps are named where the name fits: they are what the eye must not take
    # for the work under test.
    if s["kind"] == "harness" and width * px_per_us > LABEL_PX_PER_CHAR * len(s["name"]) + 6:
        ax.text(s["start_us"] + width / 2, y + style.top + style.height + 0.02, s["name"], ha="center",
                va="top", fontsize=6.5, color="#455a64", clip_on=True)


def _timeline_legend(spans: list[dict], stale: bool, backup_stale: bool = False) -> list:
    handles: list = []
    for kind in [k for k in SPAN_STYLES if any(s["kind"] == k for s in spans)]:
        style = SPAN_STYLES[kind]
        if style.marker is not None:
            handles.append(Line2D([], [], marker=style.marker, color=style.colour, linestyle="none",
                                  label=style.label))
        else:
            handles.append(Patch(facecolor=style.colour, edgecolor=style.edge, hatch=style.hatch,
                                 linestyle="--" if style.dashed else "-", label=style.label))
    if stale:
        handles.append(Patch(facecolor="white", edgecolor=STALE, hatch="///",
                             label="stale layer: its copy, and a read that beat it"))
    if backup_stale:
        handles.append(Patch(facecolor="white", edgecolor=STALE, hatch="///",
                             label="a write-back copy whose host copy came out wrong"))
    return handles


def timeline_png(name: str, timeline: dict | None) -> bytes | None:
    return _png_of(timeline_figure(name, timeline))


# A timeline takes matplotlib a few hundred milliseconds to lay out and render, and a gate run has
# dozens (over ten seconds, one after another): from this many on they are drawn in worker processes.
PARALLEL_TIMELINES = 8


def timeline_pngs(timelines: dict[str, dict | None]) -> dict[str, bytes | None]:
    """`timeline_png` of each (name -> timeline), the same bytes in the same order, drawn side by
    side in spawned processes when there are many (spawned, not forked: the caller may hold a CUDA
    context, which a forked child must not inherit)."""
    jobs = {name: t for name, t in timelines.items() if t and t.get("spans")}
    workers = min(len(jobs), os.cpu_count() or 1)
    drawn: dict[str, bytes | None] = dict.fromkeys(timelines)
    if len(jobs) >= PARALLEL_TIMELINES and workers > 1:
        try:
            with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
                chunk = -(-len(jobs) // workers)  # one batch a worker: each pays its start-up once
                drawn.update(zip(jobs, pool.map(timeline_png, jobs, jobs.values(), chunksize=chunk), strict=True))
            return drawn
        except (OSError, BrokenProcessPool):
            pass  # a host that cannot start processes: drawn here instead
    drawn.update((name, timeline_png(name, t)) for name, t in jobs.items())
    return drawn


def timeline_figure(name: str, timeline: dict | None) -> Figure | None:
    """One lane per stream that carries a span (forward, load, then others: `lanes`), labelled with
    the stream and what it carries; each kind of span in its own style (SPAN_STYLES); stale layers'
    copies and the reads that beat them hatched red."""
    if not timeline or not timeline.get("spans"):
        return None
    spans = [s for s in timeline["spans"] if s["kind"] in SPAN_STYLES]  # a kind it cannot draw: no lane
    if not spans:
        return None
    rows = lanes(spans)
    centres = lane_rows(rows)
    height = sum(THIN if lane.marks_only else 1.0 for lane in rows)
    t0 = min(s["start_us"] for s in spans)
    t1 = max(s["end_us"] for s in spans)
    handles = _timeline_legend(spans, bool(timeline.get("stale_layers")), bool(timeline.get("backup_stale_layers")))
    fig = Figure(figsize=(FIG_W, max(1.5 + 0.75 * height, 0.6 + 0.2 * len(handles))), dpi=100,
                 layout="constrained")
    ax = fig.add_subplot()
    ax.set_yticks(centres, [f"{lane.name}\n{lane.carries}" for lane in rows], fontsize=8.5)
    ax.set_ylim(height, 0)
    ax.set_xlim(t0 - (t1 - t0) * 0.01, t1 + (t1 - t0) * 0.02)
    ax.set_xlabel(f"time (µs, {timeline['clock']} clock)")
    ax.set_title(_timeline_title(name, timeline), fontsize=10, loc="left")
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    ax.grid(axis="x", alpha=0.3)
    # Lay out the frame first: its width in pixels is what a minimum width is measured in.
    fig.draw_without_rendering()
    x0, x1 = ax.get_xlim()
    px_per_us = ax.bbox.width / max(x1 - x0, 1e-9)
    where = {lane.stream: (y, lane.marks_only) for lane, y in zip(rows, centres, strict=True)}
    marks = stale_marks({**timeline, "spans": spans})
    for s, marked in zip(spans, marks, strict=True):
        _draw_span(ax, s, where[s["stream"]][0], marked, px_per_us, thin=where[s["stream"]][1])
    return fig
