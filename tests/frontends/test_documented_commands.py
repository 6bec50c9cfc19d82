"""Every command the docs tell a reader to run exists: each `make TARGET` is a target of the Makefile,
each `fence-harness COMMAND` (and `python -m harness COMMAND`) a command of the CLI's own parser,
each `python -m harness.MODULE` a module, and each script path a file in the checkout.

Read from README.md, CONTRIBUTING.md and docs/**/*.md: the code in them (inline spans and fenced
blocks), where commands and paths are written; prose is not read.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.frontends.cli import _parser
from tests.support.paths import ROOT

_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
_SPAN = re.compile(r"`([^`]+)`")
# A command starts a line, or follows a separator or an opening bracket.
_START = r"(?:^|(?<=[\s;&|(]))"
_MAKE = re.compile(_START + r"make((?:[ \t]+[^\s`#;&|)]+)+)", re.M)
_CLI = re.compile(_START + r"fence-harness((?:[ \t]+[^\s`#;&|)]+)+)", re.M)
_MODULE = re.compile(_START + r"(?:python3?|\$\(PYTHON\)|\$\(VPY\)|\$\(EPY\))[ \t]+-m[ \t]+(harness[\w.]*)((?:[ \t]+"
                     r"[^\s`#;&|)]+)*)", re.M)
_RUN_SCRIPT = re.compile(_START + r"(?:bash|sh|source|python3?)[ \t]+(?:-\S+[ \t]+)*([^\s`#;&|)]+\.(?:sh|py))\b",
                         re.M)
_PATH = re.compile(r"(?<![\w/.$-])((?:\.?[\w-]+/)+[\w.-]+\.(?:sh|py))(?![\w/])")
_PLACEHOLDER = re.compile(r"[*{}<>\[\]]|\.\.\.|[A-Z]{2,}")


@dataclass(frozen=True)
class Mention:
    doc: str
    line: int
    text: str

    def where(self) -> str:
        return f"{self.doc}:{self.line}: {self.text}"


def documents(root: Path = ROOT) -> list[Path]:
    found = [root / name for name in ("README.md", "CONTRIBUTING.md") if (root / name).is_file()]
    return found + sorted((root / "docs").rglob("*.md"))


def code(text: str) -> Iterator[tuple[int, str]]:
    """(line number, code) of each fenced block's lines and each inline span outside the blocks (a
    span may wrap onto the next line of its paragraph: it is read as one line)."""
    blocks = list(_FENCE.finditer(text))
    for m in blocks:
        first = text.count("\n", 0, m.start(1)) + 1
        for i, line in enumerate(m.group(1).splitlines()):
            yield first + i, line
    outside = list(text)
    for m in blocks:  # fences and all: their backticks pair with no span's
        outside[m.start():m.end()] = [c if c == "\n" else " " for c in m.group(0)]
    offset = 0
    for paragraph in re.split(r"(\n\s*\n)", "".join(outside)):  # a span never crosses a blank line
        for m in _SPAN.finditer(paragraph):
            yield text.count("\n", 0, offset + m.start()) + 1, m.group(1).replace("\n", " ")
        offset += len(paragraph)


def words(rest: str) -> list[str]:
    """A command's words after its name, up to a comment; VAR=VALUE settings left out."""
    return [w for w in rest.split() if not re.fullmatch(r"[A-Za-z_]\w*=.*", w)]


def _is_name(word: str) -> bool:
    """A word that names a target or a command, not an option, a placeholder or punctuation."""
    return bool(re.fullmatch(r"[a-z][a-z0-9_.-]*", word))


