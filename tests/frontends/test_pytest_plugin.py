"""The pytest plugin, driven through pytester on the CPU simulator.

Each run loads the plugin with `-p harness.frontends.pytest_plugin`, as a GPU runner without
the package installed does; the entry-point route is checked with a stand-in
distribution on the path.
"""

from __future__ import annotations

import json
import os
import signal
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

# scipy.stats too (results.json's intervals and exact tests, imported when first used by an
# in-process run below): numpy refuses to load its C extensions a second time in one process.
import scipy.stats  # noqa: F401

import harness

# matplotlib, imported here and not first by an in-process run below: pytester drops the
# modules a run imported, and a second copy of matplotlib's classes breaks every later plot
# of this process (report tests on the same xdist worker).
import harness.report.plots  # noqa: F401
from harness.frontends.pytest_plugin import settings
from tests.support.paths import DATA

pytest_plugins = ["pytester"]

ROOT = Path(harness.__file__).resolve().parent.parent
PLUGIN = ("-p", "harness.frontends.pytest_plugin")

TINY = (DATA / "tiny_attention.toml").read_text()

# The same race, expected clean: the item must fail and say why.
WRONG = TINY.replace('fence = "none"\nexpect = "race"', 'fence = "none"\nexpect = "clean"').replace(
    "tiny-full-none", "tiny-wrong").replace("tiny-full-final_event", "tiny-fenced")


@pytest.fixture(autouse=True)
def no_settings_from_outside(monkeypatch):
    """Settings in the caller's environment would change what these runs see."""
    for name in ("DEVICE", "REPLAYS", "SCENARIOS", "MUTANTS", "REPORT", "SHARD"):
        monkeypatch.delenv(f"FENCE_HARNESS_{name}", raising=False)


@pytest.fixture
def tiny(pytester: pytest.Pytester) -> Path:
    pytester.makefile(".toml", race=TINY)
    return pytester.path / "race.toml"


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest(*PLUGIN, "-p", "no:cacheprovider", "--harness-device", "sim", *args)


# ---------------------------------------------------------------- items


def test_each_scenario_is_an_item_with_file_and_name_marked_sim(pytester, tiny):
    result = run(pytester, "--harness-scenarios", "race.toml", "--collect-only", "-q")
    result.stdout.fnmatch_lines(["race.toml::tiny-full-none", "race.toml::tiny-full-final_event"])
    assert run(pytester, "--harness-scenarios", "race.toml", "-m", "sim",
               "--collect-only", "-q").ret == 0
    gpu_only = run(pytester, "--harness-scenarios", "race.toml", "-m", "gpu", "--collect-only", "-q")
    gpu_only.stdout.fnmatch_lines(["*2 deselected*"])


def test_scenarios_pass_and_a_missed_expectation_fails_with_its_verdict(pytester, tiny):
    pytester.makefile(".toml", wrong=WRONG)
    result = run(pytester, "--harness-scenarios", "race.toml", "wrong.toml",
                 "--harness-report", "out", "-rf")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines([
        "*tiny-wrong: expected clean, observed race (data, analysis, graph): a race showed in data, analysis and graph",
        "*stale 5/5 replays (100.0%), stale layers 0,1",
        "*findings 4",
        "*- * reads *, but nothing orders it after the H2D copy on load*",
        # The graph check's findings: the node and its kernel, the region, the missing edge.
        "*graph findings 4",
        "*- graph * node * (L0 attention, step L0 attention) reads k[[]L0, slots 16:48], but nothing orders it "
        "after the H2D copy on load that writes k[[]L0, slots 16:48]: no wait node on event * (recorded after "
        "that copy) reaches it, and forward waited on no such event before the replay",
        "*... and 1 more",
        "results: *out*results.json",
        "FAILED wrong.toml::tiny-wrong - tiny-wrong: expected clean, observed race*",
    ])
    doc = json.loads((pytester.path / "out" / "results.json").read_text())
    assert [e["name"] for e in doc["scenarios"]] == [
        "tiny-full-none", "tiny-full-final_event", "tiny-wrong", "tiny-fenced"]
    assert doc["summary"] == {"scenarios": 4, "met": 3, "errors": 0}
    assert {e["worker"] for e in doc["scenarios"]} == {"main"}
    summary = (pytester.path / "out" / "summary.md").read_text()
    assert summary.startswith("❌ **fence-harness: 1 of 4 failed** · ")
    assert "| tiny-wrong ❌ | clean | race (data, analysis, graph) | 100.0% (5/5) |" in summary
    assert (pytester.path / "out" / "report.html").is_file()


