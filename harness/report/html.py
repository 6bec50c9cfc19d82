"""report.html: one self-contained page (inline CSS, PNG plots as data URIs, no external URL).

The page is an artifact that gets mailed, attached to CI runs and opened years later, so it
must not depend on anything outside itself. Its Content-Security-Policy says so to the
browser: images only from data: URIs, the one inline script by its hash, nothing fetched.
That script writes what a headless browser can read back onto <body>: how many images
decoded (`data-images-shown` of `data-images-total`), how many tables had to scroll sideways
(`data-wide-overflow`), and how many index links find their timeline (`data-index-targets` of
`data-index-links`).

Tables fit the window: cells wrap (free text anywhere, names after . _ @ /) rather than
scroll. A page with more than INDEX_FROM timelines opens with an index of them.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Set
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from urllib.parse import quote

from harness.records.trace import Region
from harness.report.environment import cost_rows
from harness.report.results import write_atomic
from harness.report.summary import (
    BENCH_COLUMNS,
    GRAPH_CAPTION,
    GRAPH_HEADER,
    PAIRS_CAPTION,
    PRESSURE_CAPTION,
    PRESSURE_HEADER,
    STALE_CAPTION,
    WRONG_ARM,
    ArmCell,
    Standing,
    bench_caption,
    bench_points,
    bench_table,
    confidence_text,
    graph_rows,
    interval_text,
    not_run,
    observed_text,
    pairs_table,
    partial_text,
    pressure_rows,
    see_text,
    skipped_groups,
    skipped_sentence,
    stale_text,
    strategy_caption,
    strategy_cells,
    strategy_table,
    table_order,
    variant_label,
    verdict,
)

INDEX_FROM = 10  # more timelines than this and the page opens with an index of them

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 88em; padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd; }
/* The last resort for a table that cannot wrap narrow enough: it scrolls in its own box. */
div.wide { overflow-x: auto; max-width: 100%; }
table { border-collapse: collapse; margin: 0.5em 0; }
td, th { border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
table.scenarios, table.bench, table.strategies { font-size: 13px; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.wrap { overflow-wrap: anywhere; }
td small { color: #666; }
tr.fail td { background: #fdecea; }
tr.skipped td { color: #666; background: #fafafa; }
/* The result column: a word, in colour, so a failure reads without the row's tint. */
td.met { color: #1b5e20; font-weight: bold; white-space: nowrap; }
td.failed { color: #fff; background: #c62828 !important; font-weight: bold; white-space: nowrap; }
td.skipped { color: #555; font-style: italic; white-space: nowrap; }
/* The verdict banner: the first thing on the page, its colour the run's standing. */
section.verdict { border: 2px solid; border-radius: 6px; padding: 0.6em 1em; margin: 0.8em 0 1.2em; }
section.verdict p { margin: 0.2em 0; }
section.verdict .words { font-size: 1.6em; font-weight: bold; }
section.verdict .state { font-weight: bold; }
section.verdict .details { color: #333; }
section.verdict.met { background: #e8f5e9; border-color: #2e7d32; }
section.verdict.met .words { color: #1b5e20; }
section.verdict.failed { background: #fdecea; border-color: #c62828; }
section.verdict.failed .words { color: #b71c1c; }
section.verdict.partial { background: #fff3e0; border-color: #ef6c00; }
section.verdict.partial .words, section.verdict .state { color: #e65100; }
section.verdict.none { background: #f5f5f5; border-color: #9e9e9e; }
details.environment > summary { cursor: pointer; color: #444; }
details.environment > summary strong { color: #222; }
table.costs { font-size: 13px; margin: 0; }
.note { color: #8a6d3b; }
.caption { color: #555; max-width: 60em; }
nav.index { background: #f7f7f7; border: 1px solid #ddd; padding: 0.4em 0.8em; line-height: 1.7; }
nav.index a { margin-right: 0.8em; white-space: nowrap; }
a.fail { color: #c62828; font-weight: bold; }
img { max-width: 100%; display: block; margin: 0.6em 0; }
details { margin: 0.3em 0; }
"""

