"""The scenario-file loader: the default set, every kind of bad file, round trips."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from harness.input.scenario_file import (
    _MODEL_FIELDS,
    _SCENARIO_FIELDS,
    default_files,
    load_file,
    load_files,
    parse_text,
)
from harness.records.errors import InputError
from harness.records.scenario import (
    Backend,
    DelayWhere,
    DType,
    Expect,
    Fault,
    FaultKind,
    Hazard,
    ModelShape,
    Request,
    Scenario,
    Tolerance,
)
from tests.support.paths import DATA

BAD_DIR = DATA / "bad_scenarios"
EXPECTED = tomllib.loads((BAD_DIR / "EXPECTED.toml").read_text(encoding="utf-8"))
BAD_FILES = sorted(p.name for p in BAD_DIR.glob("*.toml") if p.name != "EXPECTED.toml")

GOOD = """
[defaults]
replays = 50
seed = 7

[models.tiny]
layers = "AM"
hidden = 128
heads = 2
kv_heads = 1
head_dim = 32
dtype = "fp32"
kv_slots = 64
mamba_slots = 3

[[scenario]]
name = "tiny.full_1"
model = "tiny"
batch = [{ prefix = 20, new = 4 }, { prefix = 8, new = 1 }]
backend = "full"
fence = "final_event"
accessor = "none"
fault = { kind = "delay", us = 12.5, where = "first" }
expect = "clean"
replays = 3
poison = -1
tolerance = { rtol = 1e-3, atol = 0 }