def _junit_properties(path):
    """Each JUnit test case's properties, by case name."""
    return {c.get("name"): {p.get("name"): p.get("value") for p in c.iter("property")}
            for c in ET.parse(path).iter("testcase")}


def test_kill_matrix_items_pass_on_the_matrix_terms_and_the_report_gets_the_matrix(pytester, tiny):
    # race.toml as a kill matrix: the unfenced mutant is killed, the fenced variant clean.
    # The same fenced scenario called a mutant survives, and its item fails.
    survived = TINY.replace('name = "tiny-full-final_event"\nbackend = "full"\nfence = "final_event"\n'
                            'expect = "clean"', 'name = "tiny-survivor"\nbackend = "full"\n'
                            'fence = "final_event"\nexpect = "race"').replace("tiny-full-none", "tiny-killed")
    pytester.makefile(".toml", survivor=survived)
    result = run(pytester, "--harness-mutants", "race.toml", "survivor.toml", "--harness-report", "out",
                 "--junitxml", "junit.xml", "-rf")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(["tiny-survivor: expected race, observed clean: no evidence of a race",
                                 "*kill matrix: survived",
                                 "FAILED survivor.toml::tiny-survivor - tiny-survivor: expected race*"])
    doc = json.loads((pytester.path / "out" / "results.json").read_text())
    assert {m["name"]: (m["role"], m["outcome"]) for m in doc["mutants"]["matrix"]} == {
        "tiny-full-none": ("mutant", "killed"), "tiny-full-final_event": ("correct", "clean"),
        "tiny-killed": ("mutant", "killed"), "tiny-survivor": ("mutant", "survived")}
    assert "**Kill matrix**: 2/3 mutants killed, 1/1 correct variants clean" in (
        pytester.path / "out" / "summary.md").read_text()
    cases = _junit_properties(pytester.path / "junit.xml")
    assert cases["tiny-survivor"]["kill_matrix"] == "survived"


def test_scenarios_and_kill_matrix_in_one_run_and_a_name_in_both_is_an_error(pytester, tiny):
    pytester.makefile(".toml", wrong=WRONG)
    result = run(pytester, "--harness-scenarios", "wrong.toml", "--harness-mutants", "race.toml",
                 "--harness-report", "out")
    result.assert_outcomes(passed=3, failed=1)  # tiny-wrong misses its expectation
    doc = json.loads((pytester.path / "out" / "results.json").read_text())
    assert len(doc["scenarios"]) == 4
    assert [m["name"] for m in doc["mutants"]["matrix"]] == ["tiny-full-none", "tiny-full-final_event"]
    clash = run(pytester, "--harness-scenarios", "race.toml", "--harness-mutants", "race.toml")
    assert clash.ret == pytest.ExitCode.USAGE_ERROR
    clash.stderr.fnmatch_lines(["*tiny-full-none*"])


def test_replays_override_and_junit_properties(pytester, tiny):
    result = run(pytester, "--harness-scenarios", "race.toml", "--harness-replays", "3",
                 "--harness-report", "out", "--junitxml", "junit.xml")
    result.assert_outcomes(passed=2)
    cases = _junit_properties(pytester.path / "junit.xml")
    race = cases["tiny-full-none"]
    assert race["expected"] == race["observed"] == "race"
    assert race["stale_rate"] == "1.0000" and race["stale_layers"] == "0,1"
    assert int(race["findings"]) > 0
    assert (race["device"], race["gpu"], race["gpu_uuid"]) == ("sim", "none", "none")
    assert race["torch"] == __import__("torch").__version__
    clean = cases["tiny-full-final_event"]
    assert (clean["observed"], clean["stale_rate"], clean["stale_layers"], clean["findings"]) == (
        "clean", "0.0000", "-", "0")


