"""The plugin API (`harness.api`): what it exports, what it promises a plugin, and that examples and
docs reach the harness only through it. Each promise is checked with a plugin that relies on it, on
the simulator."""

from __future__ import annotations

import ast
import json
import re
import textwrap

import pytest

import harness.api as api
from harness.frontends.cli import main
from harness.input.plugins import Kind, resolve
from harness.input.scenario_file import parse_text
from harness.records.errors import ApiChanged, InputError
from harness.records.plugin_api import API_VERSION, CHANGES, REMOVED
from harness.run.pipeline import run_scenario
from tests.support.paths import PLUGINS, ROOT

MODULE = "api_plugins"

# The modules a plugin, an example or a documented snippet may import from the harness.
PUBLIC = {"harness.api", "harness.sanitizer"}


@pytest.fixture
def plugins(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))
    import api_plugins

    return api_plugins


SCENARIO = """
[defaults]
model = {{ layers = "AMAM", hidden = 64, heads = 2, kv_heads = 1, head_dim = 32, state = 4, dtype = "fp32" }}
batch = [{{ prefix = 24, new = 4 }}, {{ prefix = 8, new = 2 }}]
replays = 3
backend = "full"
fault = {{ kind = "gate" }}

[[scenario]]
name = "{name}"
expect = "{expect}"
{extra}
"""


def scenario(name: str, expect: str, **keys: str):
    extra = "\n".join(f'{k} = "{v}"' for k, v in keys.items())
    (s,) = parse_text(SCENARIO.format(name=name, expect=expect, extra=extra), f"{name}.toml")
    return s


def run(name: str, expect: str = "clean", **keys: str):
    from harness.devices.sim import SimDevice

    return run_scenario(scenario(name, expect, **keys), SimDevice())


# ---------------------------------------------------------------- the surface


def test_every_exported_name_exists_and_the_version_is_the_tables():
    assert api.API_VERSION == API_VERSION == max(CHANGES)
    missing = [n for n in api.__all__ if not hasattr(api, n)]
    assert not missing
    assert len(set(api.__all__)) == len(api.__all__)


def test_every_removed_name_names_a_version_and_a_replacement():
    for (owner, name), (version, instead) in REMOVED.items():
        assert version in CHANGES and instead, (owner, name)


# ---------------------------------------------------------------- examples and docs use only it


def _harness_imports(source: str) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "harness"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "harness":
            found.add(node.module)
    return found


def _snippets(text: str) -> list[str]:
    """The Python of a Markdown page's code blocks (python, or unlabelled blocks that parse)."""
    out = []
    for lang, body in re.findall(r"```(\w*)\n(.*?)```", text, flags=re.S):
        if lang not in ("", "python", "py"):
            continue
        try:
            ast.parse(textwrap.dedent(body))
        except SyntaxError:
            continue  # a shell session or a TOML file in a plain block
        out.append(textwrap.dedent(body))
    return out


EXAMPLES = sorted((ROOT / "harness" / "examples").glob("*.py")) + sorted(PLUGINS.glob("*.py"))
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("**/*.md"))]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_and_test_plugins_import_only_the_public_modules(path):
    internal = _harness_imports(path.read_text()) - PUBLIC - {"harness.examples"}
    assert not internal, f"{path.name} imports internal paths: {sorted(internal)} (use harness.api)"


@pytest.mark.parametrize("path", [p for p in PAGES if p.exists()], ids=lambda p: p.name)
def test_documented_snippets_import_only_the_public_modules(path):
    internal = set().union(*(_harness_imports(s) for s in _snippets(path.read_text())), set()) - PUBLIC
    assert not internal, f"{path.name}'s code imports internal paths: {sorted(internal)} (use harness.api)"


def test_the_snippet_check_has_teeth():
    page = "text\n```python\nfrom harness.protocol.fences import FenceContext\n```\n```\n$ make run\n```\n"
    assert set().union(*map(_harness_imports, _snippets(page))) == {"harness.protocol.fences"}


# ---------------------------------------------------------------- what it promises


def test_a_layer_completes_with_its_listeners_on_the_load_stream_whoever_calls_it(plugins):
    plugins.HEARD.clear()
    r = run("completes-from-fence", fence=f"{MODULE}:CompletesFromTheFence")
    assert r.error is None, r.error
    # Every layer of every load op, and the fence's own extra completion from the forward stream.
    assert len(plugins.HEARD) > r.tally.replays * 4 and all(plugins.HEARD)