SCRIPT = """
window.addEventListener("load", function () {
  var body = document.body, shown = 0, over = 0, found = 0;
  for (var i = 0; i < document.images.length; i++) {
    var img = document.images[i];
    if (img.complete && img.naturalWidth > 0) shown++;
  }
  body.setAttribute("data-images-shown", String(shown));
  body.setAttribute("data-images-total", String(document.images.length));
  var boxes = document.querySelectorAll("div.wide");
  for (var j = 0; j < boxes.length; j++) {
    if (boxes[j].scrollWidth > boxes[j].clientWidth) over++;
  }
  body.setAttribute("data-wide-overflow", String(over));
  var links = document.querySelectorAll("nav.index a");
  for (var k = 0; k < links.length; k++) {
    if (document.getElementById(decodeURIComponent(links[k].hash.slice(1)))) found++;
  }
  body.setAttribute("data-index-links", String(links.length));
  body.setAttribute("data-index-targets", String(found));
});
"""


def _csp() -> str:
    digest = base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()
    return f"default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'sha256-{digest}'"


def _img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{escape(alt)}">'


def _value(v) -> str:
    return json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else str(v)


def anchor(scenario: str) -> str:
    """The id of a scenario's timeline on the page; HTML ids hold no whitespace."""
    return "timeline-" + re.sub(r"\s", "_", scenario)


def _href(scenario: str) -> str:
    return "#" + quote(anchor(scenario), safe="@")  # "@" may stand in a fragment as it is