[[scenario]]
name = "inline-eager"
model = { layers = "MMA", state = 8 }
batch = [{ prefix = 1, new = 1 }]
backend = "eager"
expect = "race"
poison = "nan"
"""


def _error(path: Path) -> InputError:
    with pytest.raises(InputError) as info:
        load_file(path)
    return info.value


def _assert_one_line(err: InputError) -> None:
    assert "\n" not in str(err) and "\r" not in str(err)


# ---------------------------------------------------------------- the default set


def test_default_set_is_the_twelve_core_scenarios_the_fault_kinds_and_the_write_back():
    files = default_files()
    assert [f.name for f in files] == ["default.toml", "faults.toml", "natural.toml", "tp.toml", "writeback.toml"]
    # Each write-back hazard with the engine's transfer path (clean) and the variant that breaks it.
    writeback = {(s.hazard, s.transfer): s.expect for s in load_file(files[4])}
    assert writeback == {
        (Hazard.STORE, "engine"): Expect.CLEAN, (Hazard.STORE, "no_write_fence"): Expect.RACE,
        (Hazard.REUSE, "engine"): Expect.CLEAN, (Hazard.REUSE, "no_ack_wait"): Expect.RACE,
        (Hazard.STAGING, "engine"): Expect.CLEAN, (Hazard.STAGING, "single_staging"): Expect.RACE,
    }
    faults = load_file(files[1])
    assert {s.fault.kind for s in faults} == {
        FaultKind.GATE, FaultKind.JITTER, FaultKind.CHUNKED, FaultKind.SWEEP
    }
    scenarios = load_file(files[0])
    expected = {}
    for model in ("attention", "mamba", "hybrid"):
        expected[f"{model}-full-none"] = Expect.RACE
        expected[f"{model}-full-final_event"] = Expect.CLEAN
        expected[f"{model}-breakable-none"] = Expect.CLEAN
        expected[f"{model}-eager-nowaits"] = Expect.RACE
    assert {s.name: s.expect for s in scenarios} == expected


def test_default_set_shapes_and_settings():
    layers = {"attention": "AAAA", "mamba": "MMMM", "hybrid": "AMAM"}
    for s in load_file(default_files()[0]):
        model, backend, variant = s.name.split("-")
        assert s.model == ModelShape(layers=layers[model])  # the rest are the defaults
        assert s.backend is Backend(backend)
        assert s.fence == ("final_event" if variant == "final_event" else "none")
        assert s.accessor == ("none" if variant == "nowaits" else "per_layer")
        if variant == "nowaits":  # eager controls: one long delay outlasts host launch time
            assert s.fault == Fault(FaultKind.DELAY, 10000.0, DelayWhere.FIRST)
        else:
            assert s.fault == Fault(FaultKind.DELAY, 1000.0, DelayWhere.EACH)
        assert s.batch == (Request(256, 32), Request(128, 16))
        assert (s.replays, s.seed) == (200, 0)
        assert s.source == str(default_files()[0])


# ---------------------------------------------------------------- bad files


def test_every_bad_file_has_an_expectation():
    assert len(BAD_FILES) >= 25
    assert set(BAD_FILES) == set(EXPECTED)


@pytest.mark.parametrize("name", BAD_FILES)
def test_bad_file_is_rejected(name):
    path = BAD_DIR / name
    err = _error(path)
    want = EXPECTED[name]
    _assert_one_line(err)
    assert err.source == str(path)
    assert err.key == want["key"]
    assert want["message"] in err.message
    assert name in str(err) and want["key"] in str(err)
    assert err.exit_code == 2


def test_non_utf8_bytes(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes('[[scenario]]\nname = "caf\u00e9"\n'.encode("latin-1"))
    err = _error(path)
    _assert_one_line(err)
    assert "latin1.toml" in str(err)
    assert "not UTF-8" in err.message and "0xe9" in err.message and "line 2" in err.message


def test_missing_file(tmp_path):
    err = _error(tmp_path / "absent.toml")
    assert "absent.toml" in str(err) and "no such file" in err.message


def test_syntax_error_reports_line_and_column():
    err = _error(BAD_DIR / "syntax_error.toml")
    assert "TOML syntax error" in err.message and "column" in err.message


@pytest.mark.parametrize(
    "text, key, suggestion",
    [
        ('backend = "eagre"', "scenario[0].backend", "did you mean 'eager'?"),
        ('backend = "Full"', "scenario[0].backend", "did you mean 'full'?"),
        ("hazard = 'raw'\nhazards = 1", "scenario[0].hazards", "did you mean 'hazard'?"),
        ('model = "hybird"', "scenario[0].model", "did you mean 'hybrid'?"),
    ],
)
def test_did_you_mean(text, key, suggestion):
    base = {
        "name": '"s"',
        "model": '"hybrid"',
        "batch": "[{ prefix = 1, new = 1 }]",
        "backend": '"full"',
        "expect": '"race"',
    }
    overridden = {line.split(" = ")[0] for line in text.splitlines()}
    lines = [f"{k} = {v}" for k, v in base.items() if k not in overridden]
    document = "[models.hybrid]\n\n[[scenario]]\n" + "\n".join(lines) + "\n" + text + "\n"
    with pytest.raises(InputError) as info:
        parse_text(document, "inline.toml")
    assert info.value.key == key
    assert info.value.message.endswith(f"({suggestion})")


def test_unknown_key_lists_valid_keys():
    err = _error(BAD_DIR / "unknown_scenario_key.toml")
    assert "valid keys: name, model, batch, backend" in err.message


def test_unknown_model_lists_defined_models():
    text = '[[scenario]]\nname = "s"\nmodel = "x"\nbatch = [{ prefix = 1, new = 1 }]\n'
    with pytest.raises(InputError, match=r"defined models: none \(add a \[models.NAME\] table\)"):
        parse_text(text, "inline.toml")


# ---------------------------------------------------------------- good files


def test_round_trip_of_inline_text(tmp_path):
    path = tmp_path / "good.toml"
    path.write_text(GOOD, encoding="utf-8")
    first, second = load_file(path)

    tiny = ModelShape(
        layers="AM", hidden=128, heads=2, kv_heads=1, head_dim=32,
        dtype=DType.FP32, kv_slots=64, mamba_slots=3,
    )
    assert first == Scenario(
        name="tiny.full_1",
        model=tiny,
        batch=(Request(20, 4), Request(8, 1)),
        backend=Backend.FULL,
        fence="final_event",
        expect=Expect.CLEAN,
        accessor="none",
        fault=Fault(FaultKind.DELAY, 12.5, DelayWhere.FIRST),
        replays=3,
        seed=7,
        poison=-1.0,
        tolerance=Tolerance(rtol=1e-3, atol=0.0),
        source=str(path),
    )
    assert isinstance(first.poison, float)

    # Defaults fill what the scenario leaves out; dataclass defaults the rest.
    assert second.model == ModelShape(layers="MMA", state=8)
    assert (second.replays, second.seed) == (50, 7)
    assert (second.fence, second.accessor, second.fault) == ("none", "per_layer", Fault())
    assert math.isnan(second.poison)
    assert second.tolerance.exact


def test_kv_fit_counts_whole_pages():
    # 20+4 and 8+1 tokens take 2 and 1 pages of 16, plus the padding page:
    # 64 slots fit, 48 do not.
    assert len(parse_text(GOOD, "fits.toml")) == 2
    with pytest.raises(InputError, match="needs 64 KV slots"):
        parse_text(GOOD.replace("kv_slots = 64", "kv_slots = 48"), "tight.toml")


def test_pool_fit_only_checked_for_layers_the_model_has():
    # An attention-only model ignores mamba_slots; a Mamba-only one kv_slots.
    attention = GOOD.replace('layers = "AM"', 'layers = "AA"')
    attention = attention.replace("mamba_slots = 3", "mamba_slots = 1")
    assert len(parse_text(attention, "a.toml")) == 2
    mamba = GOOD.replace('layers = "AM"', 'layers = "MM"').replace("kv_slots = 64", "kv_slots = 1")
    assert len(parse_text(mamba, "m.toml")) == 2


def test_duplicate_names_across_files(tmp_path):
    first = tmp_path / "first.toml"
    second = tmp_path / "second.toml"
    first.write_text(GOOD, encoding="utf-8")
    second.write_text(GOOD.replace('"tiny.full_1"', '"other"'), encoding="utf-8")
    with pytest.raises(InputError) as info:
        load_files([first, second])
    err = info.value
    _assert_one_line(err)
    assert err.source == str(second)
    assert err.key == "scenario[1].name"
    assert "duplicate name 'inline-eager'" in err.message and str(first) in err.message


def test_distinct_files_load_together(tmp_path):
    first = tmp_path / "first.toml"
    second = tmp_path / "second.toml"
    first.write_text(GOOD, encoding="utf-8")
    second.write_text(GOOD.replace('name = "', 'name = "b-'), encoding="utf-8")
    names = [s.name for s in load_files([first, second])]
    assert names == ["tiny.full_1", "inline-eager", "b-tiny.full_1", "b-inline-eager"]


def test_validator_tables_cover_the_records():
    # A field added to ModelShape or Scenario must get a parser here too.
    assert set(_MODEL_FIELDS) == {f.name for f in dataclasses.fields(ModelShape)}
    # fault_ranks is the fault's own `ranks` key (harness.input.tp_keys), read with the fault.
    scenario_fields = {f.name for f in dataclasses.fields(Scenario)} - {"source", "fault_ranks"}
    assert set(_SCENARIO_FIELDS) == scenario_fields


def test_a_directory_is_one_line_that_suggests_its_toml_files(tmp_path):
    err = _error(tmp_path)
    _assert_one_line(err)
    assert err.source == str(tmp_path)
    assert err.message == f"is a directory, not a scenario file; give its files: {tmp_path / '*.toml'}"


HUGE_PREFIX = GOOD.replace("kv_slots = 64", "kv_slots = 0").replace(
    "batch = [{ prefix = 20, new = 4 }, { prefix = 8, new = 1 }]",
    "batch = [{ prefix = 20, new = 4 }, { prefix = 900000000, new = 1 }]")


def test_a_batch_too_large_for_the_device_is_the_batchs_error():
    with pytest.raises(InputError) as info:
        parse_text(HUGE_PREFIX, "huge.toml")
    err = info.value
    _assert_one_line(err)
    assert err.key == "scenario[0].batch"
    assert "exceeds the 64.0 GiB limit" in err.message and "shrink the batch" in err.message


def test_a_pool_the_model_sizes_itself_is_the_models_error():
    # The same pool, sized by the model's own kv_slots: the batch is not what to change.
    text = GOOD.replace("kv_slots = 64", "kv_slots = 900000064")
    with pytest.raises(InputError) as info:
        parse_text(text, "huge.toml")
    assert info.value.key == "scenario[0].model" and "shrink the model" in info.value.message


# ---------------------------------------------------------------- the natural set


# The serving shapes with no injected fault but contention; beside them, the write-back fork of
# sgl-project/sglang#38300 under pressure (tests/run/test_natural.py).
NATURAL = [s for s in load_file(default_files()[2]) if s.hazard is Hazard.RAW]
CORRECT_FENCES = ("final_event", "layerwise_graph")


def test_the_natural_set_is_for_gpus_at_serving_shapes():
    assert NATURAL and all(s.devices == ("cuda",) and not s.runs_on("sim") for s in NATURAL)
    assert all(s.backend is Backend.FULL for s in NATURAL)
    prefixes = {r.prefix for s in NATURAL for r in s.batch}
    cached = {sum(r.prefix for r in s.batch) for s in NATURAL}
    assert min(prefixes) == 2048 and max(cached) == 32768
    assert {s.model.num_layers for s in NATURAL} == {8, 16, 32}
    assert {s.model.hidden for s in NATURAL} == {1024, 2048, 4096}
    assert {"attention", "hybrid"} == {s.model.kind for s in NATURAL}
    assert any(s.model.kv_heads == s.model.heads for s in NATURAL)  # MHA
    assert any(s.model.kv_heads < s.model.heads for s in NATURAL)  # GQA
    assert any(len(s.batch) >= 4 for s in NATURAL)  # batches of several requests
    assert {s.fault.kind for s in NATURAL} == {FaultKind.NONE, FaultKind.PRESSURE}


def test_the_natural_set_expects_what_is_honest():
    for s in NATURAL:
        if s.fence in CORRECT_FENCES:
            assert s.expect is Expect.CLEAN, s.name  # every correct fence, quiet or under pressure
        else:
            assert s.fence == "none" and s.expect is Expect.RACE, s.name
    # The data is demanded wherever it showed on an H200; not at 2,048 tokens, where the pace (and
    # at the idle pace, contention) decides whether the copies win (0 of 300 stale idle and quiet).
    no_data = {s.name for s in NATURAL if s.expect is Expect.RACE and s.evidence is None}
    assert no_data == {"natural-mha8-2k-full-none", "natural-mha8-2k-idle-full-none",
                       "natural-mha8-2k-idle-pressure-full-none"}


def test_the_natural_set_pairs_every_fence_with_its_unfenced_twin_and_quiet_with_pressure():
    from harness.records.plain import as_plain
    from harness.report.pairs import pairs

    entries = [{"name": s.name, "definition": as_plain(s), "error": None, "stale_replays": 0, "replays": 1}
               for s in NATURAL]
    found = pairs(entries)
    fenced = {p["b"] for p in found if p["kind"] == "fence"}
    assert fenced == {s.name for s in NATURAL if s.fence != "none"}  # every fenced scenario has its twin
    pressured = {(p["a"], p["b"]) for p in found if p["kind"] == "pressure"}
    assert ("natural-mha8-2k-full-none", "natural-mha8-2k-pressure-full-none") in pressured
    assert ("natural-mha8-2k-full-final_event", "natural-mha8-2k-pressure-full-final_event") in pressured
    assert ("natural-hybrid8-22k-full-none", "natural-hybrid8-22k-pressure-full-none") in pressured
