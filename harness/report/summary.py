"""summary.md: a GitHub-flavoured Markdown digest of one results.json, short enough for a CI
step summary or a pull-request comment.

The words and numbers shared with report.html (the verdict and headline, a partial run's note,
the order of the scenario table, the benchmark's and the strategy check's tables) are decided
here; each page only lays them out.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import NamedTuple

from harness.records.rates import SIGNIFICANT, Rate, replays_to_see
from harness.report.pairs import pairs_of, rate_of
from harness.report.results import write_atomic

# Why a partial run stopped, as results.json's `interrupted` names it ("killed": rebuilt from the
# journal of a run that could not write at all).
STOPPED = {
    "SIGINT": "stopped by SIGINT",
    "SIGTERM": "stopped by SIGTERM",
    "device-lost": "stopped when the device was lost",
    "killed": "killed",
}
WRONG_ARM = "none"  # the benchmark's and the strategy check's unfenced arm: fast, and wrong
BENCH_COLUMNS = ["model", "layers", "prefix", "hidden", "load ms", "compute ms"]  # then one per arm
DEFAULT_HIDDEN = 1024  # a bench point recorded before points had a hidden size


# ---- the verdict --------------------------------------------------------------------------


class Standing(Enum):
    """How a document ends, for its first line and the page's banner."""

    MET = "met"          # every scenario met its expectation
    FAILED = "failed"    # at least one did not (an error counts as not met)
    PARTIAL = "partial"  # stopped early, and none of what finished failed
    NONE = "none"        # nothing with an expectation: a benchmark, a soak that kept nothing

    @property
    def mark(self) -> str:
        """The sign summary.md puts before its first line (the scenario rows use the same ❌)."""
        return {Standing.MET: "✅", Standing.FAILED: "❌", Standing.PARTIAL: "⚠️"}.get(self, "")


@dataclass(frozen=True)
class Verdict:
    """A document's verdict in words ("all 12 met", "3 of 12 failed"), and what follows them on the
    same line: the partial state, the device, then what else the document holds."""

    standing: Standing
    words: str
    partial: str | None  # "partial: stopped by SIGTERM, 9 not run"; None for a run that finished
    details: tuple[str, ...]

    def line(self) -> str:
        return " · ".join([self.words, *([self.partial] if self.partial else []), *self.details])


def verdict(doc: dict) -> Verdict:
    """The one place a document's verdict is decided; summary.md's first line and the page's
    banner only lay it out. A scenario counts as failed when it did not meet its expectation
    (graph-check: when its graph verdict disagreed), errors included."""
    s = doc["summary"]
    contents = _contents(doc)
    partial = _partial_state(doc)
    if doc["scenarios"]:
        failed = s["scenarios"] - s["met"]
        if failed:
            standing, words = Standing.FAILED, f"{failed} of {s['scenarios']} failed"
        else:
            standing = Standing.PARTIAL if partial else Standing.MET
            words = f"all {s['scenarios']} met" if s["scenarios"] > 1 else "1 of 1 met"
    else:
        standing = Standing.PARTIAL if partial else Standing.NONE
        words, contents = (contents[0], contents[1:]) if contents else ("no scenarios", [])
    return Verdict(standing, words, partial, (*_device(doc), *contents))


def headline(doc: dict) -> str:
    """One line: the verdict, the partial state, device, GPU or CPU, torch, then the rest."""
    return verdict(doc).line()


def first_line(doc: dict, title: str = "fence-harness") -> str:
    """summary.md's first line: the verdict's sign, the title and verdict in bold, then the rest
    of the headline ("❌ **fence-harness: 3 of 12 failed** · device cuda · ...")."""
    v = verdict(doc)
    rest = v.line().removeprefix(v.words)
    bold = f"**{title}: {_cell(v.words)}**{_cell(rest)}"
    return f"{v.standing.mark} {bold}" if v.standing.mark else bold


def table_order(scenarios: list[dict]) -> list[dict]:
    """The scenarios as their tables list them: those that failed first, then the rest, each group
    in the document's order (the order they ran)."""
    return sorted(scenarios, key=lambda s: bool(s["met"]))


def _device(doc: dict) -> list[str]:
    env = doc["environment"]
    parts = [f"device {env.get('device', '?')}"]
    if env.get("gpu"):
        parts.append(f"GPU {env['gpu']}")
    elif env.get("cpu_model") or env.get("cpu"):
        parts.append(f"CPU {env.get('cpu_model') or env['cpu']}")
    parts.append(f"torch {env.get('torch', '?')}")
    return parts


