"""Several runs' results.json documents as one: the shards of a CI matrix, put back together.

Each input is a results.json of `run`, `mutants` or the pytest plugin. The merged document is
what one runner would have written for the same scenarios: every scenario entry once (in the
order of the set the shards were cut from), the kill-matrix rows and the skipped scenarios of
every input, and `summary` and `pairs` worked out again over the whole (a fenced / unfenced pair
may have run on two runners). A `merge` section says which runs went in, which shards of how
many were there, and whether the set is complete.

Refused, each as one ReportInputError line (exit 2): runs of different commits, or of different
devices (kind, GPU model, torch, simulator costs: their verdicts are not one runner's); a mix of
shards and whole runs, shards of different counts, a shard given twice, shards cut from
different scenario sets, or a shard holding a scenario that hashes to another; one scenario in
two inputs with different verdicts (the same verdict twice keeps the first, and the merge reports
it); and a document of another command (bench, fences, soak, graph-check, checking), whose
sections are not scenario runs.
"""

from __future__ import annotations

import calendar
import time
from dataclasses import dataclass, field

from harness.input.shard import Shard, parse_shard
from harness.records.errors import ReportInputError
from harness.report.results import build_document

# What a runner's environment must share with the others' for its verdicts to count as the
# same runner's: the device kind, the GPU model, torch, the simulator's cost model.
SAME_ENVIRONMENT = ("device", "gpu", "torch", "costs")
# Per-runner parts of an environment: each run's own, kept in merge.runs.
PER_RUNNER = ("workers", "gpus", "host")
# Sections of other commands: not scenario runs, nothing that adds up.
NOT_MERGED = ("bench", "checking", "strategies", "soak", "graph_check")


@dataclass(frozen=True)
class Merged:
    doc: dict
    repeated: list[str] = field(default_factory=list)  # scenarios in two inputs with one verdict
    missing: list[str] = field(default_factory=list)  # shards of the count that were not given

    @property
    def complete(self) -> bool:
        return not self.missing


def shard_sections(shard: Shard, names: list[str]) -> dict:
    """What a shard's results.json records beside its scenarios: `shard` ("K/N") and `shard_of`,
    the names of the scenarios it is one share of, in run order (every shard of a run has the same
    list: merge checks it, and orders the merged entries by it)."""
    return {"shard": str(shard), "shard_of": list(names)}


def _verdict(entry: dict) -> tuple:
    return entry["expect"], entry["observed"], entry["met"], entry["error"] is not None


def _verdict_text(entry: dict) -> str:
    observed = "error" if entry["error"] is not None else entry["observed"]
    return f"expected {entry['expect']}, observed {observed}, {'met' if entry['met'] else 'not met'}"


