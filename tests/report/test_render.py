"""summary.md, report.html and Chrome traces from the committed sample and the richer fixture."""

from __future__ import annotations

import base64
import html
import json
import re
import sys

import pytest

import harness.report
import harness.report.results
from harness.report.html import INDEX_FROM, layer_ranges, render_html, write_html
from harness.report.schema import load
from harness.report.summary import headline, render_summary, write_summary
from harness.report.timeline import chrome_trace, stale_marks, stream_order, write_chrome_trace
from tests.support.paths import ROOT

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
    assert lines[0] == "✅ **fence-harness: all 12 met** · device cuda · GPU NVIDIA H200 · torch 2.11.0+cu130"
    assert lines[2].startswith("Stale rates with their 95% interval (Clopper-Pearson)")
    assert lines[4] == ("| scenario | expected | observed | stale rate | 95% interval | replays to see (99%) "
                        "| findings |")
    assert lines[5] == "| --- | --- | --- | --- | --- | --- | --- |"
    # The sample predates intervals: they are worked out from its counts.
    assert "| mamba-full-none | race | race | 94.0% (188/200) | 89.8%–96.9% | 2 | 16 |" in lines
    assert "| mamba-full-final_event | clean | clean | 0.0% (0/200) | 0.0%–1.8% | - | 0 |" in lines
    scenario_rows = lines[4:lines.index("", 4)]
    assert len(scenario_rows) == 2 + 12  # header, rule, scenarios
    assert "Kill matrix" not in text


def test_summary_with_the_kill_matrix():
    text = render_summary(FULL)
    assert "**Kill matrix**: 7/8 mutants killed, 5/7 correct variants clean" in text
    assert "| scenario | role | outcome | stale rate | data in | findings |" in text
    # A file from before rows said where the data showed: "-".
    assert "| mutant.fence_on_layer0_event | mutant | killed | 63.0% | - | 12 |" in text
    assert "| correct.eager.gate | correct | error | 0.0% | - | 0 |" in text
    # Mutants first, then the correct variants.
    assert text.index("| correct.") > text.rindex("| mutant.")


def test_summary_says_where_a_mutant_showed():
    doc = json.loads(json.dumps(FULL))
    row = next(m for m in doc["mutants"]["matrix"] if m["name"] == "mutant.fence_on_layer0_event")
    row.update(data_in=["host copy"], finding_kinds=["store-before-compute"])
    assert "| mutant.fence_on_layer0_event | mutant | killed | 63.0% | host copy | 12 (store-before-compute) |" in (
        render_summary(doc))


def test_summary_marks_unmet_and_errors_and_escapes_pipes():
    doc = json.loads(json.dumps(SAMPLE))
    s = doc["scenarios"][1]
    s.update(met=False, observed=None, error="replay 3 timed out | after 30 s\nstill pending")
    doc["summary"].update(met=11, errors=1)
    text = render_summary(doc)
    assert text.splitlines()[0] == ("❌ **fence-harness: 1 of 12 failed** · device cuda · GPU NVIDIA H200 · "
                                    "torch 2.11.0+cu130 · 1 error")
    row = next(line for line in text.splitlines() if line.startswith("| attention-full-final_event"))
    assert "❌" in row and "error: replay 3 timed out \\| after 30 s still pending" in row
    assert row.count(" | ") == 6
    # The failure leads the table, the rest follow in run order.
    rows = [line.split(" | ")[0].removeprefix("| ") for line in text.splitlines()[6:18]]
    assert rows == ["attention-full-final_event ❌"] + [s["name"] for s in doc["scenarios"] if s["met"]]


def test_summary_on_the_simulator_names_the_cpu():
    doc = json.loads(json.dumps(SAMPLE))
    doc["environment"] = {"device": "sim", "torch": "2.13.0+cpu", "cpu_model": "AMD EPYC 9654"}
    headline = render_summary(doc).splitlines()[0]
    assert headline == "✅ **fence-harness: all 12 met** · device sim · CPU AMD EPYC 9654 · torch 2.13.0+cpu"


# ---- report.html --------------------------------------------------------------------------