def test_junit_names_the_graph_findings_and_the_fenced_twin_has_none(pytester, tiny):
    result = run(pytester, "--harness-scenarios", "race.toml", "--harness-replays", "3",
                 "--harness-report", "out", "--junitxml", "junit.xml")
    result.assert_outcomes(passed=2)
    cases = _junit_properties(pytester.path / "junit.xml")
    doc = {s["name"]: s for s in json.loads((pytester.path / "out" / "results.json").read_text())["scenarios"]}
    race = cases["tiny-full-none"]
    sentences = doc["tiny-full-none"]["graph"]["findings"]
    assert race["graph_findings"] == str(len(sentences)) == "4" and race["graph_op_list"] == "matches"
    assert [race[f"graph_finding_{i}"] for i in (1, 2, 3)] == sentences[:3] and "graph_finding_4" not in race
    first = doc["tiny-full-none"]["graph"]["finding_records"][0]
    assert race["graph_finding_1"].startswith(f"graph {first['graph']} node {first['node']} ({first['kernel']}, ")
    assert "reads k[L0, slots 16:48]" in race["graph_finding_1"]
    assert race["graph_finding_1"].endswith(f"no wait node on event {first['event']} (recorded after that copy) "
                                            "reaches it, and forward waited on no such event before the replay")
    clean = cases["tiny-full-final_event"]
    assert (clean["graph_findings"], clean["graph_op_list"]) == ("0", "matches")
    assert not any(name.startswith("graph_finding_") for name in clean)
    doc = json.loads((pytester.path / "out" / "results.json").read_text())
    assert [e["replays"] for e in doc["scenarios"]] == [3, 3]
    suite = {p.get("name"): p.get("value")
             for p in ET.parse(pytester.path / "junit.xml").find(".//testsuite/properties")}
    assert suite["torch"] == __import__("torch").__version__  # for every test of the run


def test_no_scenarios_no_items_and_no_report(pytester):
    pytester.makepyfile("def test_plain(): pass")
    result = run(pytester)
    result.assert_outcomes(passed=1)
    assert not (pytester.path / "reports").exists()
    assert "results: " not in result.stdout.str()


# ---------------------------------------------------------------- settings


def test_markers_options_and_ini_keys_are_registered(pytester):
    markers = pytester.runpytest(*PLUGIN, "--markers").stdout.str()
    assert all(f"@pytest.mark.{m}:" in markers for m in ("gpu", "sim", "slow"))
    helptext = pytester.runpytest(*PLUGIN, "--help").stdout.str()
    assert "fence-harness" in helptext
    for name in ("device", "replays", "scenarios", "mutants", "report", "shard"):
        assert f"--harness-{name}" in helptext and f"harness_{name}" in helptext
        assert f"FENCE_HARNESS_{name.upper()}" in helptext


@pytest.mark.parametrize("ini, env, cli, expected", [
    (None, None, None, None),  # default: each scenario's own count
    ("2", None, None, 2),
    ("2", "3", None, 3),  # environment over ini file
    ("2", "3", "4", 4),  # command line over both
    (None, "3", "4", 4),
])
def test_precedence_command_line_then_environment_then_ini(pytester, monkeypatch, ini, env, cli, expected):
    if ini:
        pytester.makeini(f"[pytest]\nharness_replays = {ini}\n")
    if env:
        monkeypatch.setenv("FENCE_HARNESS_REPLAYS", env)
    args = ["--harness-replays", cli] if cli else []
    assert settings(pytester.parseconfigure(*PLUGIN, *args)).replays == expected


