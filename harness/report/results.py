"""results.json: what a run found, written atomically.

Schema version 1 (documented in `harness.report.schema`): run metadata, the device,
and one entry per scenario with its definition, expectation, observed verdict,
replay counts, stale rate, localisation, findings and timings.

Imports no torch until a document is built: `compare` and `report` read results
files, and the command line's parser is built from modules that import this one.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from harness.checkers.graph import GraphCheck
from harness.checkers.happens_before import Finding
from harness.records.plain import as_plain
from harness.records.rates import LEVEL, METHOD, SEE_CONFIDENCE, Rate
from harness.records.scenario import Scenario, shown_path

if TYPE_CHECKING:
    from harness.run.pipeline import ScenarioResult
    from harness.run.verdict import GraphVerdict

SCHEMA_VERSION = 1


def definition(s: Scenario) -> dict:
    """The scenario as results.json records it: every field, its file as a committed report may show
    it (`shown_path`: relative to the working directory, never a folder of the machine that ran it)."""
    d = as_plain(s)
    if d.get("source"):
        d["source"] = shown_path(d["source"])
    return d


def scenario_entry(r: ScenarioResult) -> dict:
    t = r.tally
    v = r.verdict if r.verdict is not None else r.seal()
    return {
        "name": r.scenario.name,
        "definition": definition(r.scenario),
        "expect": r.scenario.expect.value,
        "observed": v.observed.value if v.observed else None,
        "evidence": [e.value for e in v.evidence],  # what showed the race: data, analysis
        "met": v.met,
        "verdict": v.describe(),
        "error": r.error,
        "not_restored": r.not_restored,
        "replays": t.replays,
        "stale_replays": t.stale_replays,
        "stale_rate": t.stale_rate,
        **rate_fields(Rate(t.stale_replays, t.replays)),
        "stale_layers": {str(k): v for k, v in sorted(t.layer_counts.items())},
        "stale_pools": dict(sorted(t.pool_counts.items())),
        "final_state_stale_replays": t.final_state_replays,
        "output_only_replays": t.output_only_replays,
        "mean_stale_slot_fraction": t.mean_read_fraction,
        "backup_stale_replays": t.backup_replays,
        "backup_stale_layers": {str(k): v for k, v in sorted(t.backup_layer_counts.items())},
        "findings": [f.describe() for f in r.findings],
        "finding_records": [finding_record(f) for f in r.findings],  # the same, by field, in order
        "finding_kinds": dict(sorted(Counter(f.kind.value for f in r.findings).items())),
        "graph": graph_entry(r.graph),
        "hazard": r.scenario.hazard.value,
        "engine": _engine(r.scenario.engine),
        "fault_mode": r.fault_mode,
        "fault_text": r.scenario.fault.describe(),
        "pressure": r.pressure,
        "confidence": _confidence(r),
        "tp": _tp(r),
        "sweep": [
            {"us": p.us, "replays": p.tally.replays, "stale_replays": p.tally.stale_replays,
             "stale_rate": p.tally.stale_rate,
             "stale_interval": _interval(Rate(p.tally.stale_replays, p.tally.replays))}
            for p in r.sweep
        ],
        "timeline": {
            "clock": r.clock,
            "spans": [as_plain(sp) for sp in r.timeline],
            "stale_layers": list(r.timeline_stale_layers),
            "backup_stale_layers": list(r.timeline_backup_layers),
            "fault": r.timeline_fault,
        } if r.timeline else None,
        "timings": {
            "wall_s": round(r.wall_s, 4),
            "replay_loop_s": round(r.replay_s, 4),
            "replays_per_s": round(r.replays_per_s, 1),
        },
    }


def _tp(r: ScenarioResult) -> dict | None:
    """A tensor-parallel scenario: each rank's counts and end, and the cross-rank verdict; None on one rank."""
    if r.tp is None:
        return None
    return {"tp": r.tp.tp, "verdict": r.tp.describe(), "stale_on": list(r.tp.stale_on),
            "carried_to": list(r.tp.carried_to), "ranks": [as_plain(t) for t in r.tp.ranks]}