def test_the_sample_page_has_tables_and_no_plots():
    page = render_html(SAMPLE)
    # Environment: header, run id, started, finished, command (no git commit), the device's keys;
    # scenarios: header and 12; exact tests: header and the three full-graph pairs (none / final_event).
    assert page.count("<tr") == 1 + 4 + len(SAMPLE["environment"]) + 1 + 12 + 1 + 3
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
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    # A thread per stream, named as the plot's lane is: the stream, then what it carries.
    assert list(names.values()) == ["forward stream: graph replay, pool kernels",
                                    "load stream: H2D copies, injected delay", "host: synchronize"]
    assert [e["args"]["name"] for e in events if e["name"] == "process_name"] == ["attention-full-none"]
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == len(timeline["spans"])
    for event, span in zip(complete, timeline["spans"], strict=False):
        assert names[event["tid"]].startswith((f"{span['stream']} stream: ", f"{span['stream']}: "))
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
    for name in ("default-h200", "mutants-h200", "bench-h200", "gpu-test-h200"):
        doc = load(ROOT / "reports" / "samples" / name / "results.json")  # load validates
        assert _images(render_html(doc)), name


# ---- a partial run ------------------------------------------------------------------------


def _partial(why: str = "SIGTERM") -> dict:
    """The sample as if stopped after its first three scenarios."""
    doc = json.loads(json.dumps(SAMPLE))
    names = [s["name"] for s in doc["scenarios"]]
    doc["scenarios"] = doc["scenarios"][:3]
    doc["summary"] = {"scenarios": 3, "met": 3, "errors": 0}
    doc.update(partial=True, interrupted=why, not_run=names[3:])
    return doc


@pytest.mark.parametrize(("why", "words"), [("SIGINT", "stopped by SIGINT"), ("SIGTERM", "stopped by SIGTERM"),
                                            ("device-lost", "stopped when the device was lost")])
def test_a_partial_run_says_so_why_and_what_did_not_run(why, words):
    doc = _partial(why)
    assert headline(doc) == (f"all 3 met · partial: {words}, 9 not run · device cuda · GPU NVIDIA H200 · "
                             f"torch 2.11.0+cu130")
    text = render_summary(doc)
    assert text.splitlines()[0] == (f"⚠️ **fence-harness: all 3 met** · partial: {words}, 9 not run · device cuda · "
                                    f"GPU NVIDIA H200 · torch 2.11.0+cu130")
    assert f"**Partial run, {words} after 3 of 12 scenarios; 9 did not run.**" in text
    assert "Not run: `attention-eager-nowaits`, `mamba-full-none`, `mamba-full-final_event`," in text
    page = render_html(doc)
    assert '<section class="verdict partial"' in page
    assert f'<p class="state">partial: {words}, 9 not run</p>' in page
    assert all(f"<code>{n}</code>" in page for n in doc["not_run"])


def test_a_partial_run_rebuilt_from_the_journal_says_so():
    doc = _partial("killed")
    doc["rebuilt_from"] = "journal"
    assert "partial: killed, rebuilt from the journal, 9 not run" in headline(doc)
    del doc["not_run"]  # `fence-harness report DIR` after a kill: the journal knows only what finished
    assert headline(doc).startswith("all 3 met · partial: killed, rebuilt from the journal · device cuda")


def test_a_partial_run_with_a_failure_is_red():
    doc = _partial()
    doc["scenarios"][1]["met"] = False
    doc["summary"]["met"] = 2
    assert headline(doc).startswith("1 of 3 failed · partial: stopped by SIGTERM, 9 not run · ")
    assert '<section class="verdict failed"' in render_html(doc)
    assert render_summary(doc).startswith("❌ **fence-harness: 1 of 3 failed** · partial: stopped by SIGTERM")


def test_a_finished_run_has_no_partial_note():
    assert "partial" not in render_summary(SAMPLE).lower()
    page = render_html(SAMPLE)
    assert 'class="state"' not in page and '<section class="verdict met"' in page


def test_a_stopped_soak_has_no_scenario_count_and_no_list():
    # A soak draws scenarios until stopped: nothing is left over, and its file keeps only failures.
    doc = json.loads(json.dumps(SAMPLE))
    doc.update(scenarios=[], summary={"scenarios": 0, "met": 0, "errors": 0}, partial=True, interrupted="SIGINT",
               soak={"scenarios": 780, "twins": 195, "false_positives": 0, "missed_races": {"total": 2, "jitter": 2}})
    # With no scenario kept, what the soak counted is the verdict's words; no count of what did not run.
    assert headline(doc) == ("soak of 780 scenarios + 195 twins: 0 false positives, 2 missed races · partial: "
                             "stopped by SIGINT · device cuda · GPU NVIDIA H200 · torch 2.11.0+cu130")
    text = render_summary(doc)
    assert "**Partial run, stopped by SIGINT; this file holds what finished before it stopped.**" in text