def test_every_setting_from_the_ini_file_and_its_paths_relative_to_it(pytester, monkeypatch, tiny):
    pytester.makeini("[pytest]\nharness_device = sim\nharness_scenarios = race.toml\nharness_report = out\n")
    monkeypatch.chdir(pytester.mkdir("elsewhere"))
    s = settings(pytester.parseconfigure(*PLUGIN, "-c", str(pytester.path / "tox.ini")))
    assert (s.device, s.scenarios, s.report) == ("sim", [tiny], pytester.path / "out")


def test_defaults(pytester):
    s = settings(pytester.parseconfigure(*PLUGIN))
    assert (s.device, s.replays, s.scenarios) == ("auto", None, [])
    assert s.report == pytester.path / "reports"


@pytest.mark.parametrize("where, message", [
    ("env", "FENCE_HARNESS_REPLAYS=abc (environment): expected a positive integer"),
    ("cli", "--harness-replays=abc (command line): expected a positive integer"),
    ("ini", "harness_replays=abc (ini file): expected a positive integer"),
])
def test_a_bad_value_is_a_usage_error_naming_its_source(pytester, monkeypatch, where, message):
    args = []
    if where == "env":
        monkeypatch.setenv("FENCE_HARNESS_REPLAYS", "abc")
    elif where == "cli":
        args = ["--harness-replays", "abc"]
    else:
        pytester.makeini("[pytest]\nharness_replays = abc\n")
    result = pytester.runpytest(*PLUGIN, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])


@pytest.mark.parametrize("env, value, message", [
    ("FENCE_HARNESS_DEVICE", "gpu", "FENCE_HARNESS_DEVICE=gpu (environment): expected one of auto, cuda, sim"),
    ("FENCE_HARNESS_REPLAYS", "0", "FENCE_HARNESS_REPLAYS=0 (environment): expected a positive integer"),
    ("FENCE_HARNESS_SHARD", "3/2", "FENCE_HARNESS_SHARD=3/2 (environment): expected K/N with whole numbers "
                                   "1 <= K <= N, e.g. 1/2, got '3/2'"),
])
def test_other_bad_values(pytester, monkeypatch, env, value, message):
    monkeypatch.setenv(env, value)
    result = pytester.runpytest(*PLUGIN)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])