def test_a_removed_name_is_one_line_naming_the_replacement(plugins):
    r = run("old-api", fence=f"{MODULE}:old_api_fence")
    assert r.error is not None and "\n" not in r.error
    assert "LoadOp.wait was removed in plugin API 2" in r.error
    assert "ctx.forward.wait_event(ctx.op.load_events[layer])" in r.error


def test_a_removed_name_still_reads_as_missing_to_hasattr():
    from harness.devices.sim import SimDevice
    from harness.run.testbed import Testbed

    tb = Testbed(scenario("s", "clean"), SimDevice())
    op = tb.start_load(_plan(tb))
    assert not hasattr(op, "events") and not hasattr(op, "wait")
    with pytest.raises(ApiChanged, match=r"LoadOp.events was removed .*op.complete\(layer\)"):
        op.events  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'nonsense'") as e:
        op.nonsense  # noqa: B018
    assert not isinstance(e.value, ApiChanged)


def _plan(tb):
    from harness.faults.plan import FaultPlan

    return FaultPlan(tb.scenario.fault)


def test_schedule_and_accessor_classes_get_one_instance_per_scenario(plugins, tmp_path):
    made = plugins.CountingSchedule.made
    for name in ("one", "two"):
        r = run(name, schedule=f"{MODULE}:CountingSchedule", accessor=f"{MODULE}:CountingAccessor",
                fence="final_event")
        assert r.error is None and r.verdict.met, r.error
    assert plugins.CountingSchedule.made == made + 2


def test_a_class_plugins_attributes_read_through_its_guard(plugins):
    # What the testbed reads of a schedule (its `records_in_graph`) reads so too.
    made = resolve(Kind.SCHEDULE, f"{MODULE}:CountingSchedule")()
    assert made.ops == 0 and made.made == plugins.CountingSchedule.made
    assert getattr(made, "records_in_graph", False) is False


def test_a_class_without_call_is_refused_when_loaded(tmp_path, monkeypatch):
    (tmp_path / "no_call.py").write_text("class Schedule:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(InputError, match="has no __call__"):
        resolve(Kind.SCHEDULE, "no_call:Schedule")


def test_the_gate_holds_once_however_often_a_schedule_asks(plugins):
    from harness.devices.sim import SimDevice
    from harness.records.trace import Hold
    from harness.run.testbed import Testbed

    tb = Testbed(scenario("holds", "clean", schedule=f"{MODULE}:holds_twice"), SimDevice())
    gate = tb.dev.gate(5.0)
    with tb.dev.tracing() as t, tb.dev.stream(tb.forward):
        tb.start_load(_plan(tb), gate=gate)
    gate.release()
    assert sum(isinstance(op, Hold) for op in t.ops) == 1


def test_a_runner_holds_the_waits_added_before_it_and_none_after(plugins):
    early = run("before", "race", fence=f"{MODULE}:RunnerBeforeWaits")
    late = run("after", "clean", fence=f"{MODULE}:RunnerAfterWaits")
    assert early.error is None and late.error is None, (early.error, late.error)
    assert early.tally.stale_replays == early.tally.replays  # captured first: no wait in its graph
    assert late.tally.stale_replays == 0 and not late.findings


def test_a_plugin_written_for_another_api_version_is_refused_with_what_changed(tmp_path, monkeypatch):
    (tmp_path / "v1_plugin.py").write_text("HARNESS_API = 1\n\ndef fence(ctx):\n    pass\n")
    (tmp_path / "odd_plugin.py").write_text("HARNESS_API = 'two'\n\ndef fence(ctx):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(InputError) as e:
        resolve(Kind.FENCE, "v1_plugin:fence", "s.toml", "scenario[0].fence")
    assert "written for plugin API 1; this harness speaks 2" in e.value.message
    assert "ctx.op is the pending LoadOp" in e.value.message and "\n" not in str(e.value)
    with pytest.raises(InputError, match="names no plugin API version"):
        resolve(Kind.FENCE, "odd_plugin:fence")


def test_an_old_plugin_on_the_command_line_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    (tmp_path / "v1_plugin.py").write_text("HARNESS_API = 1\n\ndef fence(ctx):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO.format(name="s", expect="race", extra='fence = "v1_plugin:fence"'))
    assert main(["run", str(path), "--device", "sim", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "plugin API 1" in err and "s.toml" in err


def test_the_worked_examples_declare_the_current_version():
    from harness.examples import plugins as example

    assert example.HARNESS_API == API_VERSION
    doc = json.dumps(CHANGES)
    assert "LoadOp" in doc
