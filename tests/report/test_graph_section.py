"""The graph check in report.html (and summary.md): the table of replayed graphs and each finding's
node, kernel, region and missing edge, from a run of the tiny pair on the simulator, which builds
the same graph model the CUDA device reads from the driver."""

from __future__ import annotations

import copy
import html
import re
import time

import pytest

from harness.checkers.graph import GraphFinding
from harness.records.races import RaceKind
from harness.records.trace import Region
from harness.report.html import missing_edge, render_html
from harness.report.summary import render_summary
from tests.support.paths import DATA

TINY = DATA / "tiny_attention.toml"


@pytest.fixture(scope="module")
def doc() -> dict:
    from harness.devices import open_device
    from harness.input.scenario_file import load_files
    from harness.report.results import build_results
    from harness.run.pipeline import run_scenario

    dev = open_device("sim")
    results = [run_scenario(s, dev, replays=3) for s in load_files([TINY])]
    return build_results(results, dev.describe(), time.time(), time.time())


def _section(page: str) -> str:
    start = page.index("<h2>Graph check</h2>")
    end = page.find("<h2>", start + 1)
    return page[start:end if end > 0 else None]


def _text(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", fragment.replace("<wbr>", "")))


def test_the_page_names_each_graph_finding_by_node_kernel_region_and_missing_edge(doc):
    unfenced, fenced = doc["scenarios"]
    assert unfenced["name"] == "tiny-full-none" and fenced["name"] == "tiny-full-final_event"
    records = unfenced["graph"]["finding_records"]
    assert records and fenced["graph"]["findings"] == []  # the race and its fenced twin
    section = _section(render_html(doc))
    # One <details> per scenario with findings: the unfenced one only.
    details = re.findall(r"<details><summary>(.*?)</summary>(.*?)</details>", section, re.S)
    assert [s for s, _ in details] == [f"tiny-full-none: {len(records)} graph findings"]
    rows = re.findall(r"<tr>(.*?)</tr>", details[0][1], re.S)[1:]  # after the header
    assert len(rows) == len(records)
    for row, record, sentence in zip(rows, records, unfenced["graph"]["findings"], strict=True):
        cells = [_text(c).split() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        node, kernel, access, load, missing = (" ".join(c) for c in cells)
        assert node == f"graph {record['graph']} node {record['node']}"
        assert kernel == f"{record['kernel']} step {record['step']}"
        assert access == f"reads {Region(**record['access_region'])} read-after-write"
        assert load == f"{Region(**record['copy_region'])} on load"
        assert missing == f"no wait node on event {record['event']} (recorded after that copy) reaches it, " \
                          "and forward waited on no such event before the replay"
        assert sentence.endswith(missing)


def test_the_page_and_the_summary_count_each_replayed_graph(doc):
    section = _text(_section(render_html(doc)))
    summary = render_summary(doc)
    n = len(doc["scenarios"][0]["graph"]["findings"])
    for name, found in (("tiny-full-none", n), ("tiny-full-final_event", 0)):
        g = next(s for s in doc["scenarios"] if s["name"] == name)["graph"]["graphs"][0]
        cells = [name, f"{g['graph']} ({g['source']})", g["nodes"], g["wait_nodes"], g["record_nodes"],
                 " · ".join(str(st["nodes"]) for st in g["steps"]), found, "matches"]
        assert " ".join(str(c) for c in cells) in " ".join(section.split())
        assert "| " + " | ".join(str(c) for c in cells) + " |" in summary


def test_no_graph_check_no_section(doc):
    bare = copy.deepcopy(doc)
    for s in bare["scenarios"]:
        s["graph"] = None  # as a scenario that ended before its traced replay
    page = render_html(bare)
    assert "Graph check" not in page and "graph findings" not in page
    assert "Graph check" in render_html(doc)


def test_a_mismatched_op_list_is_a_failed_row(doc):
    broken = copy.deepcopy(doc)
    broken["scenarios"][1]["graph"]["graphs"][0]["mismatches"] = ["step L0 attention: 2 kernels recorded, 1 node"]
    section = _section(render_html(broken))
    row = next(r for r in re.findall(r"<tr[^>]*>.*?</tr>", section, re.S) if "MISMATCH" in r)
    assert row.startswith('<tr class="fail">') and "tiny-full-final_<wbr>event" in row
    assert 'class="fail"' not in _section(render_html(doc))


def test_findings_without_records_are_listed_as_sentences(doc):
    old = copy.deepcopy(doc)
    del old["scenarios"][0]["graph"]["finding_records"]
    section = _section(render_html(old))
    sentences = doc["scenarios"][0]["graph"]["findings"]
    assert re.findall(r"<li>(.*?)</li>", section) == [html.escape(f) for f in sentences]


def _finding(event: int | None, flags: tuple[int, ...] = ()) -> GraphFinding:
    region = Region("k", 3, 16, 48)
    return GraphFinding(RaceKind.READ_AFTER_WRITE, 7, 12, "void at::native::elementwise_kernel<128, 2>", "L3 attention",
                        region, region, "load", "forward", event, flags)


@pytest.mark.parametrize(("finding", "edge"), [
    (_finding(5), "no wait node on event 5 (recorded after that copy) reaches it, and forward waited on no "
                  "such event before the replay"),
    (_finding(None), "no event is recorded after that copy on load"),
    (_finding(5, (2, 3)), "the value waits above it (flag 2, flag 3) may be released by a flag write not "
                          "ordered after that copy (written before it, or a previous load op's value never "
                          "re-armed)"),
])
def test_the_missing_edge_is_the_sentence_after_its_last_colon(finding, edge):
    assert missing_edge(finding.describe()) == edge
