"""report.html: one self-contained page (inline CSS, PNG plots as data URIs, no external URL).

The page is an artifact that gets mailed, attached to CI runs and opened years later, so it
must not depend on anything outside itself. Its Content-Security-Policy says so to the
browser: images only from data: URIs, the one inline script by its hash, nothing fetched.
That script counts the images that decoded into `data-images-shown` on <body>, which a
headless browser can read back.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Set
from html import escape
from pathlib import Path

from harness.report.results import write_atomic
from harness.report.summary import headline, observed_text, stale_text, variant_label

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 76em; padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.5em 0; }
/* A wide table scrolls inside the page instead of running off its right edge. */
table.scenarios { display: block; overflow-x: auto; max-width: 100%; }
td, th { border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: left; }
th { background: #f3f3f3; }
table.scenarios td { white-space: nowrap; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.fail td { background: #fdecea; }
.headline { color: #555; }
.note { color: #8a6d3b; }
img { max-width: 100%; display: block; margin: 0.6em 0; }
details { margin: 0.3em 0; }
"""

SCRIPT = """
window.addEventListener("load", function () {
  var shown = 0;
  for (var i = 0; i < document.images.length; i++) {
    var img = document.images[i];
    if (img.complete && img.naturalWidth > 0) shown++;
  }
  document.body.setAttribute("data-images-shown", String(shown));
  document.body.setAttribute("data-images-total", String(document.images.length));
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


def _table(header: list[str], rows: list[list], numeric: Set[int] = frozenset(),
           row_classes: list[str] | None = None, css: str = "") -> str:
    """An HTML table; every cell is escaped here and nowhere else."""
    table = f'<table class="{css}">' if css else "<table>"
    out = [table + "<tr>" + "".join(f"<th>{escape(h)}</th>" for h in header) + "</tr>"]
    for row_css, cells in zip(row_classes or [""] * len(rows), rows, strict=False):
        tds = "".join(f'<td class="num">{escape(str(c))}</td>' if i in numeric else f"<td>{escape(str(c))}</td>"
                      for i, c in enumerate(cells))
        out.append(f'<tr class="{row_css}">{tds}</tr>' if row_css else f"<tr>{tds}</tr>")
    return "\n".join(out) + "</table>"


def _environment(doc: dict) -> str:
    command = doc.get("command")
    meta = {"run id": doc.get("run_id"), "git commit": doc.get("git_commit"),
            "started": doc.get("started"), "finished": doc.get("finished"),
            "command": " ".join(command) if isinstance(command, list) else command}
    rows = [[k, _value(v)] for k, v in [*meta.items(), *doc["environment"].items()] if v is not None]
    return _table(["key", "value"], rows)


def _layers(stale_layers: dict) -> str:
    return ",".join(sorted(stale_layers, key=lambda k: int(k) if k.isdigit() else -1)) or "-"


def _scenarios(doc: dict) -> str:
    header = ["scenario", "variant", "hazard", "fault", "expected", "observed", "stale rate",
              "stale layers", "findings", "replays/s"]
    rows, classes = [], []
    for s in doc["scenarios"]:
        d = s.get("definition") or {}
        hazard = s.get("hazard") or d.get("hazard") or ""
        fault = s.get("fault_mode") or s.get("fault_text") or (d.get("fault") or {}).get("kind", "")
        rows.append([s["name"], variant_label(s), hazard, fault, s["expect"], observed_text(s), stale_text(s),
                     _layers(s["stale_layers"]), len(s["findings"]), f"{s['timings']['replays_per_s']:.0f}"])
        classes.append("ok" if s["met"] else "fail")
    body = [_table(header, rows, numeric={6, 8, 9}, row_classes=classes, css="scenarios")]
    for s in doc["scenarios"]:
        if s["findings"]:
            items = "".join(f"<li>{escape(f)}</li>" for f in s["findings"])
            body.append(f"<details><summary>{escape(s['name'])}: {len(s['findings'])} happens-before "
                        f"findings</summary><ul>{items}</ul></details>")
    return "\n".join(body)


def _plots(doc: dict) -> str:
    try:
        from harness.report import plots
    except ImportError as e:
        # A GPU runner with only torch installed still gets its tables.
        return (f'<p class="note">No plots: {escape(str(e))}. Run <code>fence-harness report '
                f"results.json</code> where matplotlib is installed to add them.</p>")
    sections = []

    def add(title: str, png: bytes | None, alt: str) -> None:
        if png is not None:
            sections.append(f"<h2>{escape(title)}</h2>\n{_img(png, alt)}")

    add("Detection against injected delay", plots.detection_png(doc["scenarios"]),
        "detection probability against injected delay, per backend and fence")
    add("Mutant kill matrix", plots.kill_matrix_png(doc.get("mutants")), "mutant kill matrix")
    add("Fence cost", plots.fence_cost_png(doc.get("bench")), "fence cost: median over bound per strategy")
    drawn = [(s["name"], plots.timeline_png(s["name"], s.get("timeline"))) for s in doc["scenarios"]]
    timelines = [(n, png) for n, png in drawn if png is not None]
    if timelines:
        sections.append("<h2>Stream timelines</h2>")
        sections += [f"<h3>{escape(n)}</h3>\n{_img(png, f'stream timeline of {n}')}" for n, png in timelines]
    return "\n".join(sections)


def _scenarios_section(doc: dict) -> str:
    """The scenario table, left out of documents with none (a benchmark's)."""
    return f"<h2>Scenarios</h2>\n{_scenarios(doc)}" if doc["scenarios"] else ""


def render_html(doc: dict) -> str:
    title = f"fence-harness report {doc.get('run_id') or ''}".strip()
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
<p class="headline">{escape(headline(doc))}</p>
<h2>Environment</h2>
{_environment(doc)}
{_scenarios_section(doc)}
{_plots(doc)}
<script>{SCRIPT}</script>
</body>
</html>
"""


def write_html(doc: dict, path: Path) -> Path:
    path = Path(path)
    write_atomic(path, render_html(doc))
    return path
