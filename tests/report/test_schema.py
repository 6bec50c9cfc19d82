"""results.json schema: what the harness writes validates, and every kind of bad document is one
InputError line (exit 2) naming the file and the key."""

from __future__ import annotations

import copy
import json
import time

import pytest

from harness.records.errors import InputError, ReportInputError
from harness.report.schema import load, validate
from tests.support.paths import ROOT

SAMPLE = ROOT / "tests" / "data" / "report" / "results-h200-core.json"
FULL = ROOT / "tests" / "data" / "report" / "results-full.json"

TINY = (ROOT / "tests" / "data" / "tiny.toml").read_text()  # the CLI tests' scenarios


def test_a_document_the_harness_builds_survives_json_and_validates(tmp_path):
    from harness.devices import open_device
    from harness.input.scenario_file import parse_text
    from harness.report.results import build_results, write_results
    from harness.run.pipeline import run_scenario

    dev = open_device("sim", [])
    started = time.time()
    results = [run_scenario(s, dev, replays=2) for s in parse_text(TINY, "tiny.toml")]
    doc = build_results(results, dev.describe(), started, time.time())
    validate(doc)
    path = write_results(tmp_path, doc)
    assert load(path) == json.loads(json.dumps(doc))


@pytest.mark.parametrize("path", [SAMPLE, FULL], ids=["sample", "fixture"])
def test_committed_documents_validate_and_round_trip(path, tmp_path):
    doc = load(path)
    again = tmp_path / "again.json"
    again.write_text(json.dumps(doc))
    assert load(again) == doc


def test_the_fixture_holds_every_optional_section():
    doc = load(FULL)
    assert doc["mutants"]["matrix"] and doc["bench"]["points"]
    keys = set().union(*(s.keys() for s in doc["scenarios"]))
    assert {"sweep", "hazard", "fault_mode", "timeline"} <= keys
    assert {s["hazard"] for s in doc["scenarios"]} == {"raw", "waw", "war"}
    assert None in {s["fault_mode"] for s in doc["scenarios"]}


def _mutate(doc: dict, change) -> dict:
    doc = copy.deepcopy(doc)
    change(doc)
    return doc


def _set(path: list, value):
    def change(doc):
        target = doc
        for step in path[:-1]:
            target = target[step]
        if value is KeyError:
            del target[path[-1]]
        else:
            target[path[-1]] = value
    return change


# (what is wrong, change, the key the message must name)
BAD = [
    ("newer schema", _set(["schema_version"], 2), "schema_version"),
    ("no schema version", _set(["schema_version"], KeyError), "schema_version"),
    ("version as text", _set(["schema_version"], "1"), "schema_version"),
    ("no scenarios", _set(["scenarios"], KeyError), "scenarios"),
    ("scenarios not a list", _set(["scenarios"], {}), "scenarios"),
    ("no environment", _set(["environment"], KeyError), "environment"),
    ("missing stale_rate", _set(["scenarios", 1, "stale_rate"], KeyError), "scenarios[1].stale_rate"),
    ("rate as text", _set(["scenarios", 0, "stale_rate"], "100%"), "scenarios[0].stale_rate"),
    ("bool for a count", _set(["scenarios", 0, "replays"], True), "scenarios[0].replays"),
    ("unknown verdict", _set(["scenarios", 2, "observed"], "maybe"), "scenarios[2].observed"),
    ("finding not text", _set(["scenarios", 0, "findings", 3], 7), "scenarios[0].findings[3]"),
    ("layer count as text", _set(["scenarios", 0, "stale_layers", "2"], "many"), "scenarios[0].stale_layers.2"),
    ("sweep point without us", _set(["scenarios", 0, "sweep", 2, "us"], KeyError), "scenarios[0].sweep[2].us"),
    ("unknown hazard", _set(["scenarios", 4, "hazard"], "rar"), "scenarios[4].hazard"),
    ("fault mode a number", _set(["scenarios", 0, "fault_mode"], 3), "scenarios[0].fault_mode"),
    ("unknown clock", _set(["scenarios", 0, "timeline", "clock"], "wall"), "scenarios[0].timeline.clock"),
    ("unknown span kind", _set(["scenarios", 0, "timeline", "spans", 5, "kind"], "memset"),
     "scenarios[0].timeline.spans[5].kind"),
    ("stale layer not an int", _set(["scenarios", 0, "timeline", "stale_layers", 0], 0.5),
     "scenarios[0].timeline.stale_layers[0]"),
    ("unknown outcome", _set(["mutants", "matrix", 3, "outcome"], "dead"), "mutants.matrix[3].outcome"),
    ("mutant role missing", _set(["mutants", "matrix", 0, "role"], KeyError), "mutants.matrix[0].role"),
    ("bench without points", _set(["bench", "points"], KeyError), "bench.points"),
    ("bench median missing", _set(["bench", "points", 4, "median_ms"], KeyError), "bench.points[4].median_ms"),
    ("duplicate scenario", lambda d: d["scenarios"].append(copy.deepcopy(d["scenarios"][0])), "scenarios"),
]


