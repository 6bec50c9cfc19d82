"""`merge_documents`: the shards of a run as one document, and every mix it refuses, on hand-made
documents (the command line's end-to-end merge is in tests/frontends/test_shard_merge.py)."""

from __future__ import annotations

import copy

import pytest

from harness.input.shard import Shard
from harness.records.errors import ReportInputError
from harness.report.merge import merge_documents, shard_sections
from harness.report.schema import validate

COMMIT = "a" * 40
NAMES = ["alpha", "beta", "gamma", "delta"]  # alpha, gamma: shard 1 of 2; beta, delta: 2


def entry(name: str, expect: str = "race", observed: str | None = "race", error: str | None = None,
          fence: str = "none", model: str | None = None) -> dict:
    met = error is None and observed == expect
    stale = 3 if observed == "race" else 0
    return {"name": name, "expect": expect, "observed": observed, "met": met, "error": error, "replays": 3,
            "stale_replays": stale, "stale_rate": stale / 3, "stale_layers": {}, "findings": [],
            "definition": {"backend": "full", "fence": fence, "model": model or name},
            "verdict": f"observed {observed}", "timings": {"replays_per_s": 1.0}}


def doc(entries: list[dict], shard: str | None = None, of: list[str] | None = None, **top) -> dict:
    d = {"schema_version": 1, "run_id": "r", "git_commit": COMMIT, "started": "2026-01-01T00:00:10Z",
         "finished": "2026-01-01T00:01:00Z", "command": ["x"],
         "environment": {"device": "sim", "torch": "2.13.0", "host": "h"},
         "summary": {"scenarios": len(entries), "met": sum(e["met"] for e in entries), "errors": 0},
         "scenarios": entries, **top}
    if shard is not None:
        d.update(shard=shard, shard_of=of if of is not None else NAMES)
    return d


def two_shards() -> list[tuple[str, dict]]:
    # Shards cut from NAMES: the merged entries come back in NAMES's order, whatever the inputs'.
    first = doc([entry("gamma", "clean", "clean", fence="final_event", model="beta"), entry("alpha")], "1/2")
    second = doc([entry("delta"), entry("beta")], "2/2", started="2026-01-01T00:00:05Z",
                 finished="2026-01-01T00:02:00Z")
    return [("a/results.json", first), ("b/results.json", second)]


def test_two_shards_merge_into_one_document_in_the_order_they_were_cut_from():
    merged = merge_documents(two_shards())
    d = merged.doc
    validate(d)
    assert [e["name"] for e in d["scenarios"]] == NAMES
    assert [e["shard"] for e in d["scenarios"]] == ["1/2", "2/2", "1/2", "2/2"]  # who ran it
    assert d["summary"] == {"scenarios": 4, "met": 4, "errors": 0}
    assert (d["started"], d["finished"], d["git_commit"]) == ("2026-01-01T00:00:05Z", "2026-01-01T00:02:00Z", COMMIT)
    assert d["merge"]["shards"] == ["1/2", "2/2"] and d["merge"]["shard_count"] == 2
    assert d["merge"]["complete"] and merged.complete and not d["merge"]["missing"]
    assert [r["source"] for r in d["merge"]["runs"]] == ["a/results.json", "b/results.json"]
    assert "shard" not in d and "host" not in d["environment"]  # the merged run is no shard of one host
    # A fenced / unfenced pair whose two halves ran on two runners is a pair of the merged run.
    assert [(p["a"], p["b"]) for p in d["pairs"]] == [("beta", "gamma")]


def test_a_missing_shard_leaves_the_set_incomplete():
    merged = merge_documents(two_shards()[:1])
    assert merged.missing == ["2/2"] and not merged.complete
    assert merged.doc["merge"]["complete"] is False and merged.doc["merge"]["missing"] == ["2/2"]


def test_whole_runs_merge_too_and_a_repeated_scenario_with_one_verdict_is_kept_once():
    a = doc([entry("one"), entry("two", "clean", "clean")])
    b = doc([entry("two", "clean", "clean"), entry("three")])
    merged = merge_documents([("a", a), ("b", b)])
    assert [e["name"] for e in merged.doc["scenarios"]] == ["one", "two", "three"]
    assert merged.repeated == ["two"] and merged.complete and merged.doc["merge"]["shard_count"] is None


def test_a_failed_scenario_stays_failed():
    docs = two_shards()
    docs[1][1]["scenarios"][0] = entry("delta", "race", "clean")
    d = merge_documents(docs).doc
    assert d["summary"]["met"] == 3 and not next(e for e in d["scenarios"] if e["name"] == "delta")["met"]


