"""The docs as a reader relies on them: the README stays a front door and its first scenario runs,
the layer map names every module and nothing else, links between pages resolve, every table row
sits in a table, and measured figures stay on the results page.

What a documented snippet may import is checked with the examples, in tests/test_api.py."""

from __future__ import annotations

import re

import pytest

from harness.frontends.cli import main
from harness.input.scenario_file import load_file
from tests.support.paths import ROOT
from tests.test_api import PAGES
from tests.test_layers import LAYERS, MODULES

README = ROOT / "README.md"
DOCS = ROOT / "docs"
ARCHITECTURE = DOCS / "architecture.md"
RESULTS = DOCS / "results.md"
MAX_README_LINES = 300

# A row of the module table: | `harness/x/y.py` | layer | what it holds |
_ROW = re.compile(r"^\| `(harness/[^`]+\.py)` \| ([a-z_]+) \|", re.M)


def _layer_of(module: str) -> str:
    """The layer a dotted module name sits in, as tests/test_layers.py reads it ("top" above them all)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "top"


MODULE_FILES = {str(path.relative_to(ROOT)): _layer_of(name) for name, path in MODULES.items()}


def table_problems(page: str, modules: dict[str, str]) -> list[str]:
    """What is wrong with a page's module table against `modules` (path -> layer): missing rows,
    rows for no module, rows twice, rows in another layer than their path's."""
    rows = _ROW.findall(page)
    named = [path for path, _ in rows]
    problems = [f"no row for {p}" for p in sorted(set(modules) - set(named))]
    problems += [f"a row for {p}, which is no module" for p in sorted(set(named) - set(modules))]
    problems += [f"{p} has {named.count(p)} rows" for p in sorted(set(named)) if named.count(p) > 1]
    problems += [f"{p} is in layer {modules[p]}, not {layer}" for p, layer in rows
                 if p in modules and modules[p] != layer]
    return problems


# ---------------------------------------------------------------- the layer map


def test_the_module_table_has_one_row_per_module_in_its_layer():
    problems = table_problems(ARCHITECTURE.read_text(), MODULE_FILES)
    assert not problems, "docs/architecture.md's module table:\n" + "\n".join(problems)


def test_the_table_check_has_teeth():
    page = ARCHITECTURE.read_text()
    row = "| `harness/run/verdict.py` | run |"
    assert row in page
    assert table_problems(page.replace(row, "| `harness/run/verdicts.py` | run |"), MODULE_FILES) == [
        "no row for harness/run/verdict.py", "a row for harness/run/verdicts.py, which is no module"]
    assert table_problems(page.replace(row, "| `harness/run/verdict.py` | report |"), MODULE_FILES) == [
        "harness/run/verdict.py is in layer run, not report"]
    assert table_problems(page + f"\n{row} again |\n", MODULE_FILES) == ["harness/run/verdict.py has 2 rows"]


# ---------------------------------------------------------------- the README


def test_the_readme_is_a_front_door():
    lines = README.read_text().count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; topics go to docs/ (at most {MAX_README_LINES})"


def _first_scenario() -> str:
    found = re.search(r"^```toml\n(.*?)^```", README.read_text(), re.S | re.M)
    assert found, "README.md has no ```toml block: its first scenario"
    return found.group(1)


def test_the_readmes_first_scenario_runs_on_the_simulator(tmp_path):
    path = tmp_path / "first.toml"
    path.write_text(_first_scenario())
    scenarios = load_file(path)
    assert {s.expect.value for s in scenarios} == {"race", "clean"}  # the bug and the fix, side by side
    # Fewer replays than the file's: the verdicts on the simulator are the same, and it is quicker.
    assert main(["run", str(path), "--device", "sim", "--replays", "2", "--out", str(tmp_path / "out")]) == 0


def test_the_readmes_commands_name_its_first_scenarios():
    text = README.read_text()
    names = set(re.findall(r'^name = "([^"]+)"', _first_scenario(), re.M))
    reproduced = set(re.findall(r"fence-harness repro (\S+) --file first\.toml", text))
    assert reproduced and reproduced <= names, (reproduced, names)
    assert "fence-harness run first.toml" in text


# ---------------------------------------------------------------- pages and links

PAGES_HERE = [README, ROOT / "CONTRIBUTING.md", *sorted(DOCS.glob("**/*.md"))]


def test_every_page_is_one_whose_snippets_are_checked():
    assert set(PAGES_HERE) <= set(PAGES) and len(PAGES_HERE) > 3


_LINK = re.compile(r"\]\(([^)#\s]+\.md)(#[^)\s]*)?\)")


def _anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


@pytest.mark.parametrize("page", PAGES_HERE, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_between_pages_resolve(page):
    broken = []
    for target, anchor in _LINK.findall(page.read_text()):
        if "://" in target:
            continue
        path = (page.parent / target).resolve()
        if not path.is_file():
            broken.append(target)
        elif anchor and anchor[1:] not in _anchors(path.read_text()):
            broken.append(target + anchor)
    assert not broken, f"{page.name} links to what is not there: {broken}"


def stray_rows(text: str) -> list[int]:
    """Line numbers of table rows that belong to no table: a row whose line above is no row of a
    table and whose line below is not the header's separator (Markdown shows such a row as text)."""
    lines = text.splitlines()
    fenced, found = False, []
    for i, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not line.startswith("|"):
            continue
        starts = i + 1 < len(lines) and re.match(r"^\|[\s:|-]+\|\s*$", lines[i + 1])
        if not (i and lines[i - 1].startswith("|")) and not starts:
            found.append(i + 1)
    return found


@pytest.mark.parametrize("page", PAGES_HERE, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_table_row_is_in_a_table(page):
    stray = stray_rows(page.read_text())
    assert not stray, f"{page.name}: table rows outside a table at lines {stray}"


def test_the_table_row_check_has_teeth():
    table = "| a | b |\n| --- | --- |\n| 1 | 2 |\n"
    assert stray_rows(table) == []
    assert stray_rows(table + "\nA paragraph.\n| 3 | 4 |\n") == [6]  # a row after a paragraph


# Where a figure is measured: the results page names the machine; a reference page names none.
_MACHINE = re.compile(r"\bH200\b|driver 5\d\d\.")


@pytest.mark.parametrize("page", [p for p in PAGES_HERE if p != RESULTS], ids=lambda p: str(p.relative_to(ROOT)))
def test_reference_pages_leave_measured_figures_to_the_results_page(page):
    found = [m.group(0) for m in _MACHINE.finditer(page.read_text())]
    assert not found, f"{page.name} names a machine ({found[0]}): measured figures go on docs/results.md"


def test_the_results_page_says_how_its_figures_are_made():
    text = RESULTS.read_text()
    assert "not recorded" in text and "command" in text.split("\n## ")[0].lower()


def test_the_machine_check_has_teeth():
    assert _MACHINE.search("measured on an H200 (driver 580.159.04)")
    assert not _MACHINE.search("a 32-bit flag, 580 lines")

