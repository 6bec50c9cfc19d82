"""A scenario's stream timeline as a Chrome trace (the JSON Perfetto and chrome://tracing open),
and the lanes both it and the report's plot draw: one per stream that carries a span, in
`stream_order`, each named for the stream and what it carries (`Lane`).

One process, one thread per lane (named by thread_name metadata), one complete ("X") event per
span with timestamps in microseconds, which is the format's own unit. Each event's category is its
span kind: "copy" for a host-to-device copy (the load-back), "d2h" for a device-to-host copy (the
write-back), so a trace viewer can show or hide either direction.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from harness.report.results import write_atomic

PID = 1
_LAYER = re.compile(r"\bL(\d+)\b")
_GRAPH = re.compile(r"\bgraph (\d+)\b")
# The work under test, the load-back it must wait for, then the write-back that must wait for it.
LEADING_STREAMS = ("forward", "load", "write-back")
HOST = "host"  # not a stream: the host's own synchronize (older results)
# What a lane carries, by span kind, in the order a label names them: the work first, then what
# only orders it. A graph replay is named by its graph ("graph 21"), as repro's trace rows are.
CARRIES = {
    "replay": "graph", "copy": "H2D copies", "d2h": "D2H copies", "access": "pool kernels",
    "kernel": "compute kernels", "delay": "injected delay", "gate": "gate", "sync": "synchronize",
    "wait": "waits", "record": "event records", "harness": "harness work",
}
ORDERING = ("wait", "record", "harness")  # named only on a lane that carries nothing else
MARKS = ("record",)  # kinds drawn as a moment, not a bar: a lane of only these is a thin one


def stream_order(spans: list[dict]) -> list[str]:
    """The streams of a timeline, top to bottom: forward, load, write-back, then any other (the
    capture side stream, the scheduler's) in order of first appearance. Every timeline of a
    report reads the same way, whichever stream happened to act first."""
    seen = list(dict.fromkeys(s["stream"] for s in spans))
    return [s for s in LEADING_STREAMS if s in seen] + [s for s in seen if s not in LEADING_STREAMS]


@dataclass(frozen=True)
class Lane:
    """One stream's row of a timeline: the stream, and what it is called there."""

    stream: str
    name: str      # "forward stream", "host"
    carries: str   # "graph 21", "H2D copies, injected delay", "1 event record"
    marks_only: bool  # nothing on it takes time: drawn as a thin lane

    @property
    def label(self) -> str:
        return f"{self.name}: {self.carries}"


def stream_name(stream: str) -> str:
    """A stream as a reader calls it: "forward" is the "forward stream"; the host is the host; a
    stream already called stream-something stays as it is."""
    if stream == HOST or stream.lower().startswith("stream"):
        return stream
    return f"{stream} stream"


def carries(spans: list[dict]) -> str:
    """What one stream's spans are, in a few words: its work ("graph 21", "H2D copies, injected
    delay"), or, where it has none, what orders it ("3 event records", "waits")."""
    kinds = [k for k in CARRIES if any(s["kind"] == k for s in spans)]
    work = [k for k in kinds if k not in ORDERING] or kinds
    words = []
    for kind in work:
        if kind == "replay":
            words.append(_graphs(spans))
        elif kind == "record" and work == ["record"]:
            n = sum(s["kind"] == "record" for s in spans)
            words.append("1 event record" if n == 1 else f"{n} event records")
        else:
            words.append(CARRIES[kind])
    others = sorted({s["kind"] for s in spans} - set(CARRIES))  # a kind this report does not know
    return ", ".join(words + others) or "nothing"


def _graphs(spans: list[dict]) -> str:
    ids = list(dict.fromkeys(m.group(1) for s in spans if s["kind"] == "replay"
                             for m in [_GRAPH.search(s["name"])] if m))
    if not ids:
        return "graph replay"
    if len(ids) == 1:
        return f"graph {ids[0]}"
    return f"graphs {', '.join(ids)}" if len(ids) <= 3 else f"{len(ids)} graphs: {ids[0]}, {ids[1]}, …, {ids[-1]}"


def lanes(spans: list[dict]) -> list[Lane]:
    """The timeline's lanes, top to bottom (`stream_order`): only streams that carry a span, so no
    lane is empty, each named for what it carries."""
    out = []
    for stream in stream_order(spans):
        mine = [s for s in spans if s["stream"] == stream]
        out.append(Lane(stream, stream_name(stream), carries(mine), all(s["kind"] in MARKS for s in mine)))
    return out


def span_layer(span: dict) -> int | None:
    """The span's layer: its `layer` key, else an "L<n>" in its name ("L2 copy k")."""
    if isinstance(span.get("layer"), int):
        return span["layer"]
    m = _LAYER.search(span["name"])
    return int(m.group(1)) if m else None


def stale_marks(timeline: dict) -> list[bool]:
    """Per span: is it a stale layer's copy, or a read of a stale layer that began before that
    layer's last copy ended (a read that beat its data), or a device-to-host copy of a layer
    whose host copy came out wrong (`backup_stale_layers`)?

    Later reads of the same layer, such as the harness's own look at the state after the
    fence, are not marked.
    """
    spans = timeline["spans"]
    stale = set(timeline.get("stale_layers") or [])
    backup = set(timeline.get("backup_stale_layers") or [])
    landed: dict[int | None, float] = {}  # looked up by span_layer(s), which may be None
    for s in spans:
        layer = span_layer(s)
        if s["kind"] == "copy" and layer in stale:
            landed[layer] = max(landed.get(layer, s["end_us"]), s["end_us"])
    marks = []
    for s in spans:
        layer = span_layer(s)
        if s["kind"] == "d2h":
            marks.append(layer in backup)
            continue
        early_read = s["kind"] == "access" and s["start_us"] < landed.get(layer, math.inf)
        marks.append(layer in stale and (s["kind"] == "copy" or early_read))
    return marks


def chrome_trace(timeline: dict, name: str = "fence-harness") -> dict:
    spans = timeline["spans"]
    stale = set(timeline.get("stale_layers") or [])
    rows = lanes(spans)
    tids = {lane.stream: i + 1 for i, lane in enumerate(rows)}
    events: list[dict] = [{"name": "process_name", "ph": "M", "pid": PID, "tid": 0, "args": {"name": name}}]
    for lane in rows:
        meta = {"ph": "M", "pid": PID, "tid": tids[lane.stream]}
        events.append({"name": "thread_name", **meta, "args": {"name": lane.label}})
        events.append({"name": "thread_sort_index", **meta, "args": {"sort_index": tids[lane.stream]}})
    for s, marked in zip(spans, stale_marks(timeline), strict=False):
        layer = span_layer(s)
        args = {"kind": s["kind"]}
        if layer is not None:
            args.update(layer=layer, stale=marked)
        events.append({
            "name": s["name"], "cat": s["kind"], "ph": "X", "pid": PID, "tid": tids[s["stream"]],
            "ts": s["start_us"], "dur": max(0.0, s["end_us"] - s["start_us"]), "args": args,
        })
    other = {"clock": timeline["clock"], "stale_layers": sorted(stale)}
    if timeline.get("backup_stale_layers"):
        other["backup_stale_layers"] = sorted(set(timeline["backup_stale_layers"]))
    if timeline.get("fault"):
        other["fault"] = timeline["fault"]
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def write_chrome_trace(timeline: dict, path: Path, name: str = "fence-harness") -> Path:
    path = Path(path)
    write_atomic(path, json.dumps(chrome_trace(timeline, name)) + "\n")
    return path