def _partial_state(doc: dict) -> str | None:
    if not doc.get("partial"):
        return None
    text = f"partial: {stopped_text(doc)}"
    return text + (f", {len(not_run(doc))} not run" if "not_run" in doc else "")


def _contents(doc: dict) -> list[str]:
    # What the document holds besides its scenarios' verdict, each only where it has it.
    s = doc["summary"]
    parts = []
    if doc.get("graph_check"):  # graph-check ran no counted replay: its verdicts are the graph's
        parts.append(status_counts(doc["graph_check"]["counts"]))
    if s.get("errors"):
        parts.append(_count(s["errors"], "error"))
    if doc.get("skipped"):
        parts.append(f"{len(doc['skipped'])} skipped on this device")
    if bench_points(doc.get("bench")):
        header, rows = bench_table(doc["bench"])
        arms = len(header) - len(BENCH_COLUMNS)
        parts.append(f"fence cost of {_count(len(rows), 'point')} × {_count(arms, 'arm')}")
    cells = strategy_cells(doc.get("strategies"))
    if cells:
        parts.append(f"strategy check {sum(c['ok'] for c in cells)}/{len(cells)} cells as expected")
    if doc.get("soak"):
        parts.append(_soak_text(doc["soak"]))
    return parts


def _soak_text(soak: dict) -> str:
    missed = soak.get("missed_races")
    if isinstance(missed, dict):  # the total, then per fault kind
        missed = missed.get("total")
    return (f"soak of {soak.get('scenarios', '?')} scenarios + {soak.get('twins', '?')} twins: "
            f"{soak.get('false_positives', '?')} false positives, {'?' if missed is None else missed} missed races")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


# ---- a partial run ------------------------------------------------------------------------


def stopped_text(doc: dict) -> str:
    """Why a partial run stopped ("stopped by SIGTERM"), and where its file came from when that
    was not the run itself (the journal, after a kill)."""
    why = doc.get("interrupted")
    text = STOPPED.get(why, f"stopped ({why})") if why else "stopped, reason not recorded"
    return text + (f", rebuilt from the {doc['rebuilt_from']}" if doc.get("rebuilt_from") else "")


def not_run(doc: dict) -> list[str]:
    return list(doc.get("not_run") or [])


def partial_text(doc: dict) -> str | None:
    """A partial run in one sentence, the scenarios that did not run left to the caller; None
    for a run that finished."""
    if not doc.get("partial"):
        return None
    ran = doc["summary"]["scenarios"]
    if "not_run" not in doc:  # a soak: it draws scenarios until stopped, none is left over
        return f"Partial run, {stopped_text(doc)}; this file holds what finished before it stopped."
    missing = not_run(doc)
    return (f"Partial run, {stopped_text(doc)} after {ran} of {_count(ran + len(missing), 'scenario')}; "
            f"{len(missing)} did not run.")


# ---- scenarios ----------------------------------------------------------------------------


def variant_label(s: dict) -> str:
    """backend+fence, the axis the detection plot groups by ("full+none", "eager+none, accessor none").

    The accessors' wait policy is named only when it is not the engine's per-layer default:
    `accessor` in current definitions, `waits` (true/false) in older ones; the transfer path
    when a scenario names one.
    """
    d = s.get("definition") or {}
    if "backend" not in d or "fence" not in d:
        return s["name"]
    label = f"{d['backend']}+{d['fence']}"
    if d.get("waits") is False:
        label += ", waits off"
    if d.get("accessor", "per_layer") != "per_layer":
        label += f", accessor {d['accessor']}"
    if d.get("transfer"):  # the write-back / staging path's variant
        label += f", transfer {d['transfer']}"
    return label


def observed_text(s: dict) -> str:
    """The verdict with its evidence ("race (data, analysis)"), as the run decided it."""
    if s.get("error"):
        return f"error: {s['error']}"
    if s.get("not_restored"):
        return f"wrong: not restored: {s['not_restored']}"
    text = s.get("verdict") or s["observed"] or "-"  # no verdict: written before verdicts had evidence
    if s.get("tp"):  # a tensor-parallel scenario: which rank read stale, and whom the collective reached
        text += f"; tp {s['tp']['tp']}: {s['tp']['verdict']}"
    return text


