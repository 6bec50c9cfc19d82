"""The plugin API: built-in names and `package.module:callable` for fences, accessors, schedules."""

from __future__ import annotations

import json
import textwrap

import pytest

from harness.devices.sim import SimDevice
from harness.frontends.cli import main
from harness.input.plugins import Kind, resolve
from harness.input.scenario_file import parse_text
from harness.protocol.fences import FENCES
from harness.records.errors import InputError
from harness.run.pipeline import run_scenario

EXAMPLE = "harness.examples.plugins"

SCENARIOS = f"""
[models.hybrid]
layers = "AMAM"
hidden = 64
heads = 2
kv_heads = 1
head_dim = 32
state = 4
dtype = "fp32"

[defaults]
model = "hybrid"
batch = [{{ prefix = 24, new = 4 }}, {{ prefix = 8, new = 2 }}]
replays = 3
backend = "full"
fault = {{ kind = "gate" }}

[[scenario]]
name = "example-fence"
fence = "{EXAMPLE}:every_layer_fence"
schedule = "{EXAMPLE}:mamba_state_first"
expect = "clean"

[[scenario]]
name = "example-accessor"
backend = "breakable"
accessor = "{EXAMPLE}:wait_for_whole_load"
expect = "clean"

[[scenario]]
name = "example-schedule-unfenced"
schedule = "{EXAMPLE}:mamba_state_first"
expect = "race"
"""


def test_builtin_names_resolve_to_the_registries():
    assert resolve(Kind.FENCE, "final_event") is FENCES["final_event"]
    for kind in Kind:
        assert callable(resolve(kind, {"fence": "none", "accessor": "per_layer",
                                       "schedule": "layerwise"}[kind.value]))


def test_the_worked_example_plugins_load_and_run():
    for s in parse_text(SCENARIOS, "examples.toml"):
        r = run_scenario(s, SimDevice())
        assert r.error is None, r.error
        assert r.observed is s.expect, s.name


def test_unknown_builtin_name_suggests_the_close_one():
    with pytest.raises(InputError) as e:
        resolve(Kind.FENCE, "final_evnt", "f.toml", "scenario[0].fence")
    assert e.value.source == "f.toml" and e.value.key == "scenario[0].fence"
    assert "did you mean 'final_event'?" in e.value.message
    assert "package.module:callable" in e.value.message


@pytest.fixture
def plugin_module(tmp_path, monkeypatch):
    (tmp_path / "my_plugins.py").write_text(textwrap.dedent("""
        def fence(ctx):
            pass

        def two_args(ctx, extra):
            pass

        def schedule(op, *, optional=None):
            pass

        NOT_CALLABLE = 3
    """))
    (tmp_path / "broken_plugin.py").write_text("raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_plugins"


def test_a_users_plugin_loads(plugin_module):
    assert resolve(Kind.FENCE, f"{plugin_module}:fence").__name__ == "fence"
    assert resolve(Kind.SCHEDULE, f"{plugin_module}:schedule").__name__ == "schedule"


@pytest.mark.parametrize(
    "spec, message",
    [
        ("no_such_module_xyz:fence", "cannot import 'no_such_module_xyz'"),
        ("my_plugins:missing", "has no 'missing'"),
        ("my_plugins:NOT_CALLABLE", "is not callable"),
        ("my_plugins:two_args", "but a fence is called as fence(ctx)"),
        ("broken_plugin:fence", "failed: RuntimeError: boom"),
        ("my_plugins:", "bad plugin path"),
        ("my plugins:fence", "bad plugin path"),
    ],
)
def test_bad_plugin_paths_are_one_line_input_errors(plugin_module, spec, message):
    with pytest.raises(InputError) as e:
        resolve(Kind.FENCE, spec, "s.toml", "scenario[0].fence")
    assert message in e.value.message
    assert "\n" not in str(e.value)


def test_accessor_signature_is_checked(plugin_module):
    with pytest.raises(InputError, match="accessor is called as accessor"):
        resolve(Kind.ACCESSOR, f"{plugin_module}:fence")


def test_bad_plugin_in_a_scenario_file_names_the_key(plugin_module):
    text = SCENARIOS.replace(f"{EXAMPLE}:wait_for_whole_load", "my_plugins:two_args")
    with pytest.raises(InputError) as e:
        parse_text(text, "examples.toml")
    assert (e.value.source, e.value.key) == ("examples.toml", "scenario[1].accessor")


def test_fence_on_the_command_line_overrides_every_scenario(tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_text(SCENARIOS)
    out = tmp_path / "out"
    # Fencing the unfenced scenario with the example fence makes it clean: its "race"
    # expectation then fails, which shows the override reached it.
    rc = main(["run", str(path), "--device", "sim", "--out", str(out),
               "--fence", f"{EXAMPLE}:every_layer_fence"])
    assert rc == 1
    doc = json.loads((out / "results.json").read_text())
    assert {s["definition"]["fence"] for s in doc["scenarios"]} == {f"{EXAMPLE}:every_layer_fence"}
    assert {s["name"]: s["observed"] for s in doc["scenarios"]}["example-schedule-unfenced"] == "clean"


def test_bad_fence_on_the_command_line_exits_2(tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_text(SCENARIOS)
    rc = main(["run", str(path), "--device", "sim", "--out", str(tmp_path), "--schedule", "nope:x"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and "--schedule: schedule: cannot import 'nope'" in err


# ---------------------------------------------------------------- plugins that break at run time
BREAKING = """
[defaults]
model = {{ layers = "AM", hidden = 32, heads = 2, kv_heads = 1, head_dim = 16, state = 4, dtype = "fp32" }}
batch = [{{ prefix = 20, new = 4 }}]
replays = 2
backend = "full"
fault = {{ kind = "delay", us = 500 }}

[[scenario]]
name = "broken"
{key} = "{plugin}"
expect = "clean"

[[scenario]]
name = "after"
fence = "final_event"
expect = "clean"
"""


@pytest.mark.parametrize("key, name, message", [
    ("fence", "raising_fence", "(fence) raised ValueError: the fence broke"),
    ("schedule", "raising_schedule", "(schedule) raised KeyError: 'the schedule broke'"),
    ("accessor", "raising_accessor", "(accessor) raised RuntimeError: the accessor broke"),
    ("fence", "RaisingSetupFence", "(fence setup) raised ZeroDivisionError: setup broke"),
    ("fence", "number_fence", "returned int; a fence returns None or a runner"),
])
def test_a_plugin_that_breaks_ends_its_scenario_and_the_run_goes_on(wayward, tmp_path, capsys, key, name, message):
    path = tmp_path / "s.toml"
    path.write_text(BREAKING.format(key=key, plugin=f"{wayward}:{name}"))
    out = tmp_path / "out"
    assert main(["run", str(path), "--device", "sim", "--out", str(out)]) == 1
    broken, after = json.loads((out / "results.json").read_text())["scenarios"]
    assert message in broken["error"] and f"{wayward}:{name}" in broken["error"] and not broken["met"]
    assert after["met"] and after["error"] is None
    printed = capsys.readouterr()
    line = next(ln for ln in printed.out.splitlines() if " broken " in ln)
    assert "error:" in line and message in line  # one line: the scenario, the plugin, the exception
    assert "Traceback" not in printed.out + printed.err


def test_a_class_fence_whose_setup_has_the_wrong_signature_is_refused_when_loaded(wayward):
    with pytest.raises(InputError, match=r"setup.* is called as setup\(s\)"):
        resolve(Kind.FENCE, f"{wayward}:BadSetupFence")