def _confidence(r: ScenarioResult) -> dict | None:
    """run --until-confidence: the width asked for, the cap, the widest interval reached (a sweep's
    points each count), and whether every one got narrower than asked; None without it."""
    if r.until is None:
        return None
    return {"target_width": r.until.width, "level": LEVEL, "cap": r.until.cap,
            "width": round(r.widest_interval, 6), "reached": r.confident}


def _interval(rate: Rate) -> list[float]:
    return [round(x, 6) for x in rate.interval()]


def rate_fields(rate: Rate) -> dict:
    """A stale rate's uncertainty (`harness.records.rates`): its 95% interval, and the replays that
    would see a race of that rate with 99% confidence, at the point estimate and at the interval's
    lower bound (null where that rate is 0)."""
    return {"stale_interval": _interval(rate), "replays_to_see": rate.replays_to_see,
            "replays_to_see_low": rate.replays_to_see_low}


# How results.json's rates and tests were worked out, for a reader with only the file.
STATISTICS = {
    "interval": f"Clopper-Pearson ({METHOD}), two-sided", "level": LEVEL,
    "replays_to_see": f"ceil(log(1 - {SEE_CONFIDENCE}) / log(1 - rate)): replays that see a race of "
                      f"that rate at least once with {SEE_CONFIDENCE:.0%} confidence",
    "pairs": "Fisher's exact test, two-sided, stale/clean of two scenarios that differ only in the fence "
             "or only in contention",
}


def finding_record(f: Finding) -> dict:
    """A finding by what it means: `compare` matches these, where a sentence would carry the
    builds' stream labels. Streams are keyed by their role in the pair (the copy's, the access's)."""
    return {
        "kind": f.kind.value,
        "copy_region": as_plain(f.copy_region),
        "access_region": as_plain(f.access_region),
        "what": f.what,
        "in_replay": f.in_replay,
        "access_first": f.access_first,
        "streams": {"copy": f.copy_stream, "access": f.access_stream},
    }


def graph_entry(g: GraphCheck | None) -> dict | None:
    """The graph check of the traced replay: each replayed graph counted, its op list compared, and
    the findings (sentences, then records); None where the scenario ended before it ran."""
    if g is None:
        return None
    return {
        "unavailable": g.unavailable,
        "matched": g.matched,
        "graphs": [{"graph": s.graph, "source": s.source, "nodes": s.nodes, "wait_nodes": s.wait_nodes,
                    "record_nodes": s.record_nodes, "work_nodes": s.work_nodes,
                    "steps": [{"step": step, "nodes": n} for step, n in s.steps],
                    "mismatches": list(s.mismatches)} for s in g.graphs],
        "findings": [f.describe() for f in g.findings],
        "finding_records": [{"kind": f.kind.value, "graph": f.graph, "node": f.node, "kernel": f.kernel,
                             "step": f.step, "access_region": as_plain(f.access_region),
                             "copy_region": as_plain(f.copy_region), "event": f.event,
                             "streams": {"copy": f.copy_stream, "replay": f.replay_stream}}
                            for f in g.findings],
    }


def op_list_state(g: GraphCheck | None) -> str:
    """Whether the recorded op list matched the graphs: matched, differs, not read, or "-" (no check ran)."""
    if g is None:
        return "-"
    if g.read_none:
        return "not read"
    return "matched" if g.matched else "differs"


def graph_check_entry(name: str, g: GraphCheck | None, v: GraphVerdict) -> dict:
    """`fence-harness graph-check`: one scenario's graph verdict against its expectation."""
    return {"name": name, "expect": v.expect.value, "graph": v.describe(), "status": v.status.value,
            "compared": v.compared, "findings": v.findings, "op_list": op_list_state(g),
            "nodes": [c.nodes for c in g.graphs] if g is not None else [],
            "error": v.error, "unavailable": v.unavailable}