def _seconds(stamp: str) -> float:
    return float(calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")))


def _shard(source: str, doc: dict) -> Shard | None:
    text = doc.get("shard")
    if text is None:
        return None
    try:
        return parse_shard(text)
    except ValueError as e:
        raise ReportInputError(source, "shard", str(e)) from None


def _check_alike(docs: list[tuple[str, dict]]) -> None:
    for source, doc in docs:
        for section in NOT_MERGED:
            if doc.get(section) is not None:
                raise ReportInputError(source, section, "a section of another command: merge combines scenario "
                                                        "runs (run, mutants, the pytest plugin)")
    # A run with no commit (a copy of the tree without git) has nothing to compare.
    known = [(source, doc["git_commit"]) for source, doc in docs if doc.get("git_commit")]
    for source, commit in known[1:]:
        if commit != known[0][1]:
            raise ReportInputError(source, "git_commit", f"{commit} is not {known[0][0]}'s {known[0][1]}: a "
                                                         "merge combines runs of one commit")
    first_source, first = docs[0]
    for source, doc in docs[1:]:
        for key in SAME_ENVIRONMENT:
            a, b = first["environment"].get(key), doc["environment"].get(key)
            if a != b:
                raise ReportInputError(source, f"environment.{key}", f"{b!r} is not {first_source}'s {a!r}: a "
                                                                     "merge combines runs of one device")


def _check_shards(docs: list[tuple[str, dict]]) -> tuple[int | None, list[str], list[str]]:
    """(the shard count or None for whole runs, the shards given, those missing)."""
    shards = [(source, _shard(source, doc)) for source, doc in docs]
    sharded = [(source, s) for source, s in shards if s is not None]
    if not sharded:
        return None, [], []
    if len(sharded) != len(shards):
        whole = next(source for source, s in shards if s is None)
        raise ReportInputError(whole, "shard", f"missing: a whole run, where {sharded[0][0]} is shard "
                                               f"{sharded[0][1]}; merge shards of one run, or whole runs")
    count = sharded[0][1].count
    seen: dict[int, str] = {}
    for source, s in sharded:
        if s.count != count:
            raise ReportInputError(source, "shard", f"{s} is of {s.count} shards, {sharded[0][0]}'s of {count}: "
                                                    "merge the shards of one matrix")
        if s.index in seen:
            raise ReportInputError(source, "shard", f"{s} is {seen[s.index]}'s shard too: give each shard once")
        seen[s.index] = source
    cut_from = [(source, doc["shard_of"]) for source, doc in docs if doc.get("shard_of") is not None]
    for source, names in cut_from[1:]:
        if names != cut_from[0][1]:
            raise ReportInputError(source, "shard_of", f"cut from {len(names)} scenarios, not {cut_from[0][0]}'s "
                                                       f"{len(cut_from[0][1])} (or not the same ones): the shards "
                                                       "of one run take the same files and -k")
    for (source, doc), (_, s) in zip(docs, sharded, strict=True):
        for i, entry in enumerate(doc["scenarios"]):
            if not s.holds(entry["name"]):  # so no two shards can hold one scenario
                raise ReportInputError(source, f"scenarios[{i}]", f"'{entry['name']}' is not of shard {s}: "
                                                                  "the shards were cut by another rule")
    given = [str(Shard(k, count)) for k in sorted(seen)]
    missing = [str(Shard(k, count)) for k in range(1, count + 1) if k not in seen]
    return count, given, missing


def merge_documents(docs: list[tuple[str, dict]]) -> Merged:
    """One document from `docs`, each (where it came from, its validated results.json)."""
    if not docs:
        raise ReportInputError("merge", "", "no results to merge")
    _check_alike(docs)
    count, given, missing = _check_shards(docs)
    entries: dict[str, dict] = {}
    owner: dict[str, str] = {}
    repeated: list[str] = []
    for source, doc in docs:
        for entry in doc["scenarios"]:
            name = entry["name"]
            if name not in entries:
                tag = {"shard": doc["shard"]} if doc.get("shard") else {}
                entries[name], owner[name] = {**entry, **tag}, source
            elif _verdict(entry) != _verdict(entries[name]):
                raise ReportInputError(source, f"scenario '{name}'",
                                       f"{_verdict_text(entry)}, where {owner[name]} has "
                                       f"{_verdict_text(entries[name])}: one scenario, two verdicts")
            else:
                repeated.append(name)
    cut_from: list[str] = next((doc["shard_of"] for _, doc in docs if doc.get("shard_of") is not None), [])
    order = {name: i for i, name in enumerate(cut_from)}

    def by_order(item: dict) -> int:
        return order.get(item["name"], len(order))

    scenarios = sorted(entries.values(), key=by_order)  # stable: inputs in the order given after that
    rows = _union((doc.get("mutants") or {}).get("matrix") for _, doc in docs)
    skipped = _union(doc.get("skipped") for _, doc in docs)
    not_run = list(dict.fromkeys(n for _, doc in docs for n in doc.get("not_run") or ()))
    sections: dict = {
        **({"mutants": {"matrix": sorted(rows, key=by_order)}} if rows else {}),
        **({"skipped": sorted(skipped, key=by_order)} if skipped else {}),
        "merge": {
            "runs": [_run(source, doc) for source, doc in docs],
            "shard_count": count, "shards": given, "missing": missing, "complete": not missing,
        },
    }
    cut = [doc for _, doc in docs if doc.get("partial")]
    if cut:
        sections.update(partial=True, interrupted=cut[0].get("interrupted"),
                        not_run=sorted(not_run, key=lambda n: order.get(n, len(order))))
    first = docs[0][1]
    environment = {k: v for k, v in first["environment"].items() if k not in PER_RUNNER}
    started = [_seconds(doc["started"]) for _, doc in docs if doc.get("started")]
    finished = [_seconds(doc["finished"]) for _, doc in docs if doc.get("finished")]
    doc = build_document(scenarios, environment, min(started, default=0.0), max(finished, default=0.0), sections)
    doc["git_commit"] = next((d["git_commit"] for _, d in docs if d.get("git_commit")), None)
    return Merged(doc, repeated, missing)


def _union(lists) -> list[dict]:
    """Records by name, the first of each name kept, in the order met."""
    found: dict[str, dict] = {}
    for records in lists:
        for record in records or ():
            found.setdefault(record["name"], record)
    return list(found.values())


def _run(source: str, doc: dict) -> dict:
    env = doc["environment"]
    return {"source": source, "shard": doc.get("shard"), "run_id": doc.get("run_id"), "host": env.get("host"),
            "gpus": env.get("gpus"), "started": doc.get("started"), "finished": doc.get("finished"),
            "scenarios": len(doc["scenarios"]), "partial": bool(doc.get("partial"))}
