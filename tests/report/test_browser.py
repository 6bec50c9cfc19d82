"""report.html in a real browser: it loads with no console message, every plot decodes, its
tables fit a 1,400 px window and a long report's index finds every timeline.

Headless Chromium dumps the DOM after the page's load event, when the page's own script has
written onto <body> the count of decoded images (data-images-shown), of table boxes that had to
scroll sideways (data-wide-overflow) and of index links whose target is on the page
(data-index-targets of data-index-links). Console messages (script errors,
Content-Security-Policy violations) go to Chromium's log on stderr as CONSOLE lines.

Skipped where Chromium is missing, unless FENCE_HARNESS_BROWSER_TEST=required (CI sets it
after installing Chromium, so a broken install fails instead of skipping).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.report.html import write_html
from harness.report.schema import load
from tests.support.paths import ROOT

FULL = ROOT / "tests" / "data" / "report" / "results-full.json"
LONG = ROOT / "reports" / "samples" / "gpu-test-h200" / "results.json"  # the gate's sample: long names


def _with_timelines(doc: dict) -> int:
    return sum(1 for s in doc["scenarios"] if s.get("timeline"))
WINDOW = (1400, 1000)
BROWSER = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)

if BROWSER is None and os.environ.get("FENCE_HARNESS_BROWSER_TEST") != "required":
    pytest.skip("no Chromium here (apt-get install chromium); .ci/run installs it", allow_module_level=True)


@dataclass
class Loaded:
    shown: int | None
    total: int | None
    overflowing: int | None  # table boxes wider than the page left them
    index_links: int | None
    index_targets: int | None
    console: list[str]


def open_page(path: Path, profile: Path) -> Loaded:
    assert BROWSER, "FENCE_HARNESS_BROWSER_TEST=required but no chromium on PATH"
    proc = subprocess.run(
        [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
         "--window-size={},{}".format(*WINDOW), "--dump-dom", path.resolve().as_uri()],
        capture_output=True, text=True, timeout=90,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    body = re.search(r"<body[^>]*>", proc.stdout)
    assert body, proc.stdout[:500]

    def attribute(name: str) -> int | None:
        m = re.search(rf'{name}="(\d+)"', body.group(0))
        return int(m.group(1)) if m else None

    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    return Loaded(attribute("data-images-shown"), attribute("data-images-total"), attribute("data-wide-overflow"),
                  attribute("data-index-links"), attribute("data-index-targets"), console)


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    return write_html(load(FULL), tmp_path_factory.mktemp("report") / "report.html")


def test_the_report_loads_cleanly_and_shows_every_image(page, tmp_path):
    doc = load(FULL)
    loaded = open_page(page, tmp_path / "profile")
    assert loaded.console == []
    plots = 3 + sum(1 for s in doc["scenarios"] if s.get("timeline"))
    assert loaded.total == plots
    assert loaded.shown == plots
    assert loaded.overflowing == 0
    assert loaded.index_links == 0  # three timelines: no index


@pytest.fixture(scope="module")
def long_page(tmp_path_factory) -> Path:
    """The gate's sample (every scenario item with its timeline), one scenario failed with a long error."""
    doc = load(LONG)
    doc["scenarios"][5].update(met=False, observed=None, error="replay 17 timed out waiting on "
                               + "/very/long/path/without/any/space/" * 8 + " and then " + "x" * 120)
    return write_html(doc, tmp_path_factory.mktemp("long") / "report.html")


def test_the_scenario_table_fits_1400px_and_the_index_finds_every_timeline(long_page, tmp_path):
    loaded = open_page(long_page, tmp_path / "profile")
    assert loaded.console == []
    assert loaded.overflowing == 0
    drawn = _with_timelines(load(LONG))
    assert drawn > 30 and loaded.index_links == drawn and loaded.index_targets == drawn
    assert loaded.shown == loaded.total


def test_the_check_sees_a_table_that_does_not_fit(long_page, tmp_path):
    # The same page with its cells kept on one line, as before the table was made to wrap.
    text = long_page.read_text().replace("</style>", "td, th { white-space: nowrap !important; }</style>")
    bad = tmp_path / "nowrap.html"
    bad.write_text(text)
    assert open_page(bad, tmp_path / "profile").overflowing >= 1


