"""The verdict first: report.html opens with a banner (all met, N of M failed, partial), its scenario
table leads with the failures in a result column of words, the environment is collapsed and the
simulator's costs are a table; summary.md's first line says the same verdict.

The page is read with html.parser into a small tree, so each check is about structure (what is
inside what, in which order), not about the bytes of the markup."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from html.parser import HTMLParser

import pytest

from harness.records.device_settings import SimCosts
from harness.report.environment import cost_meanings, cost_rows, unit
from harness.report.html import render_html
from harness.report.schema import load
from harness.report.summary import Standing, render_summary, table_order, verdict
from tests.support.paths import DATA, ROOT

SAMPLE = load(ROOT / "tests" / "data" / "report" / "results-h200-core.json")
VOID = {"br", "wbr", "img", "meta", "hr", "input", "link"}


@dataclass
class Node:
    tag: str
    attrs: dict[str, str]
    children: list[Node | str] = field(default_factory=list)

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def all(self, tag: str, css: str | None = None) -> list[Node]:
        found = []
        for c in self.children:
            if isinstance(c, Node):
                if c.tag == tag and (css is None or css in c.classes):
                    found.append(c)
                found += c.all(tag, css)
        return found

    def one(self, tag: str, css: str | None = None) -> Node:
        found = self.all(tag, css)
        assert len(found) == 1, (tag, css, len(found))
        return found[0]

    def elements(self) -> list[Node]:
        return [c for c in self.children if isinstance(c, Node)]


class _Tree(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#root", {})
        self.stack = [self.root]

    def handle_starttag(self, tag, attrs):
        node = Node(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(node)
        if tag not in VOID:
            self.stack.append(node)

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        assert self.stack[-1].tag == tag, f"</{tag}> closes <{self.stack[-1].tag}>"
        self.stack.pop()

    def handle_data(self, data):
        self.stack[-1].children.append(data)


def parse(page: str) -> Node:
    tree = _Tree()
    tree.feed(page)
    tree.close()
    assert [n.tag for n in tree.stack] == ["#root"], "an element left open"
    return tree.root


def _doc(failed: tuple[str, ...] = (), **extra) -> dict:
    """The sample with the named scenarios failed (one as an error), and any top-level keys added."""
    doc = json.loads(json.dumps(SAMPLE))
    for s in doc["scenarios"]:
        if s["name"] in failed:
            s["met"] = False
    doc["summary"]["met"] = sum(s["met"] for s in doc["scenarios"])
    doc.update(extra)
    return doc


FAILED = ("mamba-full-final_event", "attention-breakable-none")


def _scenario_rows(body: Node) -> list[list[Node]]:
    table = body.one("table", "verdicts")
    return [row.all("td") for row in table.all("tr")[1:]]


# ---- the banner ---------------------------------------------------------------------------


def test_the_page_opens_with_the_verdict():
    body = parse(render_html(SAMPLE)).one("body")
    first = body.elements()
    assert [n.tag for n in first[:3]] == ["h1", "section", "details"]  # title, banner, the environment
    banner = first[1]
    assert banner.classes == {"verdict", "met"} and banner.attrs["role"] == "status"
    assert banner.one("p", "words").text() == "all 12 met"
    assert banner.one("p", "details").text() == "device cuda · GPU NVIDIA H200 · torch 2.11.0+cu130"


def test_a_failure_turns_the_banner_red_with_its_count():
    body = parse(render_html(_doc(FAILED))).one("body")
    banner = body.one("section", "verdict")
    assert banner.classes == {"verdict", "failed"}
    assert banner.one("p", "words").text() == "2 of 12 failed"
    assert verdict(_doc(FAILED)).standing is Standing.FAILED


def test_a_partial_banner_says_what_stopped_it_and_what_did_not_run():
    doc = _doc(partial=True, interrupted="SIGTERM", not_run=["a-left-over", "b-left-over"])
    banner = parse(render_html(doc)).one("body").one("section", "verdict")
    assert banner.classes == {"verdict", "partial"}
    assert banner.one("p", "state").text() == "partial: stopped by SIGTERM, 2 not run"
    assert [c.text() for c in banner.all("code")] == ["a-left-over", "b-left-over"]


def test_the_banners_colours_differ_and_a_failure_reads_red():
    from harness.report.html import STYLE

    rules = {css: STYLE.split(f"section.verdict.{css} {{")[1].split("}")[0] for css in ("met", "failed", "partial")}
    assert len(set(rules.values())) == 3
    assert "#c62828" in rules["failed"] and "#2e7d32" in rules["met"]


# ---- the scenario table -------------------------------------------------------------------


def test_failures_lead_the_table_then_the_rest_in_run_order():
    doc = _doc(FAILED)
    rows = _scenario_rows(parse(render_html(doc)))
    names = [r[1].text() for r in rows]
    in_order = [s["name"] for s in doc["scenarios"]]
    # The failures in the order they ran (attention-breakable-none ran before mamba-full-final_event).
    assert names[:2] == ["attention-breakable-none", "mamba-full-final_event"]
    assert names[2:] == [n for n in in_order if n not in FAILED]
    assert [s["name"] for s in table_order(doc["scenarios"])] == names


def test_the_result_column_reads_in_words_and_colour():
    rows = _scenario_rows(parse(render_html(_doc(FAILED))))
    results = [(r[0].text(), r[0].classes) for r in rows]
    assert results[:2] == [("FAILED", {"failed"})] * 2
    assert results[2:] == [("met", {"met"})] * 10
    table = parse(render_html(_doc(FAILED))).one("table", "verdicts")
    assert table.all("tr")[0].all("th")[0].text() == "result"


def test_skipped_scenarios_are_listed_with_their_reason_under_the_table():
    skipped = [{"name": "natural-a", "why": "runs only on cuda (devices in natural.toml), not on sim"},
               {"name": "natural-b", "why": "runs only on cuda (devices in natural.toml), not on sim"},
               {"name": "big-one", "why": "needs 80 GiB"}]
    doc = _doc(FAILED, skipped=skipped)
    body = parse(render_html(doc))
    assert len(_scenario_rows(body)) == 12  # the table of verdicts holds what ran
    listed = body.one("table", "skipped-list")
    header, *rows = listed.all("tr")
    assert [th.text() for th in header.all("th")] == ["skipped on this device", "scenarios"]
    assert [r.attrs["class"] for r in rows] == ["skipped"] * 2  # one row a reason
    assert [[td.text() for td in r.all("td")] for r in rows] == [
        ["2 scenarios skipped: runs only on cuda (devices in natural.toml), not on sim.", "natural-a, natural-b"],
        ["1 scenario skipped: needs 80 GiB.", "big-one"]]
    # Under the scenario table, before the findings.
    section = body.one("body").elements()
    tables = [n for n in section if n.tag == "div" and n.all("table")]
    kinds = [t.all("table")[0].classes for t in tables]
    assert kinds.index({"scenarios", "skipped-list"}) == kinds.index({"scenarios", "verdicts"}) + 1
    assert "3 skipped on this device" in body.one("section", "verdict").text()


def test_without_skipped_scenarios_there_is_no_list():
    assert not parse(render_html(SAMPLE)).all("table", "skipped-list")


# ---- the environment ----------------------------------------------------------------------


def test_the_environment_is_collapsed_under_one_line():
    body = parse(render_html(SAMPLE)).one("body")
    env = body.one("details", "environment")
    assert "open" not in env.attrs
    summary = env.elements()[0]
    assert summary.tag == "summary"
    assert summary.text() == "Environment: device cuda · torch 2.11.0+cu130 · no commit recorded"
    rows = env.one("table", "environment").all("tr")
    assert len(rows) == 1 + 4 + len(SAMPLE["environment"])  # header, run metadata, the device's keys
    assert not body.all("h2") or body.all("h2")[0].text() != "Environment"


def test_the_summary_line_names_the_commit_short():
    doc = _doc(git_commit="6624f1190b8b9746cc8b5dddd2e7a25a700e86aa")
    summary = parse(render_html(doc)).one("details", "environment").elements()[0]
    assert summary.text().endswith("· commit 6624f11")


def _sim_doc() -> dict:
    from harness.devices import open_device
    from harness.input.scenario_file import load_files
    from harness.report.results import build_results
    from harness.run.pipeline import run_scenario

    dev = open_device("sim", ["launch_us=7"])
    results = [run_scenario(s, dev, replays=2) for s in load_files([DATA / "tiny_attention.toml"])]
    return build_results(results, dev.describe(), time.time(), time.time())


@pytest.fixture(scope="module")
def sim_doc() -> dict:
    return _sim_doc()


def test_the_simulators_costs_are_a_table_with_units(sim_doc):
    page = render_html(sim_doc)
    env = parse(page).one("details", "environment")
    costs = env.one("table", "costs")
    header, *rows = costs.all("tr")
    assert [th.text() for th in header.all("th")] == ["cost", "value", "unit", "what it is"]
    cells = {r.all("td")[0].text(): [td.text() for td in r.all("td")[1:]] for r in rows}
    assert list(cells) == SimCosts.keys()
    assert cells["bandwidth_gbps"][:2] == [f"{SimCosts.bandwidth_gbps:g}", "GB/s"]
    meaning = f"host time to enqueue one op outside a graph (default {SimCosts.launch_us:g})"
    assert cells["launch_us"] == ["7", "µs", meaning]
    assert all(c[2] for c in cells.values())  # each says what it is
    # The costs' row holds the table, and nowhere is the mapping written out as JSON.
    assert '"launch_us"' not in page and "{&quot;" not in page


def test_each_cost_has_a_unit_and_a_meaning():
    assert set(cost_meanings()) == set(SimCosts.keys())
    assert all(unit(k) for k in SimCosts.keys())
    assert unit("bandwidth") == "" and unit("odd_suffix") == ""
    # A key an older model had keeps its value; it has no meaning to give.
    assert cost_rows({"old_us": 3.0, "launch_us": 5.0})[0] == ["old_us", "3", "µs", ""]


# ---- summary.md ---------------------------------------------------------------------------


@pytest.mark.parametrize(("failed", "first"), [
    ((), "✅ **fence-harness: all 12 met** · device cuda"),
    (FAILED, "❌ **fence-harness: 2 of 12 failed** · device cuda"),
])
def test_the_summarys_first_line_is_the_banners_verdict(failed, first):
    doc = _doc(failed)
    line = render_summary(doc).splitlines()[0]
    assert line.startswith(first)
    banner = parse(render_html(doc)).one("section", "verdict")
    assert banner.one("p", "words").text() in line and banner.one("p", "details").text() in line


def test_the_summary_table_leads_with_the_failures_too():
    text = render_summary(_doc(FAILED))
    rows = [line for line in text.splitlines() if line.startswith("| ") and line.split(" | ")[1] in ("race", "clean")]
    assert rows[0].startswith("| attention-breakable-none ❌ |") and rows[1].startswith("| mamba-full-final_event ❌ |")