# ---- the benchmark and the strategy check -------------------------------------------------


# The sweep of an older build (7fb9eaa: five arms, p10-p90, no hidden size), kept as test data: how
# a file of that shape reads and draws, whatever the committed sample holds now.
BENCH = load(ROOT / "tests" / "data" / "report" / "bench-older.json")


def _strategies(doc: dict) -> dict:
    doc = json.loads(json.dumps(doc))
    cells = [{"scenario": s, "strategy": st, "stale_replays": 2 if st == "none" else 0, "replays": 2,
              "findings": 16 if st == "none" else 0, "error": None, "ok": True}
             for s in ("attention-full-none", "mutant.no_fence") for st in ("none", "final_event", "host_sync")]
    cells[4].update(stale_replays=1, ok=False)  # mutant.no_fence@final_event went stale
    cells[5].update(error="device lost | mid-replay", ok=False)
    doc["strategies"] = {"cells": cells}
    return doc


def test_a_benchmark_summary_carries_its_numbers():
    text = render_summary(BENCH)
    lines = text.splitlines()
    # Nothing has an expectation: no sign, no "0/0 met"; what it holds is the first line's words.
    assert lines[0].startswith("**fence-harness: fence cost of 14 points × 5 arms** · device cuda · ")
    assert "met" not in lines[0]
    assert ("| model | layers | prefix | hidden | load ms | compute ms | none (unfenced: wrong) | final_event "
            "| layerwise_graph | host_sync | eager_fallback |") in lines
    # An older run's points: no hidden size (1,024), median (p10–p90) and the ratio to the bound,
    # per arm; the sweep's shared point once.
    assert ("| attention | 8 | 512 | 1024 | 0.43 | 1.10 | 1.32 (1.29–1.48) ×1.20 | 1.50 (1.49–1.55) ×1.36 "
            "| 1.38 (1.35–1.55) ×1.25 | 1.55 (1.53–1.62) ×1.41 | 3.64 (3.23–5.83) ×3.30 |") in lines
    assert sum(line.startswith("| attention | 8 | 2048 |") for line in lines) == 1
    assert len([line for line in lines if line.startswith(("| attention", "| hybrid"))]) == 14
    assert "| scenario |" not in text


def test_a_document_with_nothing_in_it_says_so():
    doc = json.loads(json.dumps(BENCH))
    doc["bench"] = None
    assert headline(doc).startswith("no scenarios · device cuda") and "0/0" not in headline(doc)
    assert '<section class="verdict none"' in render_html(doc)


def test_the_benchmark_page_has_its_table_right_after_the_plot():
    page = render_html(BENCH)
    section = page[page.index("<h2>Fence cost</h2>"):]
    assert section.index("<img") < section.index('<table class="bench">')
    assert section.count("<tr") == 1 + 14
    assert "1.32 (1.29–1.48)<br><small>×1.20</small>" in section
    assert "<h2>Scenarios</h2>" not in page


def test_the_strategy_check_is_a_table_in_both():
    doc = _strategies(SAMPLE)
    text = render_summary(doc)
    assert headline(doc).endswith("· strategy check 4/6 cells as expected")
    assert "| scenario | none (unfenced: wrong) | final_event | host_sync |" in text
    assert ("| attention-full-none | 2/2 stale, 16 findings, ok | 0/2 stale, 0 findings, ok "
            "| 0/2 stale, 0 findings, ok |") in text
    assert ("| mutant.no_fence ❌ | 2/2 stale, 16 findings, ok | 1/2 stale, 0 findings, NOT OK "
            "| error: device lost \\| mid-replay, NOT OK |") in text
    page = render_html(doc)
    table = page[page.index('<table class="strategies">'):]
    table = table[:table.index("</table>")]
    assert table.count("<tr") == 3 and table.count('<tr class="fail">') == 1
    assert "1/2 stale, 0 findings, NOT OK" in table


# ---- the scenario table and the index -----------------------------------------------------


