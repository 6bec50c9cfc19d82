"""-k EXPR: pytest's meaning, on scenario names."""

from __future__ import annotations

import pytest

from harness.input.keyword import parse
from harness.records.errors import InputError

NAMES = ["attention-full-none", "attention-full-final_event", "mamba-breakable-none", "hybrid-eager-nowaits"]


def chosen(expr: str) -> list[str]:
    k = parse(expr)
    return [n for n in NAMES if k.matches(n)]


@pytest.mark.parametrize("expr, names", [
    ("full", NAMES[:2]),
    ("FULL", NAMES[:2]),  # any case
    ("full and not none", ["attention-full-final_event"]),
    ("mamba or hybrid", NAMES[2:]),
    ("not (full or eager)", ["mamba-breakable-none"]),
    ("none and not full or eager", ["mamba-breakable-none", "hybrid-eager-nowaits"]),  # and binds tighter
    ("not not full", NAMES[:2]),
    ("final_event", ["attention-full-final_event"]),
])
def test_words_and_operators_as_pytest_takes_them(expr, names):
    assert chosen(expr) == names


@pytest.mark.parametrize("expr, why", [
    ("", "empty expression"),
    ("full and", "ends early"),
    ("(full", "ends early"),
    ("full)", "unexpected ')'"),
    ("and full", "'and' where a word was expected"),
    ("full or or none", "'or' where a word was expected"),
])
def test_a_malformed_expression_is_one_line_naming_k(expr, why):
    with pytest.raises(InputError) as e:
        parse(expr)
    assert e.value.source == "-k" and why in e.value.message and "\n" not in str(e.value)