def _engine(name: str | None) -> dict | None:
    """The engine a scenario ran on, and its version (loaded by then)."""
    if name is None:
        return None
    from harness.engines import load_engine

    return {"name": name, "version": load_engine(name).version}


def git_commit() -> str | None:
    """The checkout's commit; CI's GITHUB_SHA where the tree is a copy without git."""
    if os.environ.get("GITHUB_SHA"):
        return os.environ["GITHUB_SHA"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
        sha = out.stdout.strip()
        return sha if len(sha) == 40 and all(c in "0123456789abcdef" for c in sha) else None
    except (OSError, subprocess.SubprocessError):
        return None


def build_results(
    results: list[ScenarioResult], device: dict, started: float, finished: float,
    sections: dict | None = None, met: int | None = None,
) -> dict:
    """The whole document; `sections` adds top-level parts (the kill matrix, a benchmark). `met`:
    what the summary counts as met where the scenarios' own verdicts are not what was checked
    (graph-check counts no replay), else the scenarios that met their expectation."""
    entries = [scenario_entry(r) for r in results]
    return build_document(entries, run_environment(device), started, finished, sections, met)


def run_environment(device: dict) -> dict:
    """The environment a document records: the device's own description, the host and NVML's view."""
    from harness.report.environment import collect_environment

    return collect_environment({**device, "python": platform.python_version(), "host": platform.node(),
                                "cpu": platform.processor() or platform.machine()})


# The program a run was started as, by the file Python ran: `python -m harness` and the console
# script both record as fence-harness, `python -m pytest` as pytest.
_PROGRAMS = {("harness", "__main__.py"): "fence-harness", ("pytest", "__main__.py"): "pytest"}


def command_line(argv: list[str] | None = None, cwd: Path | None = None) -> list[str]:
    """The command line as a reader would type it: the program by its name, and each absolute path
    under the working directory relative to it, so a committed run names no folder of the machine
    that made it. Paths outside the working directory stay as given."""
    argv = list(sys.argv if argv is None else argv)
    if not argv:
        return argv
    first = Path(argv[0])
    argv[0] = _PROGRAMS.get((first.parent.name, first.name), first.name)
    here = Path(cwd or Path.cwd()).resolve()

    def shown(arg: str) -> str:
        flag, eq, value = arg.partition("=") if arg.startswith("-") else ("", "", arg)
        path = Path(value)
        if not path.is_absolute():
            return arg
        try:
            rel = path.resolve().relative_to(here).as_posix() or "."
        except ValueError:
            return arg
        return f"{flag}{eq}{rel}"

    return [argv[0], *(shown(a) for a in argv[1:])]


def build_document(
    entries: list[dict], environment: dict, started: float, finished: float,
    sections: dict | None = None, met: int | None = None,
) -> dict:
    """A document from scenario entries (`scenario_entry`, or read back from a journal)."""
    from harness.report.pairs import pairs

    return {
        "schema_version": SCHEMA_VERSION,
        "run_id": uuid.uuid4().hex[:12],
        "git_commit": git_commit(),
        "started": stamp(started),
        "finished": stamp(finished),
        "command": command_line(),
        "environment": environment,
        "summary": {
            "scenarios": len(entries),
            "met": sum(bool(e["met"]) for e in entries) if met is None else met,
            "errors": sum(e["error"] is not None for e in entries),
        },
        "statistics": STATISTICS,
        "scenarios": entries,
        "pairs": pairs(entries),
        **(sections or {}),
    }


def stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def write_atomic(path: Path, text: str) -> None:
    """Temporary file in the same folder, fsync, rename: never a half-written report."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; reports are read by others (CI artifacts)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_results(out_dir: Path, doc: dict) -> Path:
    path = out_dir / "results.json"
    write_atomic(path, json.dumps(doc, indent=2) + "\n")
    return path