def stale_text(s: dict) -> str:
    return f"{s['stale_rate']:.1%} ({s['stale_replays']}/{s['replays']})"


def _interval(s: dict) -> tuple[float, float]:
    """The entry's 95% interval as written, or worked out for a file written before it was."""
    if s.get("stale_interval"):
        low, high = s["stale_interval"]
        return low, high
    return rate_of(s).interval()


def interval_text(s: dict) -> str:
    """The stale rate's 95% interval, "82.7–90.6%"; "-" with no replays (an error before any)."""
    if not s["replays"]:
        return "-"
    low, high = _interval(s)
    return f"{low:.1%}–{high:.1%}"


def see_text(s: dict) -> str:
    """Replays that see a race of this rate with 99% confidence; "-" where the rate is 0."""
    n = s["replays_to_see"] if "replays_to_see" in s else replays_to_see(rate_of(s).value)
    return "-" if n is None else f"{n:,}"


def p_text(p: float) -> str:
    """A p-value: three decimals, or two significant digits below 0.001."""
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def _count_text(stale: int, replays: int) -> str:
    rate = Rate(stale, replays)
    low, high = rate.interval()
    return f"{stale}/{replays} ({low:.1%}–{high:.1%})"


def pairs_table(doc: dict) -> tuple[list[str], list[list[str]], list[bool]]:
    """One row per pair of the run (`harness.report.pairs`): the two scenarios, what differs, each
    one's stale count with its 95% interval, and the exact test's p-value; and per row whether the
    difference is significant."""
    rows, significant = [], []
    for p in pairs_of(doc):
        rows.append([p["a"], p["b"], p["differs"], _count_text(p["a_stale"], p["a_replays"]),
                     _count_text(p["b_stale"], p["b_replays"]), p_text(p["p_value"])])
        significant.append(p["p_value"] < SIGNIFICANT)
    return ["first", "second", "differs", "first stale (95%)", "second stale (95%)", "p"], rows, significant


def pressure_rows(doc: dict) -> list[list[str]]:
    """One row per scenario under the pressure fault: where its contention ran, its settings in
    words, and what it achieved (or why nothing ran: the simulator has nothing to contend for)."""
    rows = []
    for s in doc["scenarios"]:
        p = s.get("pressure")
        if not p:
            continue
        settings = p["settings"]
        load = (f"GEMM {settings['gemm']} ×{settings['gemm_streams']}" if settings["gemm"] else "no GEMMs") + (
            f", {settings['copy_mib']} MiB {settings['copy']}" if settings["copy_mib"] else ", no copies")
        a = p.get("achieved")
        if a:
            did = f"{a['gemm_tflops']:g} TFLOP/s, {a['copy_gbps']:g} GB/s over {a['seconds']:g} s"
        else:
            did = p.get("why") or "nothing recorded"
        rows.append([s["name"], p["mode"], load, did])
    return rows


PRESSURE_HEADER = ["scenario", "contention", "settings", "achieved"]
PRESSURE_CAPTION = ("the pressure fault's contention per scenario: bf16 GEMMs and pinned copies on other streams "
                    "(another process, or this one), running through the counted replays.")
PAIRS_CAPTION = (f"scenarios of this run that differ only in the fence or only in contention; p is Fisher's "
                 f"exact test, two-sided: below {SIGNIFICANT:g} the two stale rates differ by more than the luck "
                 f"of the replays.")
STALE_CAPTION = ("stale rates with their 95% interval (Clopper-Pearson), and the replays that would see a "
                 "race of that rate at least once with 99% confidence.")


def matrix_rows(mutants: dict | None) -> list[dict]:
    """The kill matrix's entries, mutants first, each group in run order."""
    matrix = (mutants or {}).get("matrix") or []
    return sorted(matrix, key=lambda m: m["role"] != "mutant")


# ---- the benchmark and the strategy check -------------------------------------------------


def bench_points(bench: dict | None) -> list[dict]:
    return list((bench or {}).get("points") or [])


def bench_arms(bench: dict | None) -> list[str]:
    """The arms in run order, the unfenced one first."""
    arms = list(dict.fromkeys(p["strategy"] for p in bench_points(bench)))
    return sorted(arms, key=lambda a: a != WRONG_ARM)


def arm_label(arm: str) -> str:
    return f"{arm} (unfenced: wrong)" if arm == WRONG_ARM else arm


def _ms(value: float) -> str:
    return f"{value:.2f}"