def _many_timelines(n: int) -> dict:
    """The richer fixture with n scenarios, each with a timeline."""
    doc = json.loads(json.dumps(FULL))
    timeline = next(s["timeline"] for s in doc["scenarios"] if s.get("timeline"))
    base = doc["scenarios"][0]
    doc["scenarios"] = [{**base, "name": f"scenario-{i}.long_name@final_event", "timeline": timeline, "sweep": []}
                        for i in range(n)]
    doc["scenarios"][3]["met"] = False
    doc["summary"] = {"scenarios": n, "met": n - 1, "errors": 0}
    return doc


def test_the_scenario_table_links_to_timelines_and_lets_names_wrap(full_page):
    table = full_page[full_page.index('<table class="scenarios verdicts">'):]
    table = table[:table.index("</table>")]
    header = re.findall(r"<th>([^<]*)</th>", table)
    assert header == ["result", "scenario", "variant (hazard)", "fault", "expected", "observed", "stale rate",
                      "stale layers", "findings", "replays/s"]
    # A scenario with a timeline links to it; one without is plain text.
    assert '<a href="#timeline-attention-full-none">attention-full-none</a>' in table
    assert '<h3 id="timeline-attention-full-none">' in full_page
    assert ">attention-breakable-none<" in table and 'href="#timeline-attention-breakable-none"' not in table
    assert "full+none (raw)" in table and "delay (torch.cuda._sleep)" in table.replace("<wbr>", "")
    assert '<td class="wrap">race</td>' in table  # free text may wrap anywhere (the browser test measures it)


def test_names_break_after_separators_and_numbers_stay_whole():
    doc = json.loads(json.dumps(SAMPLE))
    doc["scenarios"][0].update(name="mutant.fence_on_layer0_event", error="replay timed out after 1.5 s")
    page = render_html(doc)
    assert "<td>mutant.<wbr>fence_<wbr>on_<wbr>layer0_<wbr>event</td>" in page
    assert '<td class="wrap">error: replay timed out after 1.5 s</td>' in page


def test_layer_lists_are_runs():
    assert layer_ranges({"0": 5, "1": 5, "2": 5, "3": 5, "7": 1, "9": 2, "10": 2}) == "0–3, 7, 9–10"
    assert layer_ranges({}) == "-"
    assert layer_ranges({"10": 1, "2": 1}) == "2, 10"


def test_a_long_report_opens_with_an_index_of_its_timelines():
    page = render_html(_many_timelines(INDEX_FROM + 1))
    nav = page[page.index('<nav class="index">'):page.index("</nav>")]
    targets = re.findall(r'href="#([^"]+)"', nav)
    assert len(targets) == INDEX_FROM + 1
    assert all(f'<h3 id="{t}">' in page for t in targets)
    assert nav.count('class="fail"') == 1  # the unmet scenario stands out
    assert page.index('<section class="verdict') < page.index("</nav>") < page.index("<h2>Scenarios</h2>")


def test_a_short_report_has_no_index(full_page):
    assert "<nav" not in full_page
    assert "<nav" not in render_html(_many_timelines(INDEX_FROM))


# ---- timelines: stream order and the fault in the trace -----------------------------------


def test_streams_keep_one_order_forward_load_then_the_rest():
    spans = [{"stream": s, "name": "x", "kind": "copy", "start_us": 0, "end_us": 1}
             for s in ("capture", "load", "host", "forward", "load")]
    assert stream_order(spans) == ["forward", "load", "capture", "host"]
    trace = chrome_trace({"clock": "virtual", "stale_layers": [], "spans": spans, "fault": "delay 5us each"})
    names = {e["args"]["name"]: e["tid"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    lanes = ["forward stream: H2D copies", "load stream: H2D copies", "capture stream: H2D copies",
             "host: H2D copies"]
    assert sorted(names, key=names.get) == lanes
    sort = {e["tid"]: e["args"]["sort_index"] for e in trace["traceEvents"] if e["name"] == "thread_sort_index"}
    assert [sort[names[s]] for s in lanes] == [1, 2, 3, 4]
    assert trace["otherData"]["fault"] == "delay 5us each"


def test_the_stale_layers_cell_names_the_host_copies_too_as_the_console_does():
    from harness.report.html import stale_layers_text

    both = {"stale_layers": {"0": 3, "1": 3}, "backup_stale_layers": {"2": 3, "3": 3}}
    assert stale_layers_text(both) == "0–1 host 2–3"
    assert stale_layers_text({"stale_layers": {}, "backup_stale_layers": {"0": 1, "1": 1}}) == "host 0–1"
    assert stale_layers_text({"stale_layers": {}}) == "-"  # a file from before the write-back
