"""GPU pinning and the merge of worker results, on the CPU with simulated workers."""

from __future__ import annotations

import json
import types

import pytest

from harness.devices import nvml
from harness.frontends import gpu_workers as gw
from harness.frontends.cli import main
from tests.support.paths import ROOT

SAMPLES = ROOT / "reports" / "samples"
GPUS = ["GPU-aaaa-0000", "GPU-bbbb-1111", "GPU-cccc-2222", "GPU-dddd-3333"]


def fake_nvml(uuids):
    return lambda: list(uuids)


@pytest.mark.parametrize("spec, visible", [
    (None, GPUS),
    ("2", ["GPU-cccc-2222"]),
    ("3,1", ["GPU-dddd-3333", "GPU-bbbb-1111"]),
    ("GPU-bbbb", ["GPU-bbbb-1111"]),  # CUDA takes a unique UUID prefix
    ("0,9,1", ["GPU-aaaa-0000"]),  # CUDA stops at the first entry that names no GPU
    ("GPU-", []),  # ambiguous prefix
    ("MIG-0f1e2d3c", []),  # MIG instances are left alone
    ("", []),
])
def test_visible_gpus_reads_cuda_visible_devices_as_cuda_does(spec, visible):
    assert gw.visible_gpus(GPUS, spec) == visible


@pytest.mark.parametrize("worker, pinned", [("gw0", GPUS[0]), ("gw3", GPUS[3]), ("gw5", GPUS[1])])
def test_each_worker_pins_gpu_worker_index_modulo_count(worker, pinned):
    env = {"PYTEST_XDIST_WORKER": worker}
    assert gw.pin_worker(env, fake_nvml(GPUS)) == pinned
    assert env["CUDA_VISIBLE_DEVICES"] == pinned
    # Again (the plugin pins at two hooks): the same GPU, though NVML still lists all four.
    assert gw.pin_worker(env, fake_nvml(GPUS)) == pinned


def test_workers_share_out_only_the_gpus_already_made_visible():
    pins = []
    for worker in ("gw0", "gw1", "gw2"):
        env = {"PYTEST_XDIST_WORKER": worker, "CUDA_VISIBLE_DEVICES": "1,2"}
        pins.append(gw.pin_worker(env, fake_nvml(GPUS)))
    assert pins == [GPUS[1], GPUS[2], GPUS[1]]


@pytest.mark.parametrize("env, uuids", [
    ({}, GPUS),  # not an xdist worker
    ({"PYTEST_XDIST_WORKER": "gw1"}, []),  # no NVML or no GPUs
    ({"PYTEST_XDIST_WORKER": "gw1", "CUDA_VISIBLE_DEVICES": "MIG-1"}, GPUS),
])
def test_pinning_does_nothing_without_a_worker_or_gpus(env, uuids):
    before = dict(env)
    assert gw.pin_worker(env, fake_nvml(uuids)) is None
    assert env == before


def test_pinning_after_cuda_initialised_is_an_error(monkeypatch):
    monkeypatch.setattr(gw, "_cuda_initialised", lambda: True)
    with pytest.raises(RuntimeError, match="CUDA was initialised before the worker could pin"):
        gw.pin_worker({"PYTEST_XDIST_WORKER": "gw1"}, fake_nvml(GPUS))


def test_nvml_listing_decodes_uuids_and_survives_a_missing_driver(monkeypatch):
    handles = {0: "h0", 1: "h1"}
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=handles.__getitem__,
        nvmlDeviceGetUUID=lambda h: {"h0": b"GPU-x", "h1": "GPU-y"}[h],
    )
    monkeypatch.setitem(__import__("sys").modules, "pynvml", fake)
    assert nvml.gpu_uuids() == ["GPU-x", "GPU-y"]

    def no_driver():
        raise RuntimeError("NVML Shared Library Not Found")

    monkeypatch.setattr(fake, "nvmlInit", no_driver)
    assert nvml.gpu_uuids() == []


