"""The fault registry: every fault a strategy with its words, its docs and its one line in `list`,
and a fault of a project's own, from one module, taken by the scenario file and listed."""

from __future__ import annotations

import importlib
import json
import re
import sys
from collections.abc import Iterator

import pytest

from harness.devices.sim import SimDevice
from harness.faults.keys import US
from harness.faults.plan import FaultPlan, sweep_points
from harness.faults.registry import BUILT_IN, FAULTS, fault_keys, fault_strategy, register_fault, unregister_fault
from harness.faults.strategy import FaultStrategy
from harness.frontends.cli import main
from harness.frontends.list_commands import describe
from harness.input.scenario_file import parse_text
from harness.records.errors import InputError
from harness.records.scenario import DelayWhere, Fault, FaultKind, Pressure
from harness.run.pipeline import run_scenario
from tests.support.paths import PLUGINS, ROOT

SCENARIOS_MD = (ROOT / "docs" / "scenarios.md").read_text()
# The faults section's table: | `name` | keys | what it does |
FAULTS_TABLE = SCENARIOS_MD.split("## Faults", 1)[1].split("\n## ", 1)[0]

TOML = """
[models.m]
layers = "AM"
hidden = 16
heads = 2
kv_heads = 1
head_dim = 8
state = 4
conv = 3
page_size = 4
dtype = "fp32"

[[scenario]]
name = "own"
model = "m"
batch = [{{ prefix = 7, new = 2 }}]
backend = "full"
expect = "race"
replays = 2
fault = {fault}
"""


def _listed(capsys) -> dict[str, str]:
    assert main(["list", "faults", "--json"]) == 0
    return {i["name"]: i["description"] for i in json.loads(capsys.readouterr().out)}


@pytest.fixture
def stall(monkeypatch) -> Iterator[FaultStrategy]:
    """tests/plugins/stall_fault.py imported: the `stall` fault registered, for this test only."""
    monkeypatch.syspath_prepend(str(PLUGINS))
    importlib.import_module("stall_fault")
    try:
        yield FAULTS["stall"]
    finally:
        unregister_fault("stall")
        sys.modules.pop("stall_fault", None)


@pytest.mark.parametrize("name", list(FAULTS))
def test_every_fault_has_its_words_its_line_and_its_docs(name):
    strategy = FAULTS[name]
    assert isinstance(strategy, FaultStrategy) and str(strategy.name) == name
    assert "describe" in vars(type(strategy)) or name == "none", f"{name} says nothing of its own settings"
    text = Fault(strategy.name).describe()
    assert text.startswith(name) and text == strategy.describe(Fault(strategy.name))
    assert describe(strategy), f"{name}: no docstring for `list` to print"
    assert re.search(rf"^\| `{name}` \|", FAULTS_TABLE, re.M), f"docs/scenarios.md's faults table has no row for {name}"
    for key in strategy.keys:
        assert f"`{key.name}`" in FAULTS_TABLE, f"docs/scenarios.md does not name {name}'s key {key.name}"


def test_the_built_in_faults_are_the_kinds_in_order():
    assert [str(s.name) for s in BUILT_IN] == FaultKind.names() == list(FAULTS)
    assert fault_keys() == ["us", "where", "seed", "chunks", "points", "hold_us",
                            "gemm", "gemm_streams", "copy_mib", "copy", "process"]


def test_what_the_harness_asks_of_each_kind():
    assert [n for n, s in FAULTS.items() if s.gates] == ["gate"]
    assert [n for n, s in FAULTS.items() if s.soaks] == ["gate", "jitter", "chunked"]
    assert [n for n, s in FAULTS.items() if s.sweeps] == ["sweep"]
    assert fault_strategy(Fault(FaultKind.CHUNKED, 5.0, chunks=3)).chunks(Fault(FaultKind.CHUNKED, chunks=3)) == 3
    assert {n: s.chunks(Fault(s.name, chunks=3)) for n, s in FAULTS.items() if n != "chunked"} == dict.fromkeys(
        [n for n in FAULTS if n != "chunked"], 1)
    assert fault_strategy("pressure").pressure(Fault(FaultKind.PRESSURE)) == Pressure()
    assert [n for n, s in FAULTS.items() if s.pressure(Fault(s.name)) is not None] == ["pressure"]
    gate = fault_strategy(FaultKind.GATE)
    assert gate.stand_in(Fault(FaultKind.GATE)).kind == FaultKind.DELAY
    with pytest.raises(LookupError, match="unknown fault kind 'sleep'; registered: none, delay"):
        fault_strategy("sleep")