@pytest.mark.parametrize("what,change,key", BAD, ids=[b[0] for b in BAD])
def test_a_wrong_document_names_file_and_key(what, change, key, tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(_mutate(load(FULL), change)))
    with pytest.raises(ReportInputError) as e:
        load(path)
    assert isinstance(e.value, InputError) and e.value.exit_code == 2
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: {key}: "), message


@pytest.mark.parametrize("text,needle", [
    ("{", "not valid JSON"),
    ("", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ("null", "expected a JSON object"),
])
def test_a_corrupt_file_is_one_line(tmp_path, text, needle):
    path = tmp_path / "results.json"
    path.write_text(text)
    with pytest.raises(ReportInputError, match=needle) as e:
        load(path)
    assert str(e.value).startswith(str(path)) and "\n" not in str(e.value)


def test_a_missing_file_is_one_line(tmp_path):
    with pytest.raises(ReportInputError, match="cannot read"):
        load(tmp_path / "nope.json")


def test_unknown_keys_are_allowed_for_newer_writers():
    doc = load(FULL)
    doc["scenarios"][0]["something_new"] = {"x": 1}
    doc["extra"] = []
    validate(doc)


def _with_records(doc: dict) -> dict:
    """The fixture with finding_records on its first scenario, one per finding (its older
    writer had none: the key is optional)."""
    doc = copy.deepcopy(doc)
    entry = doc["scenarios"][0]
    record = {"kind": "read-after-write", "copy_region": {"pool": "k", "layer": 0, "start": 16, "stop": 272},
              "access_region": {"pool": "k", "layer": 0, "start": 16, "stop": 272}, "what": "L0 attention",
              "in_replay": True, "access_first": False, "streams": {"copy": "load", "access": "forward"}}
    entry["finding_records"] = [copy.deepcopy(record) for _ in entry["findings"]]
    return doc


def test_finding_records_are_optional_and_checked_when_present():
    doc = load(FULL)
    assert all("finding_records" not in s for s in doc["scenarios"])
    validate(doc)
    validate(_with_records(doc))


@pytest.mark.parametrize("what,change,key", [
    ("unknown kind", _set(["scenarios", 0, "finding_records", 2, "kind"], "read-after-read"),
     "scenarios[0].finding_records[2].kind"),
    ("region without its layer", _set(["scenarios", 0, "finding_records", 0, "copy_region", "layer"], KeyError),
     "scenarios[0].finding_records[0].copy_region.layer"),
    ("streams by label, not role", _set(["scenarios", 0, "finding_records", 1, "streams"], ["load", "forward"]),
     "scenarios[0].finding_records[1].streams"),
    ("a record too few", lambda d: d["scenarios"][0]["finding_records"].pop(), "scenarios[0].finding_records"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_a_wrong_finding_record_names_its_key(what, change, key, tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(_mutate(_with_records(load(FULL)), change)))
    with pytest.raises(ReportInputError) as e:
        load(path)
    assert str(e.value).startswith(f"{path}: {key}: "), str(e.value)


def test_what_this_build_writes_carries_one_record_per_finding():
    from harness.devices.sim import SimDevice
    from harness.input.scenario_file import parse_text
    from harness.report.results import build_results
    from harness.run.pipeline import run_scenario

    racy = next(s for s in parse_text(TINY, "tiny.toml") if s.fence == "none")
    r = run_scenario(racy, SimDevice(), replays=1)
    (entry,) = build_results([r], SimDevice().describe(), time.time(), time.time())["scenarios"]
    assert len(entry["finding_records"]) == len(entry["findings"]) == len(r.findings) > 0
    first = entry["finding_records"][0]
    assert first["streams"] == {"copy": r.findings[0].copy_stream, "access": r.findings[0].access_stream}
    assert first["kind"] == r.findings[0].kind.value and first["what"] == r.findings[0].what