def test_count_for_the_makefile(monkeypatch, capsys):
    assert gw.gpu_count({}, fake_nvml(GPUS)) == 4
    assert gw.gpu_count({"CUDA_VISIBLE_DEVICES": "0,1"}, fake_nvml(GPUS)) == 2
    monkeypatch.setattr(nvml, "gpu_uuids", fake_nvml([]))
    assert main(["gpu-workers", "count"]) == 0
    assert capsys.readouterr().out == "1\n"  # no GPUs: still one worker
    monkeypatch.setattr(nvml, "gpu_uuids", fake_nvml(GPUS))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert main(["gpu-workers", "count"]) == 0
    assert capsys.readouterr().out == "4\n"
    with pytest.raises(SystemExit) as e:
        main(["gpu-workers", "bogus"])
    assert e.value.code == 2


@pytest.mark.parametrize("worker", ["gw0", "gw3"])
def test_worker_index(worker):
    assert gw.worker_index(worker) == int(worker[2:])
    assert gw.worker_index(None) is None and gw.worker_index("main") is None


# ---------------------------------------------------------------- merge


def part(names, *, started, finished, met=True, host="node1"):
    """A results.json document as one worker's build_results would make it."""
    return {
        "schema_version": 1,
        "run_id": "x",
        "git_commit": None,
        "started": started,
        "finished": finished,
        "command": ["worker"],
        "environment": {"device": "cuda", "gpu": "NVIDIA H200", "host": host},
        "summary": {},
        "scenarios": [{"name": n, "met": met, "error": None, "observed": "race"} for n in names],
    }


def test_parts_are_written_whole_and_merged_into_one_document(tmp_path):
    gw.write_part(tmp_path, "gw1", GPUS[1], part(["b", "d"], started="2025-01-01T10:00:02Z",
                                                 finished="2025-01-01T10:00:09Z", met=False))
    gw.write_part(tmp_path, "gw0", GPUS[0], part(["c", "a"], started="2025-01-01T10:00:01Z",
                                                 finished="2025-01-01T10:00:07Z"))
    (tmp_path / "part-gw2.tmp").write_text("{half a docu")  # a worker killed mid-write
    parts = gw.read_parts(tmp_path)
    assert [p["worker"] for p in parts] == ["gw0", "gw1"]

    doc = gw.merge(parts, order=["a", "b", "c", "d"], command=["pytest", "-n", "2"])
    assert [e["name"] for e in doc["scenarios"]] == ["a", "b", "c", "d"]
    assert {e["name"]: (e["worker"], e["gpu_uuid"]) for e in doc["scenarios"]} == {
        "a": ("gw0", GPUS[0]), "b": ("gw1", GPUS[1]), "c": ("gw0", GPUS[0]), "d": ("gw1", GPUS[1])}
    assert doc["environment"]["gpus"] == [GPUS[0], GPUS[1]]
    assert doc["environment"]["workers"] == {"gw0": GPUS[0], "gw1": GPUS[1]}
    assert doc["environment"]["gpu"] == "NVIDIA H200"
    assert doc["summary"] == {"scenarios": 4, "met": 2, "errors": 0}
    assert (doc["started"], doc["finished"]) == ("2025-01-01T10:00:01Z", "2025-01-01T10:00:09Z")
    assert doc["command"] == ["pytest", "-n", "2"] and doc["schema_version"] == 1
    json.dumps(doc)  # plain JSON all the way down


def test_merge_keeps_each_scenario_once_and_unknown_names_last():
    parts = [
        {**part(["z", "a"], started="s", finished="f"), "worker": "gw1", "gpu_uuid": None},
        {**part(["a"], started="s", finished="f", met=False), "worker": "gw0", "gpu_uuid": None},
    ]
    doc = gw.merge(parts, order=["a"])
    assert [(e["name"], e["worker"], e["met"]) for e in doc["scenarios"]] == [
        ("a", "gw0", False), ("z", "gw1", True)]
    assert doc["environment"]["gpus"] == []  # the simulator has no GPU
    with pytest.raises(ValueError):
        gw.merge([])