def make_targets(makefile: Path) -> set[str]:
    targets = set()
    for line in makefile.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_./$()%-][^:=#\t]*?)\s*:(?![=:])", line)
        if m:
            targets |= set(m.group(1).split())
    return targets


def commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """A parser's sub-commands, by name ({} when it has none)."""
    return {name: p for a in parser._actions if isinstance(a, argparse._SubParsersAction)
            for name, p in a.choices.items()}


@dataclass(frozen=True)
class Finding:
    mention: Mention
    why: str

    def describe(self) -> str:
        return f"{self.mention.where()}: {self.why}"


def _cli_problem(argv: list[str], parser: argparse.ArgumentParser, prefix: str) -> str | None:
    """What is wrong with `prefix ARGV...`'s command words against the parser, or None."""
    said = prefix
    for word in argv:
        table = commands(parser)
        if not table or not _is_name(word):
            return None
        if word not in table:
            return f"`{said} {word}`: no such command (the parser has {', '.join(sorted(table))})"
        said, parser = f"{said} {word}", table[word]
    return None


def _module_problem(module: str) -> str | None:
    """Why `python -m MODULE` would not run it as a program, or None: a module that is not there,
    or one with no `__main__` (it would import, do nothing and exit 0)."""
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        spec = None
    if spec is None or spec.origin is None:
        return "no such module"
    origin = Path(spec.origin)
    main = origin.parent / "__main__.py" if spec.submodule_search_locations is not None else origin
    if not main.is_file() or '__name__ == "__main__"' not in main.read_text() and main.name != "__main__.py":
        return "not a program: it has no `__main__`"
    return None


def check(docs: Iterable[Path], root: Path, targets: set[str], parser: argparse.ArgumentParser) -> list[Finding]:
    found: list[Finding] = []
    tops = {p.name for p in root.iterdir() if p.is_dir()}
    for doc in docs:
        name = str(doc.relative_to(root))
        for line, text in code(doc.read_text(encoding="utf-8")):
            mention = Mention(name, line, text.strip())
            for m in _MAKE.finditer(text):
                named = [w for w in words(m.group(1)) if not w.startswith("-")][:1]
                if named and _is_name(named[0]) and named[0] not in targets:
                    found.append(Finding(mention, f"`make {named[0]}`: no such target in the Makefile"))
            for m in _CLI.finditer(text):
                why = _cli_problem(words(m.group(1)), parser, "fence-harness")
                if why:
                    found.append(Finding(mention, why))
            for m in _MODULE.finditer(text):
                module = m.group(1).rstrip(".")
                why = _module_problem(module)
                if why:
                    found.append(Finding(mention, f"`python -m {module}`: {why}"))
                elif module == "harness":
                    why = _cli_problem(words(m.group(2)), parser, "python -m harness")
                    if why:
                        found.append(Finding(mention, why))
            paths = {m.group(1) for m in _RUN_SCRIPT.finditer(text)}
            # A path into the checkout: it starts at one of its top folders, or at a hidden one
            # (a folder of scripts beside the code), or it is a shell script anywhere.
            paths |= {p for p in (m.group(1) for m in _PATH.finditer(text))
                      if p.split("/")[0] in tops or p.startswith(".") or p.endswith(".sh")}
            for path in sorted(paths):
                if not _PLACEHOLDER.search(path) and not (root / path.removeprefix("./")).exists():
                    found.append(Finding(mention, f"{path}: no such file in the checkout"))
    return found


def test_every_documented_command_target_module_and_script_exists():
    findings = check(documents(), ROOT, make_targets(ROOT / "Makefile"), _parser())
    assert not findings, "\n".join(f.describe() for f in findings)


def test_the_docs_are_read():
    docs = documents()
    assert ROOT / "README.md" in docs
    mentions = [text for doc in docs for _, text in code(doc.read_text(encoding="utf-8"))]
    assert any("make test" in t for t in mentions) and any("fence-harness run" in t for t in mentions)


# ---------------------------------------------------------------- the check has teeth


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "harness").mkdir()
    (tmp_path / "harness" / "real.py").write_text("")
    (tmp_path / ".ci").mkdir()
    (tmp_path / ".ci" / "run.sh").write_text("")
    (tmp_path / "Makefile").write_text("VAR ?= x\nDIR := y\n.PHONY: test\ntest: dep\n\techo\nengine-from-pack:\n"
                                       "\techo\nifeq ($(A),yes)\nrun:\nendif\n")
    return tmp_path