def test_a_bad_scenario_file_is_a_usage_error_with_the_harness_message(pytester):
    pytester.makefile(".toml", bad=TINY.replace('backend = "full"', 'backend = "ful"', 1))
    result = run(pytester, "--harness-scenarios", "bad.toml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    # The harness's own one-line message (fnmatch would read its [0] as a pattern).
    assert result.stderr.lines[0].startswith("ERROR: bad.toml: scenario[0].backend: unknown value 'ful'")
    missing = run(pytester, "--harness-scenarios", "nope.toml")
    missing.stderr.fnmatch_lines(["ERROR: nope.toml: no such file"])


# ---------------------------------------------------------------- shards

# tiny_attention.toml's two scenarios hash to shard 1 of 2; the breakable pair splits across both.
SHARDED = TINY + """
[[scenario]]
name = "tiny-breakable-none"
backend = "breakable"
expect = "clean"

[[scenario]]
name = "tiny-breakable-final_event"
backend = "breakable"
fence = "final_event"
expect = "clean"
"""
SCENARIOS = ["tiny-full-none", "tiny-full-final_event", "tiny-breakable-none", "tiny-breakable-final_event"]
FUNCTIONS = "".join(f"def test_{i}(): pass\n" for i in range(6))


def _passed(result: pytest.RunResult) -> set[str]:
    return {line.split()[0].split("::")[-1] for line in result.outlines if " PASSED" in line}


def test_shards_split_the_items_and_merged_give_the_unsharded_verdicts(pytester):
    from harness.frontends.cli import main
    from harness.input.shard import Shard

    pytester.makefile(".toml", four=SHARDED)
    pytester.makepyfile(test_functions=FUNCTIONS)
    args = ("--harness-scenarios", "four.toml", "-v")
    whole = run(pytester, *args, "--harness-report", "whole")
    whole.assert_outcomes(passed=10)
    ran = []
    for k in (1, 2):
        result = run(pytester, *args, "--harness-shard", f"{k}/2", "--harness-report", f"s{k}")
        ran.append(_passed(result))
        outcomes = result.parseoutcomes()
        assert outcomes["passed"] == len(ran[-1]) and outcomes["passed"] + outcomes["deselected"] == 10
        doc = json.loads((pytester.path / f"s{k}" / "results.json").read_text())
        assert doc["shard"] == f"{k}/2"
        assert doc["shard_of"] == SCENARIOS
        assert [e["name"] for e in doc["scenarios"]] == [n for n in SCENARIOS if n in ran[-1]]
    # Every item in one shard and one only: scenarios by name, as `run --shard`, functions by node id.
    assert not ran[0] & ran[1] and ran[0] | ran[1] == _passed(whole)
    assert {n for n in ran[1] if n.startswith("tiny-")} == {"tiny-breakable-final_event"}
    assert ran[1] - {"tiny-breakable-final_event"} == {
        f"test_{i}" for i in range(6) if Shard(2, 2).holds(f"test_functions.py::test_{i}")}
    assert main(["merge", str(pytester.path / "s1"), str(pytester.path / "s2"),
                 "--out", str(pytester.path / "merged")]) == 0
    merged, unsharded = (json.loads((pytester.path / d / "results.json").read_text()) for d in ("merged", "whole"))
    verdict = ("name", "expect", "observed", "evidence", "met", "error", "stale_replays", "replays", "findings")
    assert [[e[k] for k in verdict] for e in merged["scenarios"]] == [
        [e[k] for k in verdict] for e in unsharded["scenarios"]]
    assert merged["summary"] == unsharded["summary"] and merged["merge"]["complete"]


def test_a_shard_with_no_scenario_is_a_usage_error(pytester, tiny):
    result = run(pytester, "--harness-scenarios", "race.toml", "--harness-shard", "2/2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --harness-shard: shard 2/2 holds none of the 2 selected scenarios; "
                                 "a shard that tests nothing must not pass: use fewer shards"])


def test_a_bad_shard_on_the_command_line_names_it(pytester):
    result = pytester.runpytest(*PLUGIN, "--harness-shard", "0/2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --harness-shard=0/2 (command line): expected K/N with whole numbers "
                                 "1 <= K <= N, e.g. 1/2, got '0/2'"])


# ---------------------------------------------------------------- fixtures


def test_fixtures_for_hand_written_race_tests(pytester, tiny):
    pytester.makepyfile(
        """
        from harness.input.scenario_file import load_file

        RACE, FENCED = load_file("race.toml")

        def test_device(harness_device):
            assert harness_device.name == "sim"

        def test_run(run_harness_scenario):
            r = run_harness_scenario(RACE)
            assert r.met and r.tally.replays == 2  # --harness-replays
            assert run_harness_scenario(FENCED, replays=1).tally.replays == 1

        def test_ground_truth(harness_ground_truth):
            bench, oracle = harness_ground_truth(RACE)
            assert bench.scenario is RACE and len(oracle.units) > 0
        """
    )
    run(pytester, "--harness-replays", "2").assert_outcomes(passed=3)
    # They carry the device's marker, as the scenario items do.
    run(pytester, "--harness-replays", "2", "-m", "sim").assert_outcomes(passed=3)
    run(pytester, "-m", "gpu").assert_outcomes(deselected=3)


# ---------------------------------------------------------------- both ways of loading


@pytest.fixture
def entry_point(pytester):
    """A stand-in installed distribution whose pytest11 entry point is the plugin."""
    info = pytester.mkdir("fence_harness_stub-0.0.dist-info")
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fence-harness-stub\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text("[pytest11]\nfence_harness = harness.frontends.pytest_plugin\n")
    pytester.syspathinsert()