def test_the_check_sees_a_broken_image_and_a_console_error(page, tmp_path):
    # The same page with one image's data cut short and a script the policy must refuse:
    # proof that the test above would fail on either.
    text = page.read_text()
    text = re.sub(r'src="data:image/png;base64,[^"]{64}', 'src="data:image/png;base64,AAAA', text, count=1)
    text = text.replace("</body>", "<script>console.error('not allowed')</script></body>")
    bad = tmp_path / "bad.html"
    bad.write_text(text)
    loaded = open_page(bad, tmp_path / "profile")
    assert loaded.shown == loaded.total - 1
    assert any("Content Security Policy" in line for line in loaded.console)


def test_the_statistics_pressure_and_skipped_sections_fit_too(tmp_path):
    # The long sample with every section a natural run adds: intervals, the pressure table, the
    # exact tests of pairs with long names, skipped scenarios and an until-confidence note.
    from harness.report.pairs import pairs

    doc = load(LONG)
    for s in doc["scenarios"]:
        s["name"] = f"natural-hybrid32-16k-pressure_same-{s['name']}"
    doc["pairs"] = pairs(doc["scenarios"])
    settings = {"gemm": 8192, "gemm_streams": 1, "copy_mib": 256, "copy": "both", "process": "separate"}
    doc["scenarios"][0]["pressure"] = {"mode": "separate process", "settings": settings, "pid": 4242, "exit_code": 0,
                                       "achieved": {"seconds": 12.5, "gemms": 9000, "copies": 2100,
                                                    "gemm_tflops": 412.0, "copy_gbps": 44.1}}
    doc["scenarios"][1]["confidence"] = {"target_width": 0.05, "level": 0.95, "cap": 10000, "width": 0.07,
                                         "reached": False}
    doc["skipped"] = [{"name": f"natural-gqa16-16k-full-none-{i}", "why": "runs only on cuda (devices in "
                       "scenarios/natural.toml), not on sim"} for i in range(27)]
    assert doc["pairs"]
    page = write_html(doc, tmp_path / "report.html")
    text = page.read_text()
    assert "<h2>Exact tests</h2>" in text and "<h2>Pressure</h2>" in text and "27 scenarios skipped" in text
    loaded = open_page(page, tmp_path / "profile")
    assert loaded.console == [] and loaded.overflowing == 0 and loaded.shown == loaded.total


def test_the_graph_check_fits_with_its_findings_open(tmp_path):
    # The long sample with a graph check on every scenario as the CUDA reader writes it: a driver's
    # kernel names, 32 steps, a long op-list mismatch, and every finding table unfolded.
    from harness.checkers.graph import GraphCheck, GraphFinding
    from harness.records.races import RaceKind
    from harness.records.trace import Region
    from harness.report.results import graph_entry

    kernel = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
              "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)")
    doc = load(LONG)
    for i, s in enumerate(doc["scenarios"]):
        region = Region("k", 31, 16, 16400)
        findings = [GraphFinding(RaceKind.READ_AFTER_WRITE, 21, 400 + n, kernel, f"L{n} attention", region, region,
                                 "load", "forward", 7 if n % 2 else None, (3, 4) if n == 2 else ())
                    for n in range(3 if i % 4 == 0 else 0)]
        entry = graph_entry(GraphCheck(findings=tuple(findings)))
        mismatch = ["graph 21: op 0 waits on event 101; the graph holds no node there; " * 4] if i == 1 else []
        entry["graphs"] = [{"graph": 21, "source": "cuda", "nodes": 412, "wait_nodes": 0, "record_nodes": 0,
                            "work_nodes": 400, "steps": [{"step": f"L{n} attention", "nodes": 12} for n in range(32)],
                            "mismatches": mismatch}]
        s["graph"] = entry
    page = write_html(doc, tmp_path / "report.html")
    text = page.read_text().replace("<details>", "<details open>")
    with_findings = len(range(0, len(doc["scenarios"]), 4))  # every fourth scenario has graph findings
    assert "<h2>Graph check</h2>" in text and text.count("graph findings</summary>") == with_findings
    page.write_text(text)
    loaded = open_page(page, tmp_path / "profile")
    assert loaded.console == [] and loaded.overflowing == 0 and loaded.shown == loaded.total