def _check(tree: Path, text: str) -> list[str]:
    (tree / "README.md").write_text(text)
    return [f.why for f in check([tree / "README.md"], tree, make_targets(tree / "Makefile"), _parser())]


def test_make_targets_are_read_from_the_rules(tree):
    assert make_targets(tree / "Makefile") == {".PHONY", "test", "engine-from-pack", "run"}


def test_a_missing_make_target_is_found(tree):
    assert _check(tree, "`make test` and `make run`, `make engine-from-pack PACK_REPLAYS=5`") == []
    assert _check(tree, "then `make engine-from-pak`") == ["`make engine-from-pak`: no such target in the Makefile"]
    assert _check(tree, "```sh\nmake -j2 nope   # a comment\n```\n") == ["`make nope`: no such target in the Makefile"]
    assert _check(tree, "`make` runs the default; we make sure of it") == []  # no target; prose


def test_an_unregistered_command_is_found(tree):
    ok = ("`fence-harness run FILE -k x`, `fence-harness sanitizer compare`, `fence-harness COMMAND --help`, "
          "`python -m harness list fences`, `fence-harness gpu-workers check RESULTS.json`")
    assert _check(tree, ok) == []
    (why,) = _check(tree, "```\nfence-harness runn scenarios/x.toml\n```\n")
    assert why.startswith("`fence-harness runn`: no such command (the parser has ")
    (why,) = _check(tree, "`fence-harness sanitizer compre`")
    assert why.startswith("`fence-harness sanitizer compre`: no such command")
    (why,) = _check(tree, "`python -m harness mutnts`")
    assert why.startswith("`python -m harness mutnts`: no such command")


def test_a_missing_module_is_found(tree):
    assert _check(tree, "`python -m harness.examples.h2d_graph_race --fence none`") == []
    assert _check(tree, "`python -m harness.frontends.nothing_here count`") == [
        "`python -m harness.frontends.nothing_here`: no such module"]
    assert _check(tree, "`python -m harness.frontends.gpu_workers count`") == [  # a module, but no program
        "`python -m harness.frontends.gpu_workers`: not a program: it has no `__main__`"]
    assert _check(tree, "`python -m harness.nothing.deeper`") == ["`python -m harness.nothing.deeper`: no such module"]
    assert _check(tree, "`python -m pytest -q`") == []  # not the harness's


def test_a_span_may_wrap_onto_the_next_line_but_not_past_its_paragraph(tree):
    assert _check(tree, "as `python -m harness.frontends.gpu_workers\ncheck FILE` does") == [
        "`python -m harness.frontends.gpu_workers`: not a program: it has no `__main__`"]
    assert _check(tree, "an odd ` here\n\nthen `make nope`") == ["`make nope`: no such target in the Makefile"]
    (line,) = [n for n, text in code("a\n\n```\nx\n```\nb `make t`\n") if "make" in text]
    assert line == 6


def test_a_missing_script_is_found(tree):
    assert _check(tree, "`bash .ci/run.sh`, `harness/real.py`, `sglang/srt/elsewhere.py`, `tests/gpu/test_*.py`") == []
    assert _check(tree, "`bash .device/fences18.sh check`") == [".device/fences18.sh: no such file in the checkout"]
    assert _check(tree, "(`.device/checking_ab.py`; ...)") == [".device/checking_ab.py: no such file in the checkout"]
    assert _check(tree, "`harness/gone.py`") == ["harness/gone.py: no such file in the checkout"]
    assert _check(tree, "run `sh tools/x.sh`") == ["tools/x.sh: no such file in the checkout"]