@pytest.mark.parametrize("how", ["entry point", "and -p", "and PYTEST_PLUGINS"])
def test_entry_point_and_explicit_loading_do_not_clash(pytester, monkeypatch, tiny, entry_point, how):
    args = ["-p", "no:cacheprovider", "--harness-device", "sim", "--harness-scenarios", "race.toml"]
    if how == "and -p":
        args = [*PLUGIN, *args]
    elif how == "and PYTEST_PLUGINS":  # registered after the entry point, the other way round
        monkeypatch.setenv("PYTEST_PLUGINS", "harness.frontends.pytest_plugin")
    result = pytester.runpytest(*args)
    result.assert_outcomes(passed=2)


# ---------------------------------------------------------------- several workers


FAKE_NVML = """
GPUS = [b"GPU-00000000-aaaa", b"GPU-11111111-bbbb"]
nvmlInit = nvmlShutdown = lambda: None
nvmlDeviceGetCount = lambda: len(GPUS)
nvmlDeviceGetHandleByIndex = lambda i: i
nvmlDeviceGetUUID = lambda i: GPUS[i]
"""


def test_xdist_workers_pin_one_gpu_each_and_merge_one_report(pytester, monkeypatch, tiny):
    pytest.importorskip("xdist")
    pytester.makefile(".toml", wrong=WRONG)
    # NVML listing two GPUs (a fake one, first on the path); the simulator runs the scenarios.
    pytester.makepyfile(pynvml=FAKE_NVML)
    pytester.makepyfile(test_pins="""
        import os

        def test_pinned(worker_id):
            index = int(worker_id[2:])
            assert os.environ["CUDA_VISIBLE_DEVICES"] == ["GPU-00000000-aaaa", "GPU-11111111-bbbb"][index % 2]
        """)
    path = os.pathsep.join([str(pytester.path), str(ROOT), os.environ.get("PYTHONPATH", "")])
    monkeypatch.setenv("PYTHONPATH", path)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    # Under `make test -n 2` this test itself runs in a worker: the run below is a controller.
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TMPDIR", str(pytester.mkdir("tmp")))  # where the workers' parts go
    result = pytester.runpytest_subprocess(
        "-n", "3", "-p", "xdist", *PLUGIN, "-p", "no:cacheprovider", "--harness-device", "sim",
        "--harness-scenarios", "race.toml", "wrong.toml", "--harness-report", "out",
        "--dist", "loadfile",  # a file per worker: one runs only test_pins, and no scenario
    )
    result.assert_outcomes(passed=4, failed=1)
    result.stdout.fnmatch_lines(["results: *out*results.json"])
    doc = json.loads((pytester.path / "out" / "results.json").read_text())
    names = [e["name"] for e in doc["scenarios"]]
    assert names == ["tiny-full-none", "tiny-full-final_event", "tiny-wrong", "tiny-fenced"]
    assert len({e["worker"] for e in doc["scenarios"]}) == 2
    assert set(doc["environment"]["workers"]) == {"gw0", "gw1", "gw2"}  # each worker, scenarios or not
    assert all(e["gpu_uuid"] is None for e in doc["scenarios"])  # the simulator is no GPU
    assert doc["summary"] == {"scenarios": 4, "met": 3, "errors": 0}
    assert not list((pytester.path / "tmp").iterdir())  # the parts are gone once merged


# ---------------------------------------------------------------- a session cut short

STOPPER = '''
import os, signal, time

def term(op):
    os.kill(os.getpid(), signal.SIGTERM)  # as a CI runner's limit sends it
    time.sleep(30)

def kill(op):
    os.kill(os.getpid(), signal.SIGKILL)  # no handler runs: only the journal is left
'''

CUT = TINY + '''
[[scenario]]
name = "tiny-stops-here"
backend = "full"
fence = "final_event"
schedule = "stopper:{how}"
expect = "clean"

[[scenario]]
name = "tiny-after"
backend = "full"
fence = "final_event"
expect = "clean"
'''


