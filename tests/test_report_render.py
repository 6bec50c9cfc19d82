"""summary.md, report.html and Chrome traces from the committed sample and the richer fixture."""

from __future__ import annotations

import base64
import html
import json
import re
import sys
from pathlib import Path

import pytest

import harness.report
import harness.report.results
from harness.report.html import render_html, write_html
from harness.report.schema import load
from harness.report.summary import render_summary, write_summary
from harness.report.timeline import chrome_trace, stale_marks, write_chrome_trace

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = load(ROOT / "tests" / "data" / "report" / "results-h200-core.json")
FULL = load(ROOT / "tests" / "data" / "report" / "results-full.json")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _images(page: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)]


@pytest.fixture(scope="module")
def full_page() -> str:
    return render_html(FULL)


# ---- summary.md ---------------------------------------------------------------------------


def test_summary_of_the_sample():
    text = render_summary(SAMPLE)
    lines = text.splitlines()
    assert lines[0] == "**fence-harness** · device cuda · GPU NVIDIA H200 · torch 2.11.0+cu130 · 12/12 met"
    assert lines[2] == "| scenario | expected | observed | stale rate | findings |"
    assert lines[3] == "| --- | --- | --- | --- | --- |"
    assert "| mamba-full-none | race | race | 94.0% (188/200) | 16 |" in lines
    assert len([line for line in lines if line.startswith("| ")]) == 2 + 12  # header, rule, scenarios
    assert "Kill matrix" not in text


def test_summary_with_the_kill_matrix():
    text = render_summary(FULL)
    assert "**Kill matrix**: 7/8 mutants killed, 5/7 correct variants clean" in text
    assert "| scenario | role | outcome | stale rate | findings |" in text
    assert "| mutant.fence_on_layer0_event | mutant | killed | 63.0% | 12 |" in text
    assert "| correct.eager.gate | correct | error | 0.0% | 0 |" in text
    # Mutants first, then the correct variants.
    assert text.index("| correct.") > text.rindex("| mutant.")


def test_summary_marks_unmet_and_errors_and_escapes_pipes():
    doc = json.loads(json.dumps(SAMPLE))
    s = doc["scenarios"][1]
    s.update(met=False, observed=None, error="replay 3 timed out | after 30 s\nstill pending")
    doc["summary"].update(met=11, errors=1)
    text = render_summary(doc)
    assert "11/12 met · 1 errors" in text.splitlines()[0]
    row = next(line for line in text.splitlines() if line.startswith("| attention-full-final_event"))
    assert "❌" in row and "error: replay 3 timed out \\| after 30 s still pending" in row
    assert row.count(" | ") == 4


def test_summary_on_the_simulator_names_the_cpu():
    doc = json.loads(json.dumps(SAMPLE))
    doc["environment"] = {"device": "sim", "torch": "2.13.0+cpu", "cpu_model": "AMD EPYC 9654"}
    headline = render_summary(doc).splitlines()[0]
    assert headline == "**fence-harness** · device sim · CPU AMD EPYC 9654 · torch 2.13.0+cpu · 12/12 met"


# ---- report.html --------------------------------------------------------------------------


def test_the_sample_page_has_tables_and_no_plots():
    page = render_html(SAMPLE)
    # Environment: header, run id, started, finished, command (no git commit), the device's keys;
    # scenarios: header and 12.
    assert page.count("<tr") == 1 + 4 + len(SAMPLE["environment"]) + 1 + 12
    assert _images(page) == []
    assert "hybrid-eager-nowaits" in page and "NVIDIA H200" in page


def test_the_full_page_has_every_plot(full_page):
    images = _images(full_page)
    timelines = sum(1 for s in FULL["scenarios"] if s.get("timeline"))
    assert len(images) == 3 + timelines  # detection, kill matrix, fence cost, one per timeline
    assert all(png.startswith(PNG_MAGIC) for png in images)
    for heading in ("Detection against injected delay", "Mutant kill matrix", "Fence cost", "Stream timelines"):
        assert f"<h2>{heading}</h2>" in full_page


def test_each_plot_appears_only_with_its_data():
    doc = json.loads(json.dumps(FULL))
    del doc["bench"]
    doc["mutants"] = {"matrix": []}
    for s in doc["scenarios"][1:]:
        s.pop("sweep", None)
        s.pop("timeline", None)
    doc["scenarios"][0].pop("sweep")
    page = render_html(doc)
    assert len(_images(page)) == 1
    assert "Stream timelines" in page and "Detection" not in page and "Fence cost" not in page


def test_the_page_is_self_contained(full_page):
    # Nothing fetched: no URL in any src/href, no stylesheet or script file, and a policy
    # that would block one anyway.
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:|//|file:)""", full_page, re.I)
    assert "<link" not in full_page and "<script src" not in full_page and "@import" not in full_page
    policy = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', full_page).group(1)
    assert "default-src 'none'" in html.unescape(policy) and "img-src data:" in policy
    assert full_page.count("<script>") == 1


def test_text_from_the_results_is_escaped():
    doc = json.loads(json.dumps(SAMPLE))
    evil = '<script>alert("x")</script> & <img src=http://example.com/x>'
    doc["scenarios"][0]["findings"] = [evil]
    doc["scenarios"][0]["error"] = evil
    doc["environment"]["gpu"] = evil
    page = render_html(doc)
    assert evil not in page
    assert html.escape(evil) in page
    assert page.count("<script>") == 1 and page.count("<img") == 0


