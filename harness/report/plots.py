"""The report's figures, as PNG bytes.

Built with matplotlib's object-oriented Figure API and rendered by the Agg canvas that
`Figure.savefig` picks for PNG: no pyplot, so no global figure registry, no GUI backend and
nothing left open between reports. Each function returns None when its data is absent.
"""

from __future__ import annotations

from io import BytesIO

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from harness.report.summary import matrix_rows, variant_label
from harness.report.timeline import stale_marks

OUTCOME_COLOURS = {
    "killed": "#2e7d32",    # a mutant the harness caught
    "survived": "#c62828",  # a mutant it missed
    "clean": "#a5d6a7",     # a correct variant left alone
    "flagged": "#ef6c00",   # a correct variant reported anyway: a false alarm
    "error": "#9e9e9e",     # did not run to the end
}
EVIDENCE, NO_EVIDENCE = "#546e7a", "#eceff1"
DARK = {"#2e7d32", "#c62828", "#ef6c00", EVIDENCE}
KIND_COLOURS = {
    "copy": "#1e88e5", "record": "#6d4c41", "wait": "#8e24aa", "replay": "#43a047",
    "delay": "#bdbdbd", "gate": "#757575", "access": "#fdd835", "kernel": "#fff59d", "harness": "#cfd8dc",
    "sync": "#00897b",  # older results' host synchronize spans
}
STALE = "#d50000"
CONTAINERS = ("replay", "delay", "gate", "sync")


def _png(fig: Figure) -> bytes:
    buf = BytesIO()
    # No Software/Date metadata: the same results give the same bytes.
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def detection_png(scenarios: list[dict]) -> bytes | None:
    """P(stale replay) against injected delay, one line per backend+fence.

    Scenarios sharing a backend+fence (the attention, Mamba and hybrid models) are pooled:
    replays and stale replays are summed at each delay before dividing.
    """
    series: dict[str, dict[float, list[int]]] = {}
    for s in scenarios:
        for p in s.get("sweep") or []:
            acc = series.setdefault(variant_label(s), {}).setdefault(float(p["us"]), [0, 0])
            acc[0] += p["replays"]
            acc[1] += p["stale_replays"]
    if not series:
        return None
    fig = Figure(figsize=(7.5, 3.6), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    for label, points in sorted(series.items()):
        xs = sorted(points)
        ys = [points[x][1] / points[x][0] if points[x][0] else 0.0 for x in xs]
        ax.plot(xs, ys, marker="o", label=label)
    positive = [x for points in series.values() for x in points if x > 0]
    # symlog keeps the 0 us point (no injected delay) on a log-like axis.
    ax.set_xscale("symlog", linthresh=min(positive) if positive else 1.0)
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("injected delay (µs)")
    ax.set_ylabel("P(stale replay)")
    ax.set_title("Detection against injected delay")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return _png(fig)


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


def fence_cost_png(bench: dict | None) -> bytes | None:
    """Median time over the bound, one line per strategy across the sweep, a panel per model kind."""
    if not bench or not bench.get("points"):
        return None
    points = bench["points"]
    kinds = list(dict.fromkeys(p["model"] for p in points))
    strategies = list(dict.fromkeys(p["strategy"] for p in points))
    fig = Figure(figsize=(10.0, 3.4 * len(kinds)), dpi=100, layout="constrained")
    axes = fig.subplots(len(kinds), 1, squeeze=False)[:, 0]
    for ax, kind in zip(axes, kinds, strict=False):
        mine = [p for p in points if p["model"] == kind]
        shapes = list(dict.fromkeys((p["layers"], p["prefix"]) for p in mine))
        by_key = {(p["layers"], p["prefix"], p["strategy"]): p for p in mine}
        for strategy in strategies:
            xs, ys, lo, hi = [], [], [], []
            for i, shape in enumerate(shapes):
                p = by_key.get((*shape, strategy))
                if p is None:
                    continue
                ratio = p["ratio_to_bound"]
                # The p10-p90 spread, scaled from milliseconds onto the ratio axis.
                scale = ratio / p["median_ms"] if p["median_ms"] else 0.0
                xs.append(i)
                ys.append(ratio)
                lo.append(max(0.0, ratio - p["p10_ms"] * scale))
                hi.append(max(0.0, p["p90_ms"] * scale - ratio))
            ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=strategy)
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_xticks(range(len(shapes)), [f"{n} layers\n{pre} tokens" for n, pre in shapes], fontsize=8)
        ax.set_ylabel("median / max(load, compute)")
        ax.set_title(f"{kind}: end-to-end load-back + prefill over the bound (p10-p90 bars)")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize="small", ncols=len(strategies))
    return _png(fig)


def timeline_png(name: str, timeline: dict | None) -> bytes | None:
    """One lane per stream; stale layers' copies and the reads that beat them hatched in red."""
    if not timeline or not timeline.get("spans"):
        return None
    spans = timeline["spans"]
    stale = set(timeline.get("stale_layers") or [])
    lanes = list(dict.fromkeys(s["stream"] for s in spans))
    t0 = min(s["start_us"] for s in spans)
    t1 = max(s["end_us"] for s in spans)
    # Records and waits take no time; give them a sliver so they show.
    sliver = max(t1 - t0, 1e-9) * 0.004
    fig = Figure(figsize=(9, 1.3 + 0.6 * len(lanes)), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    for s, marked in zip(spans, stale_marks(timeline), strict=False):
        y = lanes.index(s["stream"])
        # Spans that hold others (a replay holds its accesses) are drawn full height underneath;
        # the short operations go on top, half height, so both stay visible.
        outer = s["kind"] in CONTAINERS
        height = 0.7 if outer else 0.4
        ax.broken_barh([(s["start_us"], max(s["end_us"] - s["start_us"], sliver))], (y - height / 2, height),
                       facecolors=KIND_COLOURS[s["kind"]], alpha=0.55 if outer else 1.0,
                       edgecolors=STALE if marked else "none", linewidth=1.5 if marked else 0,
                       hatch="///" if marked else None, zorder=1 if outer else 2)
    ax.set_yticks(range(len(lanes)), lanes)
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    ax.set_xlabel(f"time (µs, {timeline['clock']} clock)")
    layers = ", ".join(str(x) for x in sorted(stale)) or "none"
    ax.set_title(f"{name}: one replay, stale layers {layers}", fontsize=10)
    kinds = list(dict.fromkeys(s["kind"] for s in spans))
    handles = [Patch(color=KIND_COLOURS[k], label=k) for k in kinds]
    if stale:
        handles.append(Patch(facecolor="white", edgecolor=STALE, hatch="///", label="stale layer"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)