def test_merge_carries_each_parts_kill_matrix_rows_once_in_scenario_order():
    def row(name, role="mutant"):
        return {"name": name, "role": role, "variant": "v", "outcome": "killed", "stale_rate": 1.0, "findings": 0}

    parts = [
        {**part(["m2", "m3"], started="s", finished="f"), "worker": "gw1", "gpu_uuid": GPUS[1],
         "mutants": {"matrix": [row("m2"), row("m3", "correct")]}},
        {**part(["a", "m1"], started="s", finished="f"), "worker": "gw0", "gpu_uuid": GPUS[0],
         "mutants": {"matrix": [row("m1")]}},
    ]
    doc = gw.merge(parts, order=["a", "m1", "m2", "m3"])
    assert [m["name"] for m in doc["mutants"]["matrix"]] == ["m1", "m2", "m3"]
    assert "mutants" not in gw.merge([parts[0] | {"mutants": None}])


def merged(assignments: dict[str, tuple[str, str | None]], workers: dict[str, str | None]) -> dict:
    """A merged document: scenario -> (worker, GPU it reports), and the run's workers."""
    return {"environment": {"workers": workers},
            "scenarios": [{"name": n, "worker": w, "gpu_uuid": g} for n, (w, g) in assignments.items()]}


def test_a_well_spread_run_has_no_problems():
    doc = merged({"a": ("gw0", GPUS[0]), "b": ("gw1", GPUS[1]), "c": ("gw0", GPUS[0])},
                 {"gw0": GPUS[0], "gw1": GPUS[1]})
    assert gw.spread_problems(doc) == []


@pytest.mark.parametrize("assignments, workers, problem", [
    ({"a": ("gw0", GPUS[0]), "b": ("gw1", GPUS[0])}, {"gw0": GPUS[0], "gw1": GPUS[0]},
     f"GPU {GPUS[0]} shared by workers gw0, gw1"),
    ({"a": ("gw0", GPUS[1])}, {"gw0": GPUS[0]}, f"a: GPU {GPUS[1]} is not its worker's ({GPUS[0]})"),
    ({"a": ("gw7", GPUS[0])}, {"gw0": GPUS[0]}, "a: run by 'gw7', not a worker of this run"),
])
def test_spread_problems_name_what_went_wrong(assignments, workers, problem):
    assert problem in gw.spread_problems(merged(assignments, workers))


def test_spread_problems_count_a_scenario_reported_twice():
    doc = merged({"a": ("gw0", GPUS[0])}, {"gw0": GPUS[0]})
    doc["scenarios"].append(dict(doc["scenarios"][0]))
    assert gw.spread_problems(doc) == ["a: reported 2 times"]


def test_check_command_prints_workers_and_exits_by_what_it_found(tmp_path, capsys):
    # A real run's results.json, split between two workers as xdist would, and merged.
    sample = json.loads((SAMPLES / "default-h200" / "results.json").read_text())
    half = len(sample["scenarios"]) // 2
    for worker, gpu, entries in (("gw0", GPUS[0], sample["scenarios"][:half]),
                                 ("gw1", GPUS[1], sample["scenarios"][half:])):
        gw.write_part(tmp_path, worker, gpu, {**sample, "scenarios": entries})
    doc = gw.merge(gw.read_parts(tmp_path))
    good = tmp_path / "good.json"
    good.write_text(json.dumps(doc))
    assert main(["gpu-workers", "check", str(good)]) == 0
    out = capsys.readouterr().out
    n = len(sample["scenarios"])
    assert f"gw0: GPU {GPUS[0]}, {half} scenarios" in out and f"{n} scenarios, 2 workers, 2 GPUs: ok" in out

    doc["environment"]["workers"]["gw1"] = GPUS[0]  # two workers on one GPU
    shared = tmp_path / "shared.json"
    shared.write_text(json.dumps(doc))
    assert main(["gpu-workers", "check", str(shared)]) == 1
    assert "NOT ok" in capsys.readouterr().out

    (tmp_path / "bad.json").write_text("{")
    assert main(["gpu-workers", "check", str(tmp_path / "bad.json")]) == 2
    assert "bad.json" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["gpu-workers", "check"])
    assert e.value.code == 2