def bench_table(bench: dict | None) -> tuple[list[str], list[list]]:
    """One row per point (model, layers, prefix, hidden), one column per arm: "median (p25–p75)
    ×ratio", the ratio being the median over the bound max(load, compute), then the median of the
    arm's time over the unfenced graph's, round by round, with its IQR."""
    points = bench_points(bench)
    arms = bench_arms(bench)
    shapes: dict[tuple, dict[str, dict]] = {}
    for p in points:
        shapes.setdefault((p["model"], p["layers"], p["prefix"], p.get("hidden", DEFAULT_HIDDEN)),
                          {})[p["strategy"]] = p
    rows = []
    for (model, layers, prefix, hidden), by_arm in shapes.items():
        first = next(iter(by_arm.values()))
        cells = [_arm_cell(by_arm.get(arm)) for arm in arms]
        rows.append([model, str(layers), str(prefix), str(hidden), _ms(first["load_ms"]), _ms(first["compute_ms"]),
                     *cells])
    return [*BENCH_COLUMNS, *map(arm_label, arms)], rows


class ArmCell(NamedTuple):
    """One arm at one point: "median (p10–p90)" in ms, and "×ratio" to the bound."""

    times: str
    ratio: str

    def __str__(self) -> str:
        return f"{self.times} {self.ratio}"


def _arm_cell(p: dict | None) -> ArmCell | str:
    if p is None:
        return "-"
    lo, hi = (p["p25_ms"], p["p75_ms"]) if "p25_ms" in p else (p["p10_ms"], p["p90_ms"])
    ratio = f"×{p['ratio_to_bound']:.2f}"
    if "ratio_to_unfenced" in p and p["strategy"] != WRONG_ARM:
        ratio += (f", ×{p['ratio_to_unfenced']:.2f} ({p['ratio_to_unfenced_p25']:.2f}–"
                  f"{p['ratio_to_unfenced_p75']:.2f}) of {WRONG_ARM}")
    return ArmCell(f"{_ms(p['median_ms'])} ({_ms(lo)}–{_ms(hi)})", ratio)


def bench_caption(bench: dict | None) -> str:
    clock = (bench or {}).get("clock")
    on = f", {clock} clock" if clock else ""
    return (f"per point and arm, median ms (p25–p75, the IQR; p10–p90 in older runs) over the repeats{on}, "
            f"× the median over the bound max(load, compute), and × the unfenced graph's time, the median "
            f"(and IQR) of the ratio round by round. `{WRONG_ARM}` has no fence: its times are not a correct "
            f"load-back's. An arm `FENCE+SCHEDULE` loads with that schedule (`captured_load`: the load op as "
            f"one captured graph).")


def strategy_cells(strategies: dict | None) -> list[dict]:
    return list((strategies or {}).get("cells") or [])


def strategy_table(strategies: dict | None) -> tuple[list[str], list[list[str]], list[bool]]:
    """Scenario × strategy: each cell "stale/replays stale, N findings, ok" (or NOT OK); and per
    row, whether every cell in it is as expected."""
    cells = strategy_cells(strategies)
    names = list(dict.fromkeys(c["strategy"] for c in cells))
    names.sort(key=lambda n: n != WRONG_ARM)
    grid: dict[str, dict[str, dict]] = {}
    for c in cells:
        grid.setdefault(c["scenario"], {})[c["strategy"]] = c
    rows = [[scenario, *(_strategy_cell(by.get(n)) for n in names)] for scenario, by in grid.items()]
    ok = [all(c["ok"] for c in by.values()) for by in grid.values()]
    return ["scenario", *map(arm_label, names)], rows, ok


def _strategy_cell(c: dict | None) -> str:
    if c is None:
        return "-"
    verdict = "ok" if c["ok"] else "NOT OK"
    if c.get("error"):
        return f"error: {c['error']}, {verdict}"
    return f"{c['stale_replays']}/{c['replays']} stale, {c['findings']} findings, {verdict}"


def strategy_caption(strategies: dict | None) -> str:
    cells = strategy_cells(strategies)
    good = sum(c["ok"] for c in cells)
    return (f"{good}/{len(cells)} cells as expected: `{WRONG_ARM}` must be caught (stale replays), "
            f"every other strategy clean (no stale replay, no finding).")


# ---- summary.md ---------------------------------------------------------------------------


