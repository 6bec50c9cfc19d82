"""results.json, schema version 1: what the report reads, and a checker for it.

A document is one JSON object::

    schema_version  1
    run_id, git_commit, started, finished, command   run metadata (strings; git_commit may be null)
    environment     {device, torch, gpu?, cuda?, driver?, ...}: what the device and host reported
    summary         {scenarios, met, errors}: counts
    scenarios       one entry per scenario, in run order:
        name, expect ("race" | "clean" | "wrong"), observed ("race" | "clean" | "wrong" | null on
        error), met, error, not_restored (optional: with observed "wrong", the slots the landed load
        op left unrestored, in words),
        replays, stale_replays, stale_rate, stale_layers {layer: replays}, findings [sentence],
        timings {wall_s, replay_loop_s, replays_per_s},
        stale_interval
                    (optional: older files lack it) [low, high]: the stale rate's 95% interval
                    (Clopper-Pearson); sweep points carry one each too
        replays_to_see, replays_to_see_low
                    (optional) replays that see a race of the stale rate (of the interval's lower
                    bound) at least once with 99% confidence; null where that rate is 0
        evidence    (optional: older files lack it) what showed the race: ["data", "analysis", "graph"]
        graph       (optional: older files lack it; null when the scenario ended before its traced
                    replay) the graph check of the traced replay's captured graphs, by their own
                    nodes and edges: {unavailable (why no graph could be read, else null), matched
                    (the recorded op list matched every graph), graphs [{graph, source "cuda" | "sim",
                    nodes, wait_nodes, record_nodes, work_nodes, steps [{step, nodes}]: the work nodes
                    of each pool-touching step, mismatches [sentence]}], findings [sentence],
                    finding_records [{kind "read-after-write" | "write-after-write", graph, node,
                    kernel, step, access_region, copy_region, event (the load event; null: none),
                    streams {copy, replay}}]}
        finding_records
                    (optional: older files lack it) the findings again, one record per sentence and
                    in the same order, by what they mean: {kind: "read-after-write" |
                    "write-after-write" | "write-after-read" | "store-before-compute" |
                    "reuse-before-backup" | "staging-overwrite", copy_region, access_region (each
                    {pool, layer, start, stop}), what (the kernel, "" for none), in_replay,
                    access_first (the access was enqueued before the copy), streams {copy,
                    access}: the labels of the copy's and the access's streams, by role}.
                    `compare` matches findings on (kind, copy_region, access_region, what).
        definition {backend, fence, accessor (older files: waits), ...}
        and, when the run produced them:
        sweep       [{us, replays, stale_replays, stale_rate}]: detection against injected delay
                    (empty when the fault was not a sweep)
        hazard      "raw" | "waw" | "war" | "store_before_compute" | "reuse_before_backup" |
                    "staging_overwrite"
        backup_stale_replays, backup_stale_layers {layer: replays}
                    (optional: older files lack them) replays whose write-back host copy differed
                    from ground truth, and in which layers
        fault_mode  how the fault was built, e.g. "gate (cuStreamWaitValue32)", or null
        fault_text  the fault in words, e.g. "delay 1000us each"
        tp          (optional) a tensor-parallel scenario (`tp` > 1), else null: {tp, verdict (the
                    cross-rank verdict in words), stale_on [rank], carried_to [rank], ranks [{rank, fault,
                    fence, replays, stale_replays, stale_read_replays, output_replays, carried_replays
                    (its output wrong, its reads right, another rank's stale), findings, graph_findings,
                    graph_nodes, collective_nodes, error, state ("finished" | "failed" | "stopped" |
                    "died (exit code N)"), stack (its traceback, or its stack when stopped)}]}
        confidence  (optional) `run --until-confidence`, else null: {target_width, level (0.95), cap (the
                    most replays), width (the widest 95% interval reached; a sweep's points each count),
                    reached (every interval narrower than target_width)}
        pressure    (optional) a pressure fault's contention, else null: {mode: "separate process" |
                    "same process" | "none" (the simulator: nothing to contend for; `why` says so),
                    settings {gemm, gemm_streams, copy_mib, copy, process}, achieved {seconds, gemms,
                    copies, gemm_tflops, copy_gbps} or null, pid and exit_code (a separate process)}
        timeline    {clock: "virtual" | "device", stale_layers: [int], backup_stale_layers?: [int],
                     spans: [{stream, name, kind, start_us, end_us, layer?}]}: one traced
                    replay, or null; span kinds: copy (host to device) d2h (device to host) record
                    wait replay delay gate access kernel harness (sync in older files)
    statistics      (optional) how the rates and tests were worked out, in words: {interval, level,
                    replays_to_see, pairs}
    pairs           (optional) [{kind: "fence" | "pressure", a, b (scenario names: unfenced then
                    fenced, or quiet then under pressure), differs (what differs, in words), a_stale,
                    a_replays, b_stale, b_replays, p_value}]: scenarios of the run that differ only in
                    the fence or only in contention, with Fisher's exact test (two-sided)
    mutants         (optional) {matrix: [{name, role: "mutant" | "correct", variant, outcome:
                    "killed" | "survived" | "clean" | "flagged" | "error", stale_rate, findings,
                    data_in? ["reads" | "final state" | "host copy" | "output"], finding_kinds? [kind]}]}
    bench           (optional) {clock, points: [{model, layers, prefix, new, hidden?, strategy, median_ms,
                                p25_ms?, p75_ms?, p10_ms, p90_ms, repeats, ratio_to_bound,
                                ratio_to_bound_p25?, ratio_to_bound_p75?, ratio_to_unfenced?,
                                ratio_to_unfenced_p25?, ratio_to_unfenced_p75?, load_ms, compute_ms,
                                forward_start_ms, forward_start_p25_ms?, forward_start_p75_ms?}]}:
                    `fence-harness bench` (an arm is a fence, or FENCE+SCHEDULE)
    checking        (optional) {clock, points: [{shape, device_ms, device_p10_ms, device_p90_ms, replays,
                                replays_per_s, per_replay_ms, overhead, within_target, target,
                                device_bound_replays_per_s, poison_ms, look_ms, idle_ms,
                                stale_replays}]}: `fence-harness checking` (device_ms: load + replay,
                                from device events in the checked run itself)
    strategies      (optional) {cells: [{scenario, strategy, stale_replays, replays, findings,
                                error, ok}]}: `fence-harness fences`
    soak            (optional) the counts of a `fence-harness soak` (docs/reports.md)
    graph_check     (optional) `fence-harness graph-check` (its scenario entries ran no counted replay):
                    {scenarios: [{name, expect, graph "race" | "clean" | "error" | "not checked",
                    status "agrees" | "disagrees" | "error" | "not a graph race" | "not checked",
                    compared (the expectation is one the graph must agree with), findings, op_list
                    "matched" | "differs" | "not read" | "-", nodes [per replayed graph], error,
                    unavailable}], counts {status: scenarios}}
    skipped         (optional) [{name, why}]: scenarios of the files that this device does not run
                    (their `devices` leave it out), and why
    partial, interrupted, not_run
                    (optional) a run cut short: true; "SIGINT" | "SIGTERM" | "device-lost", or
                    "killed" for a document rebuilt from the run's journal (then rebuilt_from:
                    "journal"); the names of the scenarios that did not finish
    shard, shard_of (optional: older files lack them) a run of one shard of a CI matrix (`run --shard K/N`,
                    `mutants --shard K/N`, the pytest plugin's `--harness-shard K/N`): "K/N", and the
                    names of the scenarios it is one share of, in run order (the same in every shard)
    merge           (optional) `fence-harness merge`: {runs [{source, shard ("K/N" or null), run_id,
                    host, gpus, started, finished, scenarios (its count), partial}], shard_count (null:
                    whole runs merged), shards ["K/N"] (those merged), missing ["K/N"], complete (every
                    shard of the count there)}; each scenario entry then carries the shard that ran it
    each scenario may also carry worker and gpu_uuid (pytest plugin runs, merged over workers), shard,
    finding_kinds {kind: count}, stale_pools, final_state_stale_replays, output_only_replays,
    mean_stale_slot_fraction.

`SCHEMA` below is the same thing as data. Keys not listed are allowed (newer writers may add
some), listed keys must have the listed type; a key ending in "?" may be absent, and the
optional sections may also be null.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from harness.records.errors import ReportInputError
from harness.records.races import RaceKind
from harness.records.scenario import Hazard
from harness.records.trace import SpanKind
from harness.report.results import SCHEMA_VERSION

# --- the type vocabulary of SCHEMA ---------------------------------------------------------


class OneOf:
    """One of a few literal values (an enum)."""

    def __init__(self, *values):
        self.values = values


@dataclass(frozen=True)
class Nullable:
    inner: object


@dataclass(frozen=True)
class MapOf:
    """An object with free keys, every value of one type (stale_layers, stale_pools)."""

    inner: object


NUMBER = "number"  # int or float, never bool
INT = "int"
STR = "str"
BOOL = "bool"

SPAN_KINDS = OneOf(*SpanKind.ALL, "sync")  # "sync": host synchronize spans of older results
REGION = {"pool": STR, "layer": INT, "start": INT, "stop": INT}

SCENARIO = {
    "name": STR,
    "expect": OneOf("race", "clean", "wrong"),
    "observed": Nullable(OneOf("race", "clean", "wrong")),
    "not_restored?": Nullable(STR),
    "evidence?": [OneOf("data", "analysis", "graph")],
    "verdict?": STR,
    "met": BOOL,
    "error": Nullable(STR),
    "replays": INT,
    "stale_replays": INT,
    "stale_rate": NUMBER,
    "stale_layers": MapOf(INT),
    "findings": [STR],
    "finding_records?": [{"kind": OneOf(*(k.value for k in RaceKind)), "copy_region": REGION,
                          "access_region": REGION, "what": STR, "in_replay": BOOL, "access_first": BOOL,
                          "streams": {"copy": STR, "access": STR}}],
    "timings": {"replays_per_s": NUMBER, "wall_s?": NUMBER, "replay_loop_s?": NUMBER},
    "graph?": Nullable({
        "unavailable": Nullable(STR),
        "matched": BOOL,
        "graphs": [{"graph": INT, "source": OneOf("cuda", "sim"), "nodes": INT, "wait_nodes": INT,
                    "record_nodes": INT, "work_nodes": INT, "steps": [{"step": STR, "nodes": INT}],
                    "mismatches": [STR]}],
        "findings": [STR],
        "finding_records": [{"kind": OneOf(RaceKind.READ_AFTER_WRITE.value, RaceKind.WRITE_AFTER_WRITE.value),
                             "graph": INT, "node": INT, "kernel": STR, "step": STR, "access_region": REGION,
                             "copy_region": REGION, "event": Nullable(INT),
                             "streams": {"copy": STR, "replay": STR}}],
    }),
    "definition?": {"backend?": STR, "fence?": STR, "waits?": BOOL, "accessor?": STR},
    "stale_interval?": [NUMBER],
    "replays_to_see?": Nullable(INT),
    "replays_to_see_low?": Nullable(INT),
    "sweep?": [{"us": NUMBER, "replays": INT, "stale_replays": INT, "stale_rate": NUMBER,
                "stale_interval?": [NUMBER]}],
    "hazard?": OneOf(*Hazard.names()),
    "backup_stale_replays?": INT,
    "backup_stale_layers?": MapOf(INT),
    "fault_mode?": Nullable(STR),
    "fault_text?": STR,
    "tp?": Nullable({"tp": INT, "verdict": STR, "stale_on": [INT], "carried_to": [INT],
                     "ranks": [{"rank": INT, "fault": STR, "fence": STR, "replays": INT, "stale_replays": INT,
                                "stale_read_replays": INT, "output_replays": INT, "carried_replays": INT,
                                "findings": INT, "graph_findings": INT, "graph_nodes": INT,
                                "collective_nodes": INT, "error": Nullable(STR), "state": STR,
                                "stack": Nullable(STR)}]}),
    "confidence?": Nullable({"target_width": NUMBER, "level": NUMBER, "cap": INT, "width": NUMBER,
                             "reached": BOOL}),
    "pressure?": Nullable({"mode": OneOf("separate process", "same process", "none"),
                           "settings": {"gemm": INT, "gemm_streams": INT, "copy_mib": INT,
                                        "copy": OneOf("h2d", "d2h", "both"), "process": OneOf("separate", "same")},
                           "achieved": Nullable({"seconds": NUMBER, "gemms": INT, "copies": INT,
                                                 "gemm_tflops": NUMBER, "copy_gbps": NUMBER}),
                           "why?": STR, "pid?": INT, "exit_code?": Nullable(INT)}),
    "timeline?": Nullable({
        "clock": OneOf("virtual", "device"),
        "spans": [{"stream": STR, "name": STR, "kind": SPAN_KINDS, "start_us": NUMBER,
                   "end_us": NUMBER, "layer?": INT}],
        "stale_layers": [INT],
        "backup_stale_layers?": [INT],
        "fault?": STR,
    }),
}

SCHEMA = {
    "schema_version": INT,
    "run_id?": STR,
    "git_commit?": Nullable(STR),
    "started?": STR,
    "finished?": STR,
    "environment": {"device": STR, "torch?": STR, "gpu?": STR, "driver?": STR},
    "summary": {"scenarios": INT, "met": INT, "errors": INT},
    "scenarios": [SCENARIO],
    "skipped?": Nullable([{"name": STR, "why": STR}]),
    "pairs?": Nullable([{"kind": OneOf("fence", "pressure"), "a": STR, "b": STR, "differs": STR,
                         "a_stale": INT, "a_replays": INT, "b_stale": INT, "b_replays": INT,
                         "p_value": NUMBER}]),
    "mutants?": Nullable({
        "matrix": [{"name": STR, "role": OneOf("mutant", "correct"), "variant": STR,
                    "outcome": OneOf("killed", "survived", "clean", "flagged", "error"),
                    "stale_rate": NUMBER, "findings": INT}],
    }),
    "bench?": Nullable({
        "points": [{"model": STR, "layers": INT, "prefix": INT, "strategy": STR,
                    "median_ms": NUMBER, "p10_ms": NUMBER, "p90_ms": NUMBER,
                    "ratio_to_bound": NUMBER, "load_ms": NUMBER, "compute_ms": NUMBER}],
    }),
    "graph_check?": Nullable({
        "scenarios": [{"name": STR, "expect": OneOf("race", "clean", "wrong"),
                       "graph": OneOf("race", "clean", "error", "not checked"),
                       "status": OneOf("agrees", "disagrees", "error", "not a graph race", "not checked"),
                       "compared": BOOL, "findings": INT, "op_list": OneOf("matched", "differs", "not read", "-"),
                       "nodes": [INT], "error": Nullable(STR), "unavailable": Nullable(STR)}],
        "counts": MapOf(INT),
    }),
    "checking?": Nullable({
        "points": [{"shape": STR, "device_ms": NUMBER, "replays": INT, "replays_per_s": NUMBER,
                    "overhead": NUMBER, "stale_replays": INT}],
    }),
    "shard?": Nullable(STR),
    "shard_of?": Nullable([STR]),
    "merge?": Nullable({
        "runs": [{"source": STR, "shard": Nullable(STR), "scenarios": INT, "partial": BOOL}],
        "shard_count": Nullable(INT), "shards": [STR], "missing": [STR], "complete": BOOL,
    }),
}


# --- checking ------------------------------------------------------------------------------


def _is(value, kind: str) -> bool:
    # bool is an int subclass in Python; JSON true is never a count or a rate.
    if kind == NUMBER:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == INT:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == STR:
        return isinstance(value, str)
    return isinstance(value, bool)  # BOOL


def _describe(spec) -> str:
    if isinstance(spec, str):
        names = {NUMBER: "a number", INT: "an integer", STR: "a string", BOOL: "true or false"}
        return names.get(spec, "anything")
    if isinstance(spec, OneOf):
        return "one of " + ", ".join(json.dumps(v) for v in spec.values)
    if isinstance(spec, Nullable):
        return f"{_describe(spec.inner)} or null"
    if isinstance(spec, list):
        return "a list"
    return "an object"


def _short(value) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def _check(value, spec, key: str, source: str) -> None:
    def fail(message: str):
        raise ReportInputError(source, key or "(top level)", message)

    if isinstance(spec, Nullable):
        if value is not None:
            _check(value, spec.inner, key, source)
        return
    if isinstance(spec, OneOf):
        if value not in spec.values or isinstance(value, bool):
            fail(f"expected {_describe(spec)}, got {_short(value)}")
        return
    if isinstance(spec, list):
        if not isinstance(value, list):
            fail(f"expected a list, got {_short(value)}")
        for i, item in enumerate(value):
            _check(item, spec[0], f"{key}[{i}]", source)
        return
    if isinstance(spec, MapOf):
        if not isinstance(value, dict):
            fail(f"expected an object, got {_short(value)}")
        for k, v in value.items():
            _check(v, spec.inner, f"{key}.{k}", source)
        return
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            fail(f"expected an object, got {_short(value)}")
        for name, inner in spec.items():
            optional = name.endswith("?")
            name = name.rstrip("?")
            path = f"{key}.{name}" if key else name
            if name not in value:
                if optional:
                    continue
                raise ReportInputError(source, path, f"missing (expected {_describe(inner)})")
            _check(value[name], inner, path, source)
        return
    if not _is(value, spec):
        fail(f"expected {_describe(spec)}, got {_short(value)}")


def validate(doc, source: str = "results.json") -> None:
    """Raise ReportInputError naming `source` and the first bad key; return None when fine."""
    if not isinstance(doc, dict):
        raise ReportInputError(source, "(top level)", f"expected a JSON object, got {_short(doc)}")
    # The version first: another schema fails on it, not on whichever key moved.
    version = doc.get("schema_version")
    if version != SCHEMA_VERSION or isinstance(version, bool):
        found = "missing" if "schema_version" not in doc else f"got {_short(version)}"
        raise ReportInputError(source, "schema_version", f"expected {SCHEMA_VERSION}, {found}")
    _check(doc, SCHEMA, "", source)
    for i, s in enumerate(doc["scenarios"]):
        records = s.get("finding_records")
        if records is not None and len(records) != len(s["findings"]):
            raise ReportInputError(source, f"scenarios[{i}].finding_records",
                                   f"{len(records)} records for {len(s['findings'])} findings; "
                                   "expected one per finding, in the same order")
        interval = s.get("stale_interval")
        if interval is not None and (len(interval) != 2 or not 0 <= interval[0] <= interval[1] <= 1):
            raise ReportInputError(source, f"scenarios[{i}].stale_interval",
                                   f"expected [low, high] with 0 <= low <= high <= 1, got {_short(interval)}")
    names = [s["name"] for s in doc["scenarios"]]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ReportInputError(source, "scenarios", f"scenario name '{dup}' appears twice")
    for i, pair in enumerate(doc.get("pairs") or []):
        for side in ("a", "b"):
            if pair[side] not in names:
                raise ReportInputError(source, f"pairs[{i}].{side}",
                                       f"'{pair[side]}' is not a scenario of this file")


def load(path: Path) -> dict:
    """Read and validate one results.json; every failure is one ReportInputError line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ReportInputError(str(path), "", f"cannot read: {reason}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        where = f"line {e.lineno} column {e.colno}"
        raise ReportInputError(str(path), "", f"not valid JSON: {e.msg} at {where}") from None
    validate(doc, str(path))
    return doc