# ---- tables -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    """A cell with more than its text: smaller lines under it, a link within the page, or a class
    of its own (the result column's colour). Its text may break after . _ @ / where a letter
    follows (see _breakable)."""

    text: str
    sub: tuple[str, ...] = ()
    href: str | None = None
    css: str = ""


def _breakable(text: str) -> str:
    # Scenario names have no spaces; a break after their separators beats one mid-word. Only
    # before a letter: "1.45" stays whole.
    return re.sub(r"([._@/])(?=[A-Za-z])", r"\1<wbr>", escape(text))


def _link(inner: str, href: str, css: str = "") -> str:
    """A link within the page around `inner`, HTML already escaped."""
    attr = f' class="{escape(css)}"' if css else ""
    return f'<a href="{escape(href)}"{attr}>{inner}</a>'


def _cell(c) -> str:
    if not isinstance(c, Cell):
        return escape(str(c))
    text = _link(_breakable(c.text), c.href) if c.href else _breakable(c.text)
    return "<br>".join([text, *(f"<small>{_breakable(s)}</small>" for s in c.sub)])


def _table(header: list[str], rows: list[list], numeric: Set[int] = frozenset(),
           row_classes: list[str] | None = None, css: str = "", wrap: Set[int] = frozenset(),
           boxed: bool = True) -> str:
    """An HTML table in a box that scrolls only if wrapping cannot make it fit (`boxed=False`: a
    table within a cell, which wraps with it); every cell is escaped here and nowhere else. `wrap`
    columns hold free text that may break anywhere."""
    table = f'<table class="{css}">' if css else "<table>"
    head = "<tr>" + "".join(f"<th>{escape(h)}</th>" for h in header) + "</tr>"
    out = [('<div class="wide">' if boxed else "") + table + head]
    for row_css, cells in zip(row_classes or [""] * len(rows), rows, strict=False):
        tds = "".join(_td(i, c, numeric, wrap) for i, c in enumerate(cells))
        out.append(f'<tr class="{row_css}">{tds}</tr>' if row_css else f"<tr>{tds}</tr>")
    return "\n".join(out) + ("</table></div>" if boxed else "</table>")


def _td(i: int, c, numeric: Set[int], wrap: Set[int]) -> str:
    css = (c.css if isinstance(c, Cell) else "") or ("num" if i in numeric else "wrap" if i in wrap else "")
    return f'<td class="{escape(css)}">{_cell(c)}</td>' if css else f"<td>{_cell(c)}</td>"


# ---- the environment ----------------------------------------------------------------------


def _environment(doc: dict) -> str:
    """The run's metadata and environment, collapsed under one line (device, torch, commit): the
    context of a verdict, not the verdict. The simulator's costs are a table with their units."""
    command = doc.get("command")
    meta = {"run id": doc.get("run_id"), "git commit": doc.get("git_commit"),
            "started": doc.get("started"), "finished": doc.get("finished"),
            "command": " ".join(command) if isinstance(command, list) else command}
    rows = [[k, _env_value(k, v)] for k, v in [*meta.items(), *doc["environment"].items()] if v is not None]
    # A value that is a table already holds its own escaped HTML: laid out here, not by _table.
    body = "\n".join(f'<tr><td>{escape(k)}</td><td class="wrap">{v}</td></tr>' for k, v in rows)
    table = f'<div class="wide"><table class="environment"><tr><th>key</th><th>value</th></tr>\n{body}</table></div>'
    return (f'<details class="environment"><summary><strong>Environment</strong>: '
            f"{escape(environment_line(doc))}</summary>\n{table}</details>")


def environment_line(doc: dict) -> str:
    """The environment's summary line: "device sim · torch 2.13.0+cpu · commit 6624f11"."""
    env = doc["environment"]
    commit = doc.get("git_commit")
    return " · ".join([f"device {env.get('device', '?')}", f"torch {env.get('torch', '?')}",
                       f"commit {commit[:7]}" if commit else "no commit recorded"])


def _env_value(key: str, value) -> str:
    """One environment value as HTML: the cost model as a table with units, any other mapping as a
    small key/value table, a list as its items; nothing as raw JSON."""
    if key == "costs" and isinstance(value, dict):
        return _inner_table(["cost", "value", "unit", "what it is"], cost_rows(value), numeric={1})
    if isinstance(value, dict):
        return _inner_table(["key", "value"], [[k, _value(v)] for k, v in value.items()])
    if isinstance(value, list):
        return escape(", ".join(_value(v) for v in value))
    return escape(_value(value))


def _inner_table(header: list[str], rows: list[list], numeric: Set[int] = frozenset()) -> str:
    return _table(header, rows, numeric=numeric, css="costs", boxed=False)


def layer_ranges(stale_layers) -> str:
    """Layer numbers as runs ("0–3, 7"): a 32-layer list stays one short cell."""
    layers = sorted(int(k) for k in stale_layers if str(k).isdigit())
    runs: list[list[int]] = []
    for n in layers:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    text = ", ".join(f"{a}" if a == b else f"{a}–{b}" for a, b in runs)
    others = [str(k) for k in stale_layers if not str(k).isdigit()]  # never written, never dropped
    return ", ".join(filter(None, [text, *others])) or "-"


def stale_layers_text(s: dict) -> str:
    """The layers read stale, then, after "host", those whose write-back host copy came out wrong,
    as the console's line has them."""
    reads = layer_ranges(s["stale_layers"]) if s["stale_layers"] else ""
    backups = s.get("backup_stale_layers") or {}
    host = f"host {layer_ranges(backups)}" if backups else ""
    return " ".join(filter(None, [reads, host])) or "-"


def _fault(s: dict) -> Cell:
    d = s.get("definition") or {}
    text = s.get("fault_text") or (d.get("fault") or {}).get("kind", "")
    mode = s.get("fault_mode")
    if not mode or mode == text:
        return Cell(text)
    # An older file's kind ("gate") says less than its mode ("gate (cuStreamWaitValue32)").
    return Cell(mode) if not text or mode.startswith(text + " ") else Cell(text, (mode,))


# The result column's words: what a row's colour says, in a word a colour-blind reader (or a
# printout) reads as well.
RESULT_WORDS = {True: Cell("met", css="met"), False: Cell("FAILED", css="failed")}
SCENARIO_HEADER = ["result", "scenario", "variant (hazard)", "fault", "expected", "observed", "stale rate",
                   "stale layers", "findings", "replays/s"]


def _scenario_row(s: dict, drawn: Set[str]) -> list:
    d = s.get("definition") or {}
    hazard = s.get("hazard") or d.get("hazard") or ""
    name = Cell(s["name"], href=_href(s["name"]) if s["name"] in drawn else None)
    variant = f"{variant_label(s)} ({hazard})" if hazard else variant_label(s)
    return [RESULT_WORDS[bool(s["met"])], name, Cell(variant), _fault(s), s["expect"],
            Cell(observed_text(s)), _stale(s), stale_layers_text(s), len(s["findings"]),
            _per_s(s["timings"]["replays_per_s"])]


def _per_s(rate: float) -> str:
    # A slow run (a busy CI host, a big model) reads "0.4", not "0".
    return f"{rate:.1f}" if rate < 10 else f"{rate:.0f}"


def _skipped(doc: dict) -> str:
    """The scenarios this device skipped, one row a reason (a natural set skipped whole stays one
    row): why, then their names. A table of its own under the scenario table: in it, a long list of
    names would take the width its columns need."""
    groups = skipped_groups(doc)
    if not groups:
        return ""
    rows = [[Cell(skipped_sentence(why, names)), Cell(", ".join(names))] for why, names in groups]
    return _table(["skipped on this device", "scenarios"], rows, row_classes=["skipped"] * len(rows),
                  css="scenarios skipped-list", wrap={0, 1})


def _stale(s: dict) -> Cell:
    """The stale rate, its 95% interval under it, and the replays that would see it (99%)."""
    see = see_text(s)
    return Cell(stale_text(s), (f"95%: {interval_text(s)}", *([f"99%: {see} replays"] if see != "-" else [])))


def _scenarios(doc: dict, drawn: Set[str]) -> str:
    """The scenario table: those that failed first, then the rest in run order; the skipped under
    it; each scenario's happens-before findings after them, in the table's order."""
    ordered = table_order(doc["scenarios"])
    rows = [_scenario_row(s, drawn) for s in ordered]
    classes = ["ok" if s["met"] else "fail" for s in ordered]
    notes = [f'<p class="note">{escape(_sentence(t))}</p>' for t in [confidence_text(doc)] if t]
    body = [*notes, f'<p class="caption">{_code(_sentence(STALE_CAPTION))}</p>',
            _table(SCENARIO_HEADER, rows, numeric={6, 8, 9}, row_classes=classes, css="scenarios verdicts",
                   wrap={3, 5}), _skipped(doc)]
    for s in ordered:
        if s["findings"]:
            items = "".join(f"<li>{escape(f)}</li>" for f in s["findings"])
            body.append(f"<details><summary>{escape(s['name'])}: {len(s['findings'])} happens-before "
                        f"findings</summary><ul>{items}</ul></details>")
    return "\n".join(b for b in body if b)


def _scenarios_section(doc: dict, drawn: Set[str]) -> str:
    """The scenario table, left out of documents with none (a benchmark's)."""
    return f"<h2>Scenarios</h2>\n{_scenarios(doc, drawn)}" if doc["scenarios"] else ""


def missing_edge(sentence: str) -> str:
    """What a graph finding says is missing: its sentence's words after the last ": ".
    `GraphFinding.describe()` is the one place that words it; none of its wordings of the
    missing edge holds ": " (regions read "k[L0, slots 16:48]")."""
    return sentence.rpartition(": ")[2]


def _region(r: dict) -> str:
    """A region as the finding's sentence writes it."""
    return str(Region(**r))


def _graph_finding_row(record: dict, sentence: str | None) -> list:
    verb = "writes" if record["kind"] == "write-after-write" else "reads"
    missing = missing_edge(sentence) if sentence else (
        f"no wait node on event {record['event']}" if record.get("event") is not None
        else "no event recorded after the copy")
    streams = record.get("streams") or {}
    return [Cell(f"graph {record['graph']} node {record['node']}"), Cell(record["kernel"], (f"step {record['step']}",)),
            Cell(f"{verb} {_region(record['access_region'])}", (record["kind"],)),
            Cell(_region(record["copy_region"]), (f"on {streams.get('copy', '?')}",)), missing]


def _graph_findings(s: dict) -> str:
    """One scenario's graph findings: the node (its kernel), the region, the missing edge."""
    g = s.get("graph") or {}
    sentences, records = g.get("findings") or [], g.get("finding_records")
    if not sentences:
        return ""
    if records is None or len(records) != len(sentences):  # a file without records: the sentences
        body = "<ul>" + "".join(f"<li>{escape(f)}</li>" for f in sentences) + "</ul>"
    else:
        rows = [_graph_finding_row(r, f) for r, f in zip(records, sentences, strict=True)]
        body = _table(["node", "kernel", "access", "load copy", "missing edge"], rows, css="scenarios",
                      wrap={1, 4})
    return (f"<details><summary>{escape(s['name'])}: {len(sentences)} graph findings</summary>"
            f"{body}</details>")


def _graph_section(doc: dict) -> str:
    """The graph check: summary.md's table, then each scenario's findings."""
    rows = graph_rows(doc)
    if not rows:
        return ""
    table = _table(GRAPH_HEADER, [[Cell(r[0]), Cell(r[1]), *r[2:5], Cell(r[5]), r[6], Cell(r[7])] for r in rows],
                   numeric={2, 3, 4, 6}, row_classes=["fail" if r[7].startswith("MISMATCH") else "" for r in rows],
                   css="scenarios", wrap={5, 7})
    findings = [_graph_findings(s) for s in doc["scenarios"]]
    return "\n".join([f'<h2>Graph check</h2>\n<p class="caption">{_code(_sentence(GRAPH_CAPTION))}</p>', table,
                      *(f for f in findings if f)])


def _pressure_section(doc: dict) -> str:
    rows = pressure_rows(doc)
    if not rows:
        return ""
    table = _table(PRESSURE_HEADER, [[Cell(r[0]), *r[1:]] for r in rows], css="scenarios", wrap={2, 3})
    return f'<h2>Pressure</h2>\n<p class="caption">{_code(_sentence(PRESSURE_CAPTION))}</p>\n{table}'


def _pairs_section(doc: dict) -> str:
    header, rows, significant = pairs_table(doc)
    if not rows:
        return ""
    cells = [[Cell(r[0]), Cell(r[1]), *r[2:-1], Cell(r[-1], ("differs" if sig else "within chance",))]
             for r, sig in zip(rows, significant, strict=True)]
    table = _table(header, cells, numeric={5}, css="scenarios", wrap={2})
    return f'<h2>Exact tests</h2>\n<p class="caption">{_code(_sentence(PAIRS_CAPTION))}</p>\n{table}'


def _strategies_section(doc: dict) -> str:
    strategies = doc.get("strategies")
    if not strategy_cells(strategies):
        return ""
    header, rows, ok = strategy_table(strategies)
    table = _table(header, rows, row_classes=["ok" if good else "fail" for good in ok], css="strategies")
    return f'<h2>Strategy check</h2>\n<p class="caption">{_code(strategy_caption(strategies))}</p>\n{table}'


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def _code(text: str) -> str:
    """Escaped text with its `backticked` words as <code>, as summary.md shows them."""
    return re.sub(r"`([^`]*)`", r"<code>\1</code>", escape(text))


# ---- the top of the page ------------------------------------------------------------------


STANDING_CSS = {Standing.MET: "met", Standing.FAILED: "failed", Standing.PARTIAL: "partial", Standing.NONE: "none"}


def _banner(doc: dict) -> str:
    """The verdict, first on the page: its words large, in the colour of the run's standing; a
    partial run's state and what did not run; then the device and what else the document holds."""
    v = verdict(doc)
    lines = [f'<p class="words">{escape(v.words)}</p>']
    if v.partial:
        lines.append(f'<p class="state">{escape(v.partial)}</p>')
        missing = not_run(doc)
        if missing:
            lines.append(f"<p>Not run: {', '.join(f'<code>{escape(n)}</code>' for n in missing)}</p>")
    lines.append(f'<p class="details">{escape(" · ".join(v.details))}</p>')
    text = partial_text(doc)
    if text:
        lines.append(f'<p class="details">{escape(text)}</p>')
    body = "\n".join(lines)
    return f'<section class="verdict {STANDING_CSS[v.standing]}" role="status">\n{body}\n</section>'


def _index(doc: dict, drawn: list[str]) -> str:
    if len(drawn) <= INDEX_FROM:
        return ""
    unmet = {s["name"] for s in doc["scenarios"] if not s["met"]}
    links = " ".join(_link(escape(n), _href(n), "fail" if n in unmet else "") for n in drawn)
    return f'<nav class="index"><strong>Stream timelines ({len(drawn)})</strong>: {links}</nav>'


# ---- figures ------------------------------------------------------------------------------


@dataclass
class Figures:
    """The plots of one document, or why there are none."""

    missing: str | None = None  # the import error when matplotlib is absent
    detection: bytes | None = None
    kill_matrix: bytes | None = None
    fence_cost: bytes | None = None
    timelines: dict[str, bytes] = field(default_factory=dict)  # scenario -> its timeline, in run order


def draw(doc: dict) -> Figures:
    try:
        from harness.report import plots
    except ImportError as e:
        # A GPU runner with only torch installed still gets its tables.
        return Figures(missing=str(e))
    drawn = plots.timeline_pngs({s["name"]: s.get("timeline") for s in doc["scenarios"]}).items()
    return Figures(detection=plots.detection_png(doc["scenarios"]),
                   kill_matrix=plots.kill_matrix_png(doc.get("mutants")),
                   fence_cost=plots.fence_cost_png(doc.get("bench")),
                   timelines={n: png for n, png in drawn if png is not None})


def _section(title: str, png: bytes | None, alt: str) -> str:
    return f"<h2>{escape(title)}</h2>\n{_img(png, alt)}" if png is not None else ""


def _fence_cost(doc: dict, png: bytes | None) -> str:
    """The plot, then the numbers it draws (and the ones it leaves out, the absolute times)."""
    bench = doc.get("bench")
    if not bench_points(bench):
        return ""
    header, rows = bench_table(bench)
    plot = _img(png, f"fence cost: median over bound per strategy; {WRONG_ARM} is unfenced") if png else ""
    numbers = set(range(1, len(BENCH_COLUMNS)))
    # Each arm's times on one line, its ratio to the bound under them: every cell wraps alike.
    rows = [[Cell(c.times, (c.ratio,)) if isinstance(c, ArmCell) else c for c in row] for row in rows]
    return (f"<h2>Fence cost</h2>\n{plot}\n<p class=\"caption\">{_code(_sentence(bench_caption(bench)))}</p>\n"
            f"{_table(header, rows, numeric=numbers, css='bench')}")


def _timelines(figures: Figures) -> str:
    if not figures.timelines:
        return ""
    parts = ["<h2>Stream timelines</h2>"]
    parts += [f'<h3 id="{escape(anchor(n))}">{escape(n)}</h3>\n{_img(png, f"stream timeline of {n}")}'
              for n, png in figures.timelines.items()]
    return "\n".join(parts)


def _plots(doc: dict, figures: Figures) -> str:
    if figures.missing is not None:
        return (f'<p class="note">No plots: {escape(figures.missing)}. Run <code>fence-harness report '
                f"results.json</code> where matplotlib is installed to add them.</p>\n"
                + _fence_cost(doc, None))
    sections = [
        _section("Detection against injected delay", figures.detection,
                 "detection probability against injected delay, per backend and fence"),
        _section("Mutant kill matrix", figures.kill_matrix, "mutant kill matrix"),
        _fence_cost(doc, figures.fence_cost),
        _timelines(figures),
    ]
    return "\n".join(s for s in sections if s)


def render_html(doc: dict) -> str:
    title = f"fence-harness report {doc.get('run_id') or ''}".strip()
    figures = draw(doc)
    drawn = list(figures.timelines)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{escape(_csp())}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)}</title>
<style>{STYLE}</style>
</head>
<body>
<h1>fence-harness report</h1>
{_banner(doc)}
{_environment(doc)}
{_index(doc, drawn)}
{_strategies_section(doc)}
{_scenarios_section(doc, set(drawn))}
{_graph_section(doc)}
{_pressure_section(doc)}
{_pairs_section(doc)}
{_plots(doc, figures)}
<script>{SCRIPT}</script>
</body>
</html>
"""


def write_html(doc: dict, path: Path) -> Path:
    path = Path(path)
    write_atomic(path, render_html(doc))
    return path
