"""A scenario's stream timeline as a Chrome trace (the JSON Perfetto and chrome://tracing open).

One process, one thread per stream (named by thread_name metadata, in `stream_order`), one
complete ("X") event per span with timestamps in microseconds, which is the format's own unit.
Each event's category is its span kind: "copy" for a host-to-device copy (the load-back), "d2h"
for a device-to-host copy (the write-back), so a trace viewer can show or hide either direction.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from harness.report.results import write_atomic

PID = 1
_LAYER = re.compile(r"\bL(\d+)\b")
# The work under test, the load-back it must wait for, then the write-back that must wait for it.
LEADING_STREAMS = ("forward", "load", "write-back")


def stream_order(spans: list[dict]) -> list[str]:
    """The streams of a timeline, top to bottom: forward, load, write-back, then any other (the
    capture side stream, the scheduler's) in order of first appearance. Every timeline of a
    report reads the same way, whichever stream happened to act first."""
    seen = list(dict.fromkeys(s["stream"] for s in spans))
    return [s for s in LEADING_STREAMS if s in seen] + [s for s in seen if s not in LEADING_STREAMS]


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
    tids = {stream: i + 1 for i, stream in enumerate(stream_order(spans))}
    events: list[dict] = [{"name": "process_name", "ph": "M", "pid": PID, "tid": 0, "args": {"name": name}}]
    for stream, tid in tids.items():
        meta = {"ph": "M", "pid": PID, "tid": tid}
        events.append({"name": "thread_name", **meta, "args": {"name": stream}})
        events.append({"name": "thread_sort_index", **meta, "args": {"sort_index": tid}})
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