def test_kill_matrix_rows_and_skipped_scenarios_of_every_shard():
    docs = two_shards()
    row = {"role": "mutant", "variant": "v", "outcome": "killed", "stale_rate": 1.0, "findings": 1}
    docs[0][1]["mutants"] = {"matrix": [{**row, "name": "gamma"}]}
    docs[1][1]["mutants"] = {"matrix": [{**row, "name": "beta"}]}
    docs[1][1]["skipped"] = [{"name": "five", "why": "runs only on cuda"}]
    d = merge_documents(docs).doc
    validate(d)
    assert [r["name"] for r in d["mutants"]["matrix"]] == ["beta", "gamma"]
    assert d["skipped"] == [{"name": "five", "why": "runs only on cuda"}]


def test_a_partial_shard_makes_a_partial_merge():
    docs = two_shards()
    docs[1][1].update(partial=True, interrupted="SIGTERM", not_run=["delta"])
    docs[1][1]["scenarios"] = [entry("beta")]
    d = merge_documents(docs).doc
    assert (d["partial"], d["interrupted"], d["not_run"]) == (True, "SIGTERM", ["delta"])
    assert [r["partial"] for r in d["merge"]["runs"]] == [False, True]


def test_shard_sections_are_what_merge_reads():
    assert shard_sections(Shard(2, 3), ["a", "b"]) == {"shard": "2/3", "shard_of": ["a", "b"]}


def _refused(docs, source: str, key: str, words: str) -> None:
    with pytest.raises(ReportInputError) as e:
        merge_documents(docs)
    assert (e.value.source, e.value.key) == (source, key), str(e.value)
    assert words in e.value.message
    assert "\n" not in str(e.value)


def test_one_scenario_with_two_verdicts_is_refused():
    a = doc([entry("one")])
    b = doc([entry("one", "race", "clean")])
    _refused([("a", a), ("b", b)], "b", "scenario 'one'",
             "expected race, observed clean, not met, where a has expected race, observed race, met: "
             "one scenario, two verdicts")


@pytest.mark.parametrize("key, value, words", [
    ("device", "cuda", "'cuda' is not a's 'sim': a merge combines runs of one device"),
    ("gpu", "NVIDIA H200", "'NVIDIA H200' is not a's None"),
    ("torch", "2.11.0", "'2.11.0' is not a's '2.13.0'"),
    ("costs", {"launch_us": 9.0}, "is not a's None"),
])
def test_runs_of_another_device_are_refused(key, value, words):
    a, b = two_shards()
    b[1]["environment"][key] = value
    _refused([("a", a[1]), ("b", b[1])], "b", f"environment.{key}", words)


def test_runs_of_another_commit_are_refused_and_an_unknown_commit_is_not():
    a, b = two_shards()
    b[1]["git_commit"] = "b" * 40
    _refused([a, b], "b/results.json", "git_commit", "a merge combines runs of one commit")
    b[1]["git_commit"] = None  # a copy of the tree without git: nothing to compare
    assert merge_documents([a, b]).complete
    a[1]["git_commit"], b[1]["git_commit"] = None, "b" * 40
    _refused([a, b, ("c", doc([], "2/2", git_commit=COMMIT))], "c", "git_commit",
             f"{COMMIT} is not b/results.json's {'b' * 40}")


def test_shards_that_do_not_belong_together_are_refused():
    a, b = two_shards()
    _refused([a, copy.deepcopy(a)], "a/results.json", "shard", "1/2 is a/results.json's shard too")
    third = (b[0], {**b[1], "shard": "2/3"})
    _refused([a, third], "b/results.json", "shard", "2/3 is of 3 shards, a/results.json's of 2")
    whole = (b[0], {k: v for k, v in b[1].items() if k not in ("shard", "shard_of")})
    _refused([a, whole], "b/results.json", "shard", "missing: a whole run, where a/results.json is shard 1/2")
    other_set = (b[0], {**b[1], "shard_of": NAMES[:3]})
    _refused([a, other_set], "b/results.json", "shard_of", "cut from 3 scenarios, not a/results.json's 4")
    moved = (b[0], {**b[1], "scenarios": [entry("alpha")]})  # alpha hashes to shard 1
    _refused([a, moved], "b/results.json", "scenarios[0]", "'alpha' is not of shard 2/2")
    bad = (b[0], {**b[1], "shard": "3/2"})
    _refused([a, bad], "b/results.json", "shard", "expected K/N with whole numbers 1 <= K <= N")


@pytest.mark.parametrize("section", ["bench", "checking", "strategies", "soak", "graph_check"])
def test_a_document_of_another_command_is_refused(section):
    a, b = two_shards()
    b[1][section] = {"points": []}
    _refused([a, b], "b/results.json", section, "merge combines scenario runs")


def test_nothing_to_merge_is_refused():
    _refused([], "merge", "", "no results to merge")