def test_a_name_is_taken_once():
    class Other(FaultStrategy):
        """Another delay."""

        name = "delay"

    with pytest.raises(ValueError, match="a fault named 'delay' is registered already"):
        register_fault(Other)
    assert type(FAULTS["delay"]).__name__ == "Delay"


def test_a_fault_from_one_module_is_taken_by_the_scenario_file_and_listed(stall, capsys):
    (s,) = parse_text(TOML.format(fault='{ kind = "stall", us = 500 }'), "own.toml")
    assert s.fault == Fault("stall", 500.0)
    assert s.fault.describe() == "stall 500us" and "fault=stall 500us" in s.describe()
    plan = FaultPlan(s.fault)
    assert [plan.pause_us(layer) for layer in range(3)] == [500.0, 0.0, 0.0]
    assert sweep_points(s.fault) == [(500.0, s.fault)]
    assert _listed(capsys)["stall"] == "A spin of `us` before layer 0's first copy only, whatever `where` says."
    # The harness runs it: a spin before layer 0 on the unfenced full graph races.
    r = run_scenario(s, SimDevice(), replays=2)
    assert r.error is None and r.met, r.verdict


def test_a_fault_of_ones_own_has_its_keys_checked_as_the_built_in_ones(stall):
    def error(fault: str) -> InputError:
        with pytest.raises(InputError) as info:
            parse_text(TOML.format(fault=fault), "own.toml")
        assert "\n" not in str(info.value)
        return info.value

    missing = error('{ kind = "stall" }')
    assert (missing.key, missing.source) == ("scenario[0].fault.us", "own.toml")
    assert "kind = 'stall' needs us: microseconds > 0" in missing.message
    other = error('{ kind = "stall", us = 5, where = "first" }')
    assert other.key == "scenario[0].fault.where"
    assert "'where' does not apply to kind = 'stall'; it is for kind 'delay' / 'jitter' / 'sweep'" in other.message
    unknown = error('{ kind = "stal", us = 5 }')
    assert unknown.key == "scenario[0].fault.kind"
    assert ("valid: none, delay, gate, jitter, chunked, sweep, pressure, stall (did you mean 'stall'?)"
            in unknown.message)


def test_an_unregistered_fault_is_gone_from_the_file_and_the_list(capsys):
    class Brief(FaultStrategy):
        """A fault registered for a moment."""

        name = "brief"
        keys = (US,)

    register_fault(Brief())
    try:
        assert "brief" in _listed(capsys)
    finally:
        unregister_fault("brief")
    assert "brief" not in _listed(capsys)
    with pytest.raises(InputError, match="unknown value 'brief'"):
        parse_text(TOML.format(fault='{ kind = "brief" }'), "own.toml")
    assert Fault("brief", 1.0).describe() == "brief"  # no strategy: its name
    assert Fault(FaultKind.DELAY, 5.0, DelayWhere.FIRST).describe() == "delay 5us first"


def test_a_scenario_file_names_a_fault_of_its_own_by_path(monkeypatch):
    # No import beforehand: the file's `kind = "module:Class"` imports and registers it, as a fence
    # plugin's path does, so a project's fault is its one module and the file that uses it.
    monkeypatch.syspath_prepend(str(PLUGINS))
    try:
        (s,) = parse_text(TOML.format(fault='{ kind = "stall_fault:Stall", us = 300 }'), "own.toml")
        assert s.fault == Fault("stall", 300.0) and FAULTS["stall"].describe(s.fault) == "stall 300us"
        r = run_scenario(s, SimDevice(), replays=2)
        assert r.error is None and r.met, r.verdict
    finally:
        unregister_fault("stall")
        sys.modules.pop("stall_fault", None)


@pytest.mark.parametrize(("kind", "says"), [
    ("no_such_module:Stall", "cannot import 'no_such_module'"),
    ("harness.api:Fault", "'harness.api:Fault' is not a fault: a fault is a FaultStrategy subclass"),
    ("harness.api:NoSuchName", "module 'harness.api' has no 'NoSuchName'"),
])
def test_a_fault_path_that_names_no_fault_is_one_line(kind, says):
    with pytest.raises(InputError) as info:
        parse_text(TOML.format(fault=f'{{ kind = "{kind}", us = 5 }}'), "own.toml")
    e = info.value
    assert (e.source, e.key) == ("own.toml", "scenario[0].fault.kind") and says in e.message, e
    assert "\n" not in str(e)
