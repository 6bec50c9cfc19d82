"""Load scenario files (TOML) into `Scenario` records, rejecting anything odd.

A file holds an optional [defaults] table (merged key by key into every
scenario), optional named model shapes under [models.NAME], and one or more
[[scenario]] tables; scenarios/default.toml is the worked example.

Every problem raises `InputError(source, key, message)` with a one-line message
that says what is wrong and what would be valid. Keys are dotted paths into the
file as written:

    scenario[2].backend        the third [[scenario]] table (0-based: its name
                               may itself be the thing that is missing or bad)
    scenario[0].model.heads    a field of an inline model table
    scenario[1].batch[0].new   a request of a batch
    models.hybrid.dtype        a field of a named model
    defaults.replays           a value that came from [defaults]

Problems with the file as a whole (unreadable, not UTF-8, not TOML) have an
empty key.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

from harness.faults.registry import FAULTS, fault_keys, fault_strategy, register_fault
from harness.faults.strategy import FaultStrategy
from harness.input import tp_keys
from harness.input.plugins import Kind, import_spec, is_plugin, resolve
from harness.records.errors import InputError
from harness.records.releases import ReleaseExpectations
from harness.records.scenario import (
    LAYER_KINDS,
    Backend,
    DType,
    Evidence,
    Expect,
    Fault,
    FaultKind,
    Hazard,
    ModelShape,
    Pace,
    Request,
    Scenario,
    Tolerance,
    kv_slots_needed,
)
from harness.records.values import Invalid as _Invalid
from harness.records.values import Parser
from harness.records.values import describe_value as _describe
from harness.records.values import did_you_mean as _did_you_mean
from harness.records.values import enum as _enum
from harness.records.values import integer as _integer
from harness.records.values import number as _number
from harness.records.values import one_of as _one_of
from harness.records.values import string as _string

# The scenario sets that ship with the package (package data; in a checkout, `harness/scenarios` is a
# link to the top-level `scenarios/`), so an installed wheel runs the same sets as the checkout.
SCENARIO_DIR = Path(__file__).resolve().parents[1] / "scenarios"

MAX_LAYERS = 256
MAX_REPLAYS = 1_000_000
MAX_QUERY_WIDTH = 16384  # heads * head_dim; the same cap as hidden
# Far past what a race test needs: a size over this is a typo, not a test.
DEVICE_BYTES_LIMIT = 64 * 2**30
ELEM_SIZE = {DType.BF16: 2, DType.FP16: 2, DType.FP32: 4}
MAMBA_STATE_ELEM_SIZE = 4  # Mamba state is estimated at fp32 width whatever the dtype
_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")

# ---------------------------------------------------------------- public API


def default_files(sub: str = "", cwd: Path | None = None) -> list[Path]:
    """The scenario files a command runs when given none, in a stable order: `scenarios/<sub>/*.toml`
    of the working directory when it has any (a project's own), else the bundled set's."""
    own = sorted((Path(cwd or Path.cwd()) / "scenarios" / sub).glob("*.toml"))
    return own or bundled_files(sub)


def bundled_files(sub: str = "") -> list[Path]:
    """The bundled set's files (`scenarios/<sub>/*.toml` of the package), whatever the working directory:
    for what names its scenarios (the studies, the fence check)."""
    return sorted((SCENARIO_DIR / sub).glob("*.toml"))


def default_mutant_files(cwd: Path | None = None) -> list[Path]:
    """The kill matrix's files when given none: `scenarios/mutants/*.toml`, as `default_files` finds them."""
    return default_files("mutants", cwd)


def load_files(paths: Iterable[str | Path]) -> list[Scenario]:
    """Load several files; scenario names must be unique across all of them."""
    scenarios: list[Scenario] = []
    first_seen: dict[str, tuple[str, int]] = {}
    for path in paths:
        for index, scenario in enumerate(load_file(path)):
            if scenario.name in first_seen:
                other_source, other_index = first_seen[scenario.name]
                raise InputError(
                    scenario.source,
                    f"scenario[{index}].name",
                    f"duplicate name {scenario.name!r}; already used by "
                    f"scenario[{other_index}] in {other_source}",
                )
            first_seen[scenario.name] = (scenario.source, index)
            scenarios.append(scenario)
    return scenarios


def load_file(path: str | Path) -> list[Scenario]:
    source = str(path)
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise InputError(source, "", "no such file") from None
    except IsADirectoryError:
        glob = str(Path(path) / "*.toml")
        raise InputError(source, "", f"is a directory, not a scenario file; give its files: {glob}") from None
    except OSError as e:
        raise InputError(source, "", f"cannot read the file: {e.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise InputError(
            source,
            "",
            f"not UTF-8 text: byte 0x{data[e.start]:02x} on line {line} is not valid "
            "UTF-8; save the file as UTF-8",
        ) from None
    return parse_text(text, source)


def parse_text(text: str, source: str) -> list[Scenario]:
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        # tomllib's message already ends with "(at line L, column C)".
        detail = " ".join(str(e).splitlines())
        raise InputError(source, "", f"TOML syntax error: {detail}") from None
    try:
        return _parse_document(document, source)
    except (_Invalid, tp_keys.KeyProblem) as e:
        raise InputError(source, e.key, e.message) from None


# ---------------------------------------------------------------- value parsers
# Each takes (value, key) and returns the converted value or raises _Invalid; the plain ones
# (integers, numbers, strings, names) are `harness.records.values`'s, shared with the faults' keys.


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _table(value: Any, key: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Invalid(key, f"expected a table, got {_describe(value)}")
    return value


def _check_keys(table: dict[str, Any], valid: Iterable[str], prefix: str) -> None:
    valid = list(valid)
    for key in table:
        if key not in valid:
            raise _Invalid(
                _join(prefix, key),
                f"unknown key {key!r}; valid keys: {', '.join(valid)}"
                f"{_did_you_mean(key, valid)}",
            )


def _require(table: dict[str, Any], key: str, prefix: str, hint: str) -> Any:
    if key not in table:
        raise _Invalid(_join(prefix, key), f"missing required key {key!r}; {hint}")
    return table[key]


# ---------------------------------------------------------------- model shapes


def _layers(value: Any, key: str) -> str:
    kinds = ", ".join(f"{letter} ({kind})" for letter, kind in LAYER_KINDS.items())
    _string(value, key, "a string of layer letters")
    if not value:
        raise _Invalid(key, f"must not be empty; one letter a layer: {kinds}")
    if len(value) > MAX_LAYERS:
        raise _Invalid(key, f"at most {MAX_LAYERS} layers, got {len(value)}")
    for position, letter in enumerate(value):
        if letter not in LAYER_KINDS:
            raise _Invalid(
                key,
                f"bad layer letter {letter!r} at position {position} of {value!r}; "
                f"valid: {kinds}",
            )
    return value


# One parser per ModelShape field, so that the checks read as a table.
_MODEL_FIELDS: dict[str, Parser] = {
    "layers": _layers,
    "hidden": _integer(1, 16384),
    "heads": _integer(1),
    "kv_heads": _integer(1),
    "head_dim": _integer(1, 512),
    "state": _integer(1, 1024),
    "conv": _integer(2, 16),
    "expand": _integer(1),
    "page_size": _integer(1),
    "dtype": _enum(DType),
    "kv_slots": _integer(0),  # 0 = sized from the batch
    "mamba_slots": _integer(0),  # 0 = sized from the batch
    "indexer": _integer(0, 64),  # 0 = no sparse-attention index
}


def _model_table(value: Any, key: str) -> ModelShape:
    table = _table(value, key)
    _check_keys(table, _MODEL_FIELDS, key)
    shape = ModelShape(**{k: _MODEL_FIELDS[k](v, f"{key}.{k}") for k, v in table.items()})
    _check_model(shape, key)
    return shape


def _check_model(shape: ModelShape, key: str) -> None:
    """Checks that tie fields together; fields left out count at their defaults."""
    if shape.heads % shape.kv_heads:
        raise _Invalid(
            f"{key}.kv_heads",
            f"heads ({shape.heads}) must be a multiple of kv_heads ({shape.kv_heads})",
        )
    if shape.heads * shape.head_dim > MAX_QUERY_WIDTH:
        raise _Invalid(
            f"{key}.heads",
            f"heads * head_dim = {shape.heads * shape.head_dim} exceeds {MAX_QUERY_WIDTH}",
        )
    if shape.indexer and not shape.attention_layers:
        raise _Invalid(f"{key}.indexer", "the sparse-attention index sits beside attention layers; the model has none "
                       "(an A in layers)")
    if shape.indexer and shape.page_size % shape.indexer:
        raise _Invalid(f"{key}.indexer", f"page_size ({shape.page_size}) must be a multiple of indexer "
                       f"({shape.indexer}): a page holds whole groups of compressed slots")
    # The KV pool is allocated in whole pages; a Mamba-only model has none.
    if shape.attention_layers and shape.kv_slots % shape.page_size:
        raise _Invalid(
            f"{key}.kv_slots",
            f"kv_slots ({shape.kv_slots}) must be a multiple of page_size "
            f"({shape.page_size}); page size does not divide the slots",
        )


def _model_ref(value: Any, key: str, models: dict[str, ModelShape]) -> ModelShape:
    if isinstance(value, dict):
        return _model_table(value, key)
    _string(value, key, "a model name from [models.*] or an inline table of model fields")
    if value not in models:
        defined = ", ".join(models) if models else "none (add a [models.NAME] table)"
        raise _Invalid(
            key,
            f"unknown model {value!r}; defined models: {defined}{_did_you_mean(value, models)}",
        )
    return models[value]


# ---------------------------------------------------------------- scenario fields


def _name(value: Any, key: str) -> str:
    _string(value, key, "a string")
    if not _NAME_RE.fullmatch(value):
        raise _Invalid(key, f"names use only letters, digits, '_', '.' and '-'; got {value!r}")
    return value


_REQUEST_FIELDS: dict[str, Parser] = {"prefix": _integer(1), "new": _integer(1)}


def _batch(value: Any, key: str) -> tuple[Request, ...]:
    if not isinstance(value, list):
        raise _Invalid(
            key, f"expected an array of {{ prefix, new }} tables, got {_describe(value)}"
        )
    if not value:
        raise _Invalid(key, "empty batch; give at least one { prefix = N, new = N } request")
    return tuple(_request(item, f"{key}[{i}]") for i, item in enumerate(value))


def _request(value: Any, key: str) -> Request:
    table = _table(value, key)
    _check_keys(table, _REQUEST_FIELDS, key)
    fields = {
        name: parse(_require(table, name, key, "an integer >= 1"), f"{key}.{name}")
        for name, parse in _REQUEST_FIELDS.items()
    }
    return Request(**fields)


def _fault_kind(value: Any, key: str) -> FaultStrategy:
    if isinstance(value, str) and is_plugin(value):
        return _fault_plugin(value, key)
    return FAULTS[_one_of(value, key, list(FAULTS))]


def _fault_plugin(spec: str, key: str) -> FaultStrategy:
    """A project's own fault named by path (`kind = "package.module:Class"`): its module imported,
    the class registered under its own `name` (the record, the reports and `list` use that name)."""
    try:
        cls = import_spec(spec, "", key)
    except InputError as e:
        raise _Invalid(key, e.message) from None
    if not (isinstance(cls, type) and issubclass(cls, FaultStrategy)):
        raise _Invalid(key, f"{spec!r} is not a fault: a fault is a FaultStrategy subclass (harness.api)")
    name = str(getattr(cls, "name", "") or "")
    if not isinstance(FAULTS.get(name), cls):
        try:
            register_fault(cls)
        except ValueError as e:
            raise _Invalid(key, f"{spec!r}: {e}") from None
    return FAULTS[name]


def _fault(value: Any, key: str) -> Fault:
    """A fault table: its kind's strategy (`harness.faults.registry`) says which keys it takes, checks
    each, and builds the record."""
    table = _table(value, key)
    strategy = _fault_kind(table["kind"], f"{key}.kind") if "kind" in table else fault_strategy(FaultKind.NONE)
    # After the kind: a fault named by path is registered, and so are its keys, once it is resolved.
    _check_keys(table, ("kind", *fault_keys()), key)
    kind = str(strategy.name)
    own = {k.name: k for k in strategy.keys}
    for extra in table:
        if extra != "kind" and extra not in own:
            users = [name for name, s in FAULTS.items() if extra in {k.name for k in s.keys}]
            raise _Invalid(
                f"{key}.{extra}",
                f"{extra!r} does not apply to kind = {kind!r}; it is for kind "
                f"{' / '.join(repr(u) for u in users)}",
            )
    for k in strategy.keys:
        if k.required:
            _require(table, k.name, key, f"kind = {kind!r} needs {k.name}: {k.hint}")
    values = {name: own[name].parse(v, f"{key}.{name}") for name, v in table.items() if name != "kind"}
    return strategy.build(values, key)


def _engine(value: Any, key: str) -> str:
    from harness.engines import ENGINES, load_engine

    _string(value, key, f"an engine name, one of: {', '.join(ENGINES)}")
    try:
        load_engine(value)  # known, importable, and with every name the adapter uses
    except InputError as e:
        raise _Invalid(key, e.message) from None
    return value


def _connector(value: Any, key: str) -> str:
    from harness.engines.vllm import WRITEBACK_CONNECTORS

    return _one_of(value, key, list(WRITEBACK_CONNECTORS), "connector")


def _release_expectations(value: Any, key: str) -> ReleaseExpectations:
    table = _table(value, key)
    for spec, v in table.items():
        _string(v, f"{key}.{spec}", f"one of: {', '.join(Expect.names())}")
    try:
        return ReleaseExpectations.parse(table)
    except ValueError as e:
        raise _Invalid(key, str(e)) from None


def _transfer(value: Any, key: str) -> str:
    from harness.protocol.writeback import TRANSFERS

    return _one_of(value, key, list(TRANSFERS), "transfer path")


def _plugin(kind: Kind) -> Parser:
    def parse(value: Any, key: str) -> str:
        _string(value, key, f"a {kind.value} name or 'package.module:callable'")
        try:
            resolve(kind, value, key=key)
        except InputError as e:
            raise _Invalid(key, e.message) from None
        return value

    return parse


def _poison(value: Any, key: str) -> float:
    """NaN (the default: any read of poisoned memory shows) or a finite number."""
    wanted = "'nan' or a finite number"
    if isinstance(value, str):
        if value.lower() != "nan":
            raise _Invalid(key, f"expected {wanted}, got {_describe(value)}")
        return float("nan")
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise _Invalid(key, f"expected {wanted}, got {_describe(value)}")
    if math.isinf(value):  # TOML's own `nan` literal is fine, infinities are not
        raise _Invalid(key, f"expected {wanted}, got {value}")
    return float(value)


def _tolerance(value: Any, key: str) -> Tolerance:
    table = _table(value, key)
    _check_keys(table, ("rtol", "atol"), key)
    return Tolerance(**{k: _number(v, f"{key}.{k}") for k, v in table.items()})


DEVICE_KINDS = ("cuda", "sim")  # what `devices` may name: the devices, not "auto"


def _devices(value: Any, key: str) -> tuple[str, ...]:
    wanted = f"an array of device kinds, from: {', '.join(DEVICE_KINDS)}"
    if not isinstance(value, list):
        raise _Invalid(key, f"expected {wanted}, like [\"cuda\"], got {_describe(value)}")
    if not value:
        raise _Invalid(key, f"an empty array runs nowhere; give {wanted}, or leave the key out to run on every one")
    for i, item in enumerate(value):
        _string(item, f"{key}[{i}]", f"a device kind, one of: {', '.join(DEVICE_KINDS)}")
        if item not in DEVICE_KINDS:
            raise _Invalid(f"{key}[{i}]", f"unknown device kind {item!r}; valid: {', '.join(DEVICE_KINDS)}"
                                          f"{_did_you_mean(item, DEVICE_KINDS)}")
    if len(set(value)) != len(value):
        raise _Invalid(key, "the same device kind appears twice")
    return tuple(value)


# Scenario fields in file order; "model" needs the file's named models, so the
# parser for it is filled in per file (see _scenario_fields): until then it is no Parser.
_SCENARIO_FIELDS: dict[str, Callable[..., Any]] = {
    "name": _name,
    "model": _model_ref,
    "batch": _batch,
    "backend": _enum(Backend),
    "fence": _plugin(Kind.FENCE),
    "accessor": _plugin(Kind.ACCESSOR),
    "schedule": _plugin(Kind.SCHEDULE),
    "hazard": _enum(Hazard),
    "pace": _enum(Pace),
    "engine": lambda value, key: _engine(value, key),
    "transfer": _transfer,
    "connector": lambda value, key: _connector(value, key),
    "fault": _fault,
    "expect": _enum(Expect),
    "expect_by_release": _release_expectations,
    "evidence": _enum(Evidence),
    "replays": _integer(1, MAX_REPLAYS),
    "seed": _integer(0),
    "poison": _poison,
    "tolerance": _tolerance,
    "devices": _devices,
    "tp": tp_keys.parse_tp,
    "fence_ranks": tp_keys.parse_ranks,
}

_REQUIRED_HINTS = {
    "name": "a unique name of letters, digits, '_', '.' and '-'",
    "model": "a name from [models.*] or an inline table of model fields",
    "batch": "an array like [{ prefix = 256, new = 32 }]",
    "backend": f"valid: {', '.join(Backend.names())}",
    "expect": f"valid: {', '.join(Expect.names())}",
}


def _scenario_fields(models: dict[str, ModelShape]) -> dict[str, Parser]:
    return {**_SCENARIO_FIELDS, "model": lambda value, key: _model_ref(value, key, models)}


# ---------------------------------------------------------------- the document


def _parse_document(document: dict[str, Any], source: str) -> list[Scenario]:
    _check_keys(document, ("defaults", "models", "scenario"), "")
    models = {
        name: _model_table(table, f"models.{name}")
        for name, table in _table(document.get("models", {}), "models").items()
    }
    fields = _scenario_fields(models)
    defaults = _defaults(_table(document.get("defaults", {}), "defaults"), fields)
    tables = document.get("scenario", [])
    if not isinstance(tables, list):
        raise _Invalid("scenario", f"expected [[scenario]] tables, got {_describe(tables)}")
    if not tables:
        raise _Invalid("scenario", "no [[scenario]] tables; a file needs at least one")
    scenarios = [
        _scenario(table, f"scenario[{i}]", defaults, fields, source)
        for i, table in enumerate(tables)
    ]
    _check_unique_names(scenarios)
    return scenarios


def _defaults(table: dict[str, Any], fields: dict[str, Parser]) -> dict[str, Any]:
    """Parse [defaults] once, so a bad default is reported at defaults.KEY."""
    if "name" in table:
        raise _Invalid(
            "defaults.name", "name cannot have a default; each [[scenario]] names itself"
        )
    table, fault_ranks = tp_keys.split_fault_ranks(table, "defaults")
    _check_keys(table, (k for k in fields if k != "name"), "defaults")
    parsed = {k: fields[k](v, f"defaults.{k}") for k, v in table.items()}
    if fault_ranks is not tp_keys.NOT_GIVEN:
        parsed["fault_ranks"] = fault_ranks
    return parsed


def _scenario(
    value: Any,
    prefix: str,
    defaults: dict[str, Any],
    fields: dict[str, Parser],
    source: str,
) -> Scenario:
    table, fault_ranks = tp_keys.split_fault_ranks(_table(value, prefix), prefix)
    _check_keys(table, fields, prefix)
    values = {
        **defaults,
        **{k: fields[k](v, f"{prefix}.{k}") for k, v in table.items()},
    }
    if fault_ranks is not tp_keys.NOT_GIVEN:  # a scenario's own fault brings its own ranks
        values["fault_ranks"] = fault_ranks
    by_release = values.get("expect_by_release")
    if by_release is not None:
        values["expect"] = _expect_on_release(by_release, values.get("engine"), prefix)
        values["expect_by_release"] = tuple(by_release.as_dict().items())
    for key, hint in _REQUIRED_HINTS.items():
        _require(values, key, prefix, hint)
    _check_pools(values["model"], values["batch"], prefix)
    from harness.engines import engine_of_fence

    owner = engine_of_fence(values.get("fence", ""))
    if owner is not None and values.get("engine") != owner.name:
        raise _Invalid(
            f"{prefix}.fence",
            f"fence {values['fence']!r} is the engine's own: it needs engine = \"{owner.name}\"",
        )
    if values.get("evidence") is not None and values["expect"] is not Expect.RACE:
        raise _Invalid(f"{prefix}.evidence", "evidence names what a race must show; it needs expect = \"race\"")
    if values.get("hazard") is Hazard.WAW and not values["model"].mamba_layers:
        raise _Invalid(
            f"{prefix}.hazard",
            "hazard 'waw' needs Mamba layers (an M in model.layers): only Mamba state "
            "is written in place by prefill",
        )
    if values.get("hazard") is Hazard.COW and not values["model"].mamba_layers:
        raise _Invalid(f"{prefix}.hazard", "hazard 'mamba_cow' needs Mamba layers (an M in model.layers): "
                       "it copies a Mamba slot")
    if values.get("transfer") is not None:
        from harness.protocol.hazards import HAZARDS

        hazard = values.get("hazard", Hazard.RAW)
        if not HAZARDS[hazard].uses_transfer:
            users = ", ".join(h.value for h in Hazard if HAZARDS[h].uses_transfer)
            raise _Invalid(f"{prefix}.transfer",
                           f"transfer names the write-back / staging path, which hazard {hazard.value!r} does "
                           f"not run; it needs hazard = one of: {users}")
        if HAZARDS[hazard].loads_offloaded and values["transfer"] != "engine" and values.get("engine") is None:
            raise _Invalid(f"{prefix}.transfer",
                           f"transfer {values['transfer']!r} of hazard {hazard.value!r} acts on an engine's offloading "
                           'load; it needs engine = "vllm"')
    if values.get("connector") is not None:
        from harness.protocol.hazards import HAZARDS

        if values.get("engine") != "vllm" or not HAZARDS[values.get("hazard", Hazard.RAW)].backs_up:
            users = ", ".join(h.value for h in Hazard if HAZARDS[h].backs_up)
            raise _Invalid(f"{prefix}.connector", 'connector names the vLLM worker that stores: it needs engine = '
                           f'"vllm" and hazard = one of: {users}')
    tp_keys.check_tp(values, prefix)
    return Scenario(**values, source=source)


def _expect_on_release(by_release: ReleaseExpectations, engine: str | None, prefix: str) -> Expect:
    """The expectation on the installed release of the scenario's engine."""
    from harness.engines import load_engine

    key = f"{prefix}.expect_by_release"
    if engine is None:
        raise _Invalid(key, 'expect_by_release needs an engine (engine = "sglang"): it maps its releases')
    try:
        return by_release.expect_for(load_engine(engine).version)
    except InputError as e:
        raise _Invalid(f"{prefix}.engine", e.message) from None
    except ValueError as e:
        raise _Invalid(key, str(e)) from None


def _check_unique_names(scenarios: list[Scenario]) -> None:
    first_index: dict[str, int] = {}
    for index, scenario in enumerate(scenarios):
        if scenario.name in first_index:
            raise _Invalid(
                f"scenario[{index}].name",
                f"duplicate name {scenario.name!r}; already used by "
                f"scenario[{first_index[scenario.name]}]",
            )
        first_index[scenario.name] = index


# ---------------------------------------------------------------- pool fit and size


def _check_pools(model: ModelShape, batch: tuple[Request, ...], prefix: str) -> None:
    kv_needed = kv_slots_needed(model, batch)
    mamba_needed = len(batch) + 1  # slot 0 is reserved
    if model.attention_layers and model.kv_slots and model.kv_slots < kv_needed:
        raise _Invalid(
            f"{prefix}.batch",
            f"prefix longer than the pool: the batch needs {kv_needed} KV slots "
            f"(prefix + new of each request in pages of {model.page_size}, plus the padding page) but "
            f"kv_slots = {model.kv_slots}; raise kv_slots or set it to 0 to size it "
            "from the batch",
        )
    ragged = [r.prefix for r in batch if model.indexer and r.prefix % model.indexer]
    if ragged:
        raise _Invalid(f"{prefix}.batch", f"a cached prefix of {ragged[0]} tokens is not whole groups of indexer = "
                       f"{model.indexer}: the index is loaded back a compressed slot at a time")
    if model.mamba_layers and model.mamba_slots and model.mamba_slots < mamba_needed:
        raise _Invalid(
            f"{prefix}.batch",
            f"the batch of {len(batch)} requests needs {mamba_needed} Mamba slots "
            f"(slot 0 is reserved) but mamba_slots = {model.mamba_slots}; raise "
            "mamba_slots or set it to 0 to size it from the batch",
        )
    _check_device_bytes(model, batch, model.kv_slots or kv_needed, model.mamba_slots or mamba_needed, prefix)


def _check_device_bytes(
    model: ModelShape, batch: tuple[Request, ...], kv_slots: int, mamba_slots: int, prefix: str
) -> None:
    """Refuse shapes no test device holds, before anything tries to allocate them.

    Pools sized from the batch (kv_slots / mamba_slots = 0) are the batch's: when the
    model's own part fits and those push it past the limit, the batch is the key to fix.
    """
    elem = ELEM_SIZE[model.dtype]
    parts = {
        "KV pool": len(model.attention_layers) * 2 * kv_slots * model.kv_heads
        * model.head_dim * elem,
        "Mamba pool": len(model.mamba_layers) * mamba_slots * model.d_inner
        * (model.state + model.conv - 1) * MAMBA_STATE_ELEM_SIZE,
        "weights": model.num_layers * 12 * model.hidden * model.hidden * elem,
    }
    total = sum(parts.values())
    if total <= DEVICE_BYTES_LIMIT:
        return
    from_batch = (parts["KV pool"] if not model.kv_slots else 0) + (parts["Mamba pool"] if not model.mamba_slots else 0)
    detail = ", ".join(f"{name} {_gib(size)}" for name, size in parts.items())
    estimate = f"estimated device memory {_gib(total)} ({detail}) exceeds the {_gib(DEVICE_BYTES_LIMIT)} limit"
    if total - from_batch <= DEVICE_BYTES_LIMIT:
        tokens = sum(r.prefix + r.new for r in batch)
        raise _Invalid(f"{prefix}.batch",
                       f"{estimate}, with the pools sized from the batch's {tokens} tokens; shrink the batch")
    raise _Invalid(f"{prefix}.model", f"{estimate}; shrink the model or the batch")


def _gib(size: int) -> str:
    return f"{size / 2**30:.1f} GiB"