def test_without_matplotlib_the_page_says_so(monkeypatch):
    # As on a GPU runner that has torch and nothing else: importing the plots module fails.
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    monkeypatch.delitem(sys.modules, "harness.report.plots", raising=False)
    monkeypatch.delattr(harness.report, "plots", raising=False)
    page = render_html(FULL)
    assert _images(page) == [] and "No plots" in page and "<h2>Scenarios</h2>" in page


def test_the_report_uses_no_pyplot():
    # pyplot keeps global figures and may pick a GUI backend; the report builds Figures directly.
    for path in (ROOT / "harness" / "report").glob("*.py"):
        assert not re.search(r"matplotlib\.pyplot|import\s+pyplot", path.read_text()), path


# ---- atomic writes ------------------------------------------------------------------------


def _boom(*args, **kwargs):
    raise OSError("disk full")


@pytest.mark.parametrize("where", ["fsync", "replace"])
@pytest.mark.parametrize("writer", [write_summary, write_html], ids=["summary", "html"])
def test_a_crash_mid_write_keeps_the_previous_file(tmp_path, monkeypatch, where, writer):
    path = tmp_path / "out"
    path.write_text("previous report\n")
    monkeypatch.setattr(harness.report.results.os, where, _boom)
    with pytest.raises(OSError, match="disk full"):
        writer(SAMPLE, path)
    assert path.read_text() == "previous report\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary file left


def test_writers_replace_the_file(tmp_path):
    assert write_summary(SAMPLE, tmp_path / "summary.md").read_text() == render_summary(SAMPLE)
    write_html(SAMPLE, tmp_path / "report.html")
    assert (tmp_path / "report.html").read_text().startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html", "summary.md"]


# ---- Chrome trace -------------------------------------------------------------------------


def test_the_chrome_trace_has_one_thread_per_stream(tmp_path):
    scenario = next(s for s in FULL["scenarios"] if s["name"] == "attention-full-none")
    timeline = scenario["timeline"]
    path = write_chrome_trace(timeline, tmp_path / "trace.json", scenario["name"])
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    streams = list(dict.fromkeys(s["stream"] for s in timeline["spans"]))
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert sorted(names.values()) == sorted(streams) and len(set(names)) == len(streams)
    assert [e["args"]["name"] for e in events if e["name"] == "process_name"] == ["attention-full-none"]
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == len(timeline["spans"])
    for event, span in zip(complete, timeline["spans"], strict=False):
        assert names[event["tid"]] == span["stream"]
        assert event["ts"] == span["start_us"]  # microseconds, the format's unit
        assert event["dur"] == pytest.approx(span["end_us"] - span["start_us"])
        assert event["cat"] == span["kind"] and isinstance(event["pid"], int)
    copies = [e for e in complete if e["cat"] == "copy"]
    assert copies and all(e["args"]["stale"] for e in copies)  # every layer was stale here
    assert trace["otherData"] == {"clock": "virtual", "stale_layers": [0, 1, 2, 3]}


def test_span_layers_come_from_the_key_or_the_name():
    timeline = {"clock": "device", "stale_layers": [1], "spans": [
        {"stream": "load", "name": "H2D k[L1, slots 16:272]", "kind": "copy", "start_us": 0, "end_us": 2},
        {"stream": "load", "name": "copy", "kind": "copy", "start_us": 2, "end_us": 3, "layer": 0},
        {"stream": "forward", "name": "replay graph 3", "kind": "replay", "start_us": 1, "end_us": 9},
    ]}
    args = [e["args"] for e in chrome_trace(timeline)["traceEvents"] if e["ph"] == "X"]
    assert args == [{"kind": "copy", "layer": 1, "stale": True}, {"kind": "copy", "layer": 0, "stale": False},
                    {"kind": "replay"}]


def test_only_reads_that_beat_their_copy_are_marked_stale():
    spans = [
        ("load", "H2D k[L0, slots 16:272]", "copy", 50, 52),
        ("load", "H2D k[L1, slots 16:272]", "copy", 90, 95),
        ("forward", "L0 attention", "access", 10, 20),     # before L0 landed: stale
        ("forward", "L1 attention", "access", 20, 30),     # layer 1 read clean this replay
        ("forward", "L0 final state", "access", 60, 70),   # after L0 landed: the harness's look
        ("forward", "poison", "access", 0, 5),             # no layer
    ]
    timeline = {"clock": "virtual", "stale_layers": [0], "spans": [
        dict(zip(("stream", "name", "kind", "start_us", "end_us"), s, strict=False)) for s in spans]}
    assert stale_marks(timeline) == [True, False, True, False, False, False]


def test_the_committed_gpu_samples_validate_and_render():
    """reports/samples/*: real GPU runs (default set, kill matrix, benchmark) still read and render."""
    for name in ("default-h200", "mutants-h200", "bench-h200", "gpu-test-h200x2"):
        doc = load(ROOT / "reports" / "samples" / name / "results.json")  # load validates
        assert _images(render_html(doc)), name