def _cell(text) -> str:
    # A pipe ends a Markdown table cell and a newline ends the row; error messages can hold either.
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(_cell(h) for h in header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def _partial_block(doc: dict) -> list[str]:
    text = partial_text(doc)
    if text is None:
        return []
    missing = not_run(doc)
    lines = [f"**{_cell(text)}**"]
    if missing:
        lines += ["", "Not run: " + ", ".join(f"`{_cell(n)}`" for n in missing)]
    return lines


def _scenario_block(doc: dict) -> list[str]:
    if not doc["scenarios"]:
        return []
    rows = []
    for s in table_order(doc["scenarios"]):
        mark = "" if s["met"] else " ❌"
        rows.append([f"{s['name']}{mark}", s["expect"], observed_text(s), stale_text(s), interval_text(s),
                     see_text(s), len(s["findings"])])
    return [_sentence(STALE_CAPTION), "", *_table(["scenario", "expected", "observed", "stale rate", "95% interval",
                                                   "replays to see (99%)", "findings"], rows)]


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def skipped_groups(doc: dict) -> list[tuple[str, list[str]]]:
    """The scenarios this device did not run, by reason: (why, names), in the order first seen."""
    groups: dict[str, list[str]] = {}
    for s in doc.get("skipped") or []:
        groups.setdefault(s["why"], []).append(s["name"])
    return list(groups.items())


def skipped_sentence(why: str, names: list[str]) -> str:
    return f"{_count(len(names), 'scenario')} skipped: {why}."


def skipped_text(doc: dict) -> str | None:
    """The scenarios this device did not run, and why, in one sentence per reason; None for none."""
    groups = skipped_groups(doc)
    return " ".join(skipped_sentence(why, names) for why, names in groups) if groups else None


def confidence_text(doc: dict) -> str | None:
    """A run with --until-confidence in one sentence: the target, the cap, and who did not get there."""
    asked = [s for s in doc["scenarios"] if s.get("confidence")]
    if not asked:
        return None
    c = asked[0]["confidence"]
    short = [s["name"] for s in asked if not s["confidence"]["reached"]]
    text = (f"replayed until each stale rate's {c['level']:.0%} interval was narrower than {c['target_width']:g}, "
            f"at most {c['cap']:,} replays: {len(asked) - len(short)} of {len(asked)} got there")
    return text + (f"; at the cap: {', '.join(short)}" if short else "")


def _confidence_block(doc: dict) -> list[str]:
    text = confidence_text(doc)
    return [f"**Until confidence**: {_cell(text)}"] if text else []


def _skipped_block(doc: dict) -> list[str]:
    text = skipped_text(doc)
    return [f"**Skipped**: {_cell(text)}"] if text else []


def _pressure_block(doc: dict) -> list[str]:
    rows = pressure_rows(doc)
    if not rows:
        return []
    return [f"**Pressure**: {PRESSURE_CAPTION}", "", *_table(PRESSURE_HEADER, rows)]


def _pairs_block(doc: dict) -> list[str]:
    header, rows, significant = pairs_table(doc)
    if not rows:
        return []
    marked = [[*r[:-1], f"**{r[-1]}**" if sig else r[-1]] for r, sig in zip(rows, significant, strict=True)]
    return [f"**Exact tests**: {PAIRS_CAPTION}", "", *_table(header, marked)]


def _matrix_block(doc: dict) -> list[str]:
    matrix = matrix_rows(doc.get("mutants"))
    if not matrix:
        return []
    mutants = [m for m in matrix if m["role"] == "mutant"]
    correct = [m for m in matrix if m["role"] == "correct"]
    killed = sum(m["outcome"] == "killed" for m in mutants)
    clean = sum(m["outcome"] == "clean" for m in correct)
    lines = [f"**Kill matrix**: {killed}/{len(mutants)} mutants killed, "
             f"{clean}/{len(correct)} correct variants clean", ""]
    # Where the data showed it and the analyser's kinds (older files lack both: "-").
    return lines + _table(["scenario", "role", "outcome", "stale rate", "data in", "findings"],
                          [[m["name"], m["role"], m["outcome"], f"{m['stale_rate']:.1%}",
                            ", ".join(m.get("data_in") or []) or "-",
                            f"{m['findings']} ({', '.join(m['finding_kinds'])})" if m.get("finding_kinds")
                            else m["findings"]]
                           for m in matrix])


GRAPH_CAPTION = ("captured graphs, read from the device by their own nodes and edges (the simulator's are "
                 "built from its op list): the work nodes of each pool-touching step, in capture order; graph "
                 "findings: nodes nothing orders after a load; op list: whether the harness's record of the "
                 "capture matched the graph")


GRAPH_HEADER = ["scenario", "graph", "nodes", "wait nodes", "record nodes", "work nodes per step", "graph findings",
                "op list"]


def graph_rows(doc: dict) -> list[list]:
    """One row per replayed graph with pool-touching steps (a full graph; breakable segments have none)."""
    rows = []
    for s in doc["scenarios"]:
        g = s.get("graph")
        if not g:
            continue
        if g.get("unavailable") and not g["graphs"]:
            rows.append([s["name"], "-", "-", "-", "-", f"not read: {g['unavailable']}", "-", "-"])
        for c in g["graphs"]:
            if not c["steps"]:
                continue
            rows.append([s["name"], f"{c['graph']} ({c['source']})", c["nodes"], c["wait_nodes"], c["record_nodes"],
                         " · ".join(str(st["nodes"]) for st in c["steps"]), len(g["findings"]),
                         "matches" if not c["mismatches"] else f"MISMATCH: {c['mismatches'][0]}"])
    return rows


def _graph_block(doc: dict) -> list[str]:
    rows = graph_rows(doc)
    if not rows:
        return []
    return [f"**Graph check**: {GRAPH_CAPTION}", "", *_table(GRAPH_HEADER, rows)]


GRAPH_CHECK_CAPTION = ("each scenario's captured graphs checked by their own nodes and edges after one traced "
                       "replay, with no counted replay: race where the check has findings; compared with the "
                       "expectation where a full-graph replay can show the race (else: not a graph race)")
GRAPH_CHECK_HEADER = ["scenario", "expected", "graph verdict", "graph findings", "op list", "nodes", "status"]


def status_counts(counts: dict[str, int]) -> str:
    """A graph-check's scenarios by status: "73 agrees, 11 not a graph race"."""
    return ", ".join(f"{n} {status}" for status, n in counts.items())


def nodes_text(nodes: list[int]) -> str:
    """A scenario's replayed graphs by their node counts: "14+27+19", or "-" with none."""
    return "+".join(str(n) for n in nodes) or "-"


def graph_check_rows(doc: dict) -> list[list]:
    """`fence-harness graph-check`: one row per scenario (its printed line holds the same)."""
    return [[c["name"], c["expect"], c["graph"], c["findings"], c["op_list"], nodes_text(c["nodes"]),
             c["status"] + (f": {c['error']}" if c["error"] else "")]
            for c in doc["graph_check"]["scenarios"]]


def render_graph_check(doc: dict) -> str:
    """summary.md of `fence-harness graph-check`: the graph verdicts, then the graph-check table."""
    blocks = [[first_line(doc, "fence-harness graph-check")], _partial_block(doc),
              _skipped_block(doc),
              [f"**Graph verdicts**: {GRAPH_CHECK_CAPTION}", "", *_table(GRAPH_CHECK_HEADER, graph_check_rows(doc))],
              _graph_block(doc)]
    return "\n\n".join("\n".join(b) for b in blocks if b) + "\n"


def _strategy_block(doc: dict) -> list[str]:
    strategies = doc.get("strategies")
    if not strategy_cells(strategies):
        return []
    header, rows, ok = strategy_table(strategies)
    marked = [[f"{r[0]}{'' if good else ' ❌'}", *r[1:]] for r, good in zip(rows, ok, strict=True)]
    return [f"**Strategy check**: {strategy_caption(strategies)}", "", *_table(header, marked)]


def _bench_block(doc: dict) -> list[str]:
    bench = doc.get("bench")
    if not bench_points(bench):
        return []
    header, rows = bench_table(bench)
    return [f"**Fence cost**: {bench_caption(bench)}", "", *_table(header, rows)]


def render_summary(doc: dict) -> str:
    blocks = [[first_line(doc)], _partial_block(doc), _skipped_block(doc),
              _confidence_block(doc),
              _strategy_block(doc),
              _scenario_block(doc), _graph_block(doc), _pressure_block(doc), _pairs_block(doc), _matrix_block(doc),
              _bench_block(doc)]
    return "\n\n".join("\n".join(b) for b in blocks if b) + "\n"


def write_summary(doc: dict, path: Path) -> Path:
    path = Path(path)
    write_atomic(path, render_summary(doc))
    return path