@pytest.mark.parametrize("how", ["term", "kill"])
def test_a_session_cut_short_leaves_a_partial_report_of_what_finished(pytester, how):
    pytester.makepyfile(stopper=STOPPER)
    pytester.makefile(".toml", cut=CUT.replace("{how}", how))
    result = pytester.runpytest_subprocess(*PLUGIN, "-p", "no:cacheprovider", "--harness-device", "sim",
                                           "--harness-scenarios", "cut.toml", "--harness-report", "out",
                                           "--junitxml", "junit.xml", timeout=300)
    out = pytester.path / "out"
    finished = ["tiny-full-none", "tiny-full-final_event"]
    if how == "term":
        assert result.ret == pytest.ExitCode.INTERRUPTED
        doc = json.loads((out / "results.json").read_text())
        assert doc["interrupted"] == "SIGTERM" and doc["not_run"] == ["tiny-stops-here", "tiny-after"]
        cases = {c.get("name") for c in ET.parse(pytester.path / "junit.xml").iter("testcase")}
        assert set(finished) <= cases  # pytest's own JUnit writer wrote what finished
        assert "tiny-full-none" in (out / "summary.md").read_text()
        assert not (out / "journal").exists()  # the report says what the journal did
    else:
        assert result.ret == -signal.SIGKILL and not (out / "results.json").exists()
        from harness.frontends.cli import main

        assert main(["report", str(out)]) == 0
        doc = json.loads((out / "results.json").read_text())
        assert doc["interrupted"] == "killed"
    assert doc["partial"] is True and doc["rebuilt_from"] == "journal"
    assert [s["name"] for s in doc["scenarios"]] == finished and all(s["met"] for s in doc["scenarios"])


def test_a_shard_cut_short_names_only_its_own_scenarios_as_not_run(pytester):
    # Shard 1 of 3 holds all but tiny-full-none: that one is another runner's, never "not run" here.
    pytester.makepyfile(stopper=STOPPER)
    pytester.makefile(".toml", cut=CUT.replace("{how}", "term"))
    result = pytester.runpytest_subprocess(*PLUGIN, "-p", "no:cacheprovider", "--harness-device", "sim",
                                           "--harness-scenarios", "cut.toml", "--harness-report", "out",
                                           "--harness-shard", "1/3", timeout=300)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    doc = json.loads((pytester.path / "out" / "results.json").read_text())
    assert (doc["shard"], doc["interrupted"]) == ("1/3", "SIGTERM")
    assert [s["name"] for s in doc["scenarios"]] == ["tiny-full-final_event"]
    assert doc["not_run"] == ["tiny-stops-here", "tiny-after"]


def test_a_skipped_scenario_is_reported_at_its_own_file_and_line(pytester, tiny):
    # A GPU-only scenario on the simulator: the skip line names the scenario file and the line of
    # its name, never the plugin's module (from a wheel, a folder of the installing machine).
    pytester.makefile(".toml", gpu_only=TINY.replace('name = "tiny-full-final_event"',
                                                     'name = "tiny-full-final_event"\ndevices = ["cuda"]'))
    result = run(pytester, "--harness-scenarios", "gpu_only.toml", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    line = next(x for x in result.outlines if x.startswith("SKIPPED"))
    lineno = TINY.splitlines().index('name = "tiny-full-final_event"') + 1
    assert line == (f"SKIPPED [1] gpu_only.toml:{lineno}: runs only on cuda (devices in gpu_only.toml), "
                    "not on sim"), line


def test_a_skipped_scenario_names_its_file_relative_in_the_junit_file(pytester, tiny):
    # The JUnit file is what a CI system keeps and a sample commits: its skip line names the scenario
    # file as the console does, never the absolute folder of the host that ran it.
    pytester.makefile(".toml", gpu_only=TINY.replace('name = "tiny-full-final_event"',
                                                     'name = "tiny-full-final_event"\ndevices = ["cuda"]'))
    junit = pytester.path / "junit.xml"
    run(pytester, "--harness-scenarios", "gpu_only.toml", f"--junitxml={junit}").assert_outcomes(passed=1, skipped=1)
    text = junit.read_text()
    assert "gpu_only.toml:" in text and str(pytester.path) not in text
