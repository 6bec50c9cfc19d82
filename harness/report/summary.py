"""summary.md: a GitHub-flavoured Markdown digest of one results.json, short enough for a CI
step summary or a pull-request comment."""

from __future__ import annotations

from pathlib import Path

from harness.report.results import write_atomic


def headline(doc: dict) -> str:
    """One line: device, GPU, torch, met/total."""
    env = doc["environment"]
    s = doc["summary"]
    parts = [f"device {env.get('device', '?')}"]
    if env.get("gpu"):
        parts.append(f"GPU {env['gpu']}")
    elif env.get("cpu_model") or env.get("cpu"):
        parts.append(f"CPU {env.get('cpu_model') or env['cpu']}")
    parts.append(f"torch {env.get('torch', '?')}")
    parts.append(f"{s['met']}/{s['scenarios']} met")
    if s.get("errors"):
        parts.append(f"{s['errors']} errors")
    return " · ".join(parts)


def variant_label(s: dict) -> str:
    """backend+fence, the axis the detection plot groups by ("full+none", "eager+none, accessor none").

    The accessors' wait policy is named only when it is not the engine's per-layer default:
    `accessor` in current definitions, `waits` (true/false) in older ones.
    """
    d = s.get("definition") or {}
    if "backend" not in d or "fence" not in d:
        return s["name"]
    label = f"{d['backend']}+{d['fence']}"
    if d.get("waits") is False:
        label += ", waits off"
    if d.get("accessor", "per_layer") != "per_layer":
        label += f", accessor {d['accessor']}"
    return label


def observed_text(s: dict) -> str:
    """The verdict with its evidence ("race (data, analysis)"), as the run decided it."""
    if s.get("error"):
        return f"error: {s['error']}"
    if s.get("verdict"):
        return s["verdict"]
    return s["observed"] or "-"  # a results.json written before verdicts carried their evidence


def stale_text(s: dict) -> str:
    return f"{s['stale_rate']:.1%} ({s['stale_replays']}/{s['replays']})"


def _cell(text) -> str:
    # A pipe ends a Markdown table cell and a newline ends the row; error messages can hold either.
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def matrix_rows(mutants: dict | None) -> list[dict]:
    """The kill matrix's entries, mutants first, each group in run order."""
    matrix = (mutants or {}).get("matrix") or []
    return sorted(matrix, key=lambda m: m["role"] != "mutant")


def render_summary(doc: dict) -> str:
    lines = [f"**fence-harness** · {_cell(headline(doc))}", ""]
    rows = []
    for s in doc["scenarios"]:
        mark = "" if s["met"] else " ❌"
        rows.append([f"{s['name']}{mark}", s["expect"], observed_text(s), stale_text(s), len(s["findings"])])
    lines += _table(["scenario", "expected", "observed", "stale rate", "findings"], rows)
    matrix = matrix_rows(doc.get("mutants"))
    if matrix:
        mutants = [m for m in matrix if m["role"] == "mutant"]
        correct = [m for m in matrix if m["role"] == "correct"]
        killed = sum(m["outcome"] == "killed" for m in mutants)
        clean = sum(m["outcome"] == "clean" for m in correct)
        lines += ["", f"**Kill matrix**: {killed}/{len(mutants)} mutants killed, "
                      f"{clean}/{len(correct)} correct variants clean", ""]
        lines += _table(["scenario", "role", "outcome", "stale rate", "findings"],
                        [[m["name"], m["role"], m["outcome"], f"{m['stale_rate']:.1%}", m["findings"]]
                         for m in matrix])
    return "\n".join(lines) + "\n"


def write_summary(doc: dict, path: Path) -> Path:
    path = Path(path)
    write_atomic(path, render_summary(doc))
    return path
