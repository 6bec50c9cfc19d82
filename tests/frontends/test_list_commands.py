"""fence-harness list: every kind read from the registry the harness resolves names in, each entry
with a description; scenarios selected as `run` selects them; a wrong kind is one line, exit 2."""

from __future__ import annotations

import json

import pytest

from harness.engines import ENGINES
from harness.faults.registry import FAULTS
from harness.frontends import list_commands
from harness.frontends.cli import main
from harness.input.plugins import Kind, builtins
from harness.input.scenario_file import default_files, load_files
from harness.protocol.hazards import HAZARDS
from harness.records.scenario import shown_path
from tests.support.paths import DATA

REGISTRIES = {
    "fences": lambda: list(builtins(Kind.FENCE)),
    "accessors": lambda: list(builtins(Kind.ACCESSOR)),
    "schedules": lambda: list(builtins(Kind.SCHEDULE)),
    "hazards": lambda: [h.value for h in HAZARDS],
    "faults": lambda: list(FAULTS),
    "engines": lambda: list(ENGINES),
    "scenarios": lambda: [s.name for s in load_files(default_files())],
}


def listed(capsys, *argv: str) -> list[dict]:
    assert main(["list", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_every_kind_is_listed():
    assert set(REGISTRIES) == set(list_commands.KINDS)


@pytest.mark.parametrize("kind", list(REGISTRIES))
def test_each_kind_lists_its_registry_and_every_entry_says_what_it_is(kind, capsys):
    items = listed(capsys, kind)
    assert [i["name"] for i in items] == REGISTRIES[kind]()
    assert {i["kind"] for i in items} == {kind}
    empty = [i["name"] for i in items if not i["description"].strip()]
    assert not empty, f"{kind} without a description: {empty}"


def test_the_console_prints_one_line_an_entry_name_first(capsys):
    assert main(["list", "hazards"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == REGISTRIES["hazards"]()
    assert lines[0].startswith("raw ") and "Read-after-write" in lines[0]


def test_no_kind_counts_each_one(capsys):
    counts = listed(capsys)
    assert counts == [{"kind": k, "count": len(REGISTRIES[k]())} for k in list_commands.KINDS]
    assert main(["list"]) == 0
    assert capsys.readouterr().out.splitlines()[1].split() == ["fences", str(len(REGISTRIES["fences"]()))]


def test_a_wrong_kind_is_one_line_naming_the_valid_ones(capsys):
    assert main(["list", "fence"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "unknown kind 'fence' (did you mean 'fences'?)" in err
    assert "valid: scenarios, fences, accessors, schedules, hazards, faults, engines" in err


def test_scenarios_take_files_and_k_as_run_does(capsys):
    tiny = str(DATA / "tiny.toml")
    every = listed(capsys, "scenarios", tiny)
    assert [i["name"] for i in every] == [s.name for s in load_files([DATA / "tiny.toml"])]
    # The file as messages show it: relative to the working directory (the checkout here).
    assert {i["source"] for i in every} == {shown_path(tiny)} != {tiny}
    chosen = listed(capsys, "scenarios", tiny, "-k", "full and not none")
    assert chosen and all("full" in i["name"] and "none" not in i["name"] for i in chosen)
    assert len(chosen) < len(every)
    assert main(["list", "scenarios", tiny, "-k", "nothing_matches"]) == 2
    assert "-k: 'nothing_matches' matches none" in capsys.readouterr().err


def test_files_and_k_are_for_scenarios_only(capsys):
    assert main(["list", "fences", "-k", "x"]) == 2
    assert "give it after `list scenarios`" in capsys.readouterr().err
    assert main(["list", "fences", str(DATA / "tiny.toml")]) == 2


def test_a_scenario_line_says_its_expectation_and_where_it_runs(capsys):
    (line,) = [i for i in listed(capsys, "scenarios") if i["name"] == "natural-mha8-2k-full-none"]
    assert line["description"].endswith("; expect race; cuda only")


class _Base:
    """The base says this."""


class _Silent(_Base):
    pass


def test_a_description_is_the_attribute_else_the_own_docstrings_first_paragraph():
    def fn() -> None:
        """First line
        wraps here.

        Not this paragraph."""

    assert list_commands.describe(fn) == "First line wraps here."
    assert list_commands.describe(_Base) == "The base says this."
    assert list_commands.describe(_Silent) == ""  # a subclass does not borrow its base's words
    fn.description = "Said so."  # type: ignore[attr-defined]
    assert list_commands.describe(fn) == "Said so."
