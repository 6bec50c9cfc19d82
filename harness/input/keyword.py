"""`-k EXPR`: choose scenarios by name, with pytest's meaning of the expression.

A word matches a scenario whose name holds it, case-insensitively ("full" matches
"attention-full-none"); words combine with `and`, `or`, `not` and parentheses, with pytest's
precedence (not, then and, then or). `-k "full and not none"` runs every full-graph scenario
that is fenced. A malformed expression is an InputError naming `-k`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from harness.records.errors import InputError

Match = Callable[[str], bool]

_TOKEN = re.compile(r"\s*(\(|\)|[^\s()]+)")
_OPERATORS = {"and", "or", "not"}


@dataclass(frozen=True)
class Keyword:
    """A parsed -k expression; `matches(name)` says whether it selects a scenario of that name."""

    text: str
    matches: Match


def parse(text: str, source: str = "-k") -> Keyword:
    tokens = _TOKEN.findall(text)
    if not tokens or "".join(tokens).strip() == "":
        raise InputError(source, "", "an empty expression selects nothing; give a word of a scenario's name")
    parser = _Parser(tokens, text, source)
    match = parser.expression()
    if parser.pos != len(tokens):
        raise parser.error(f"unexpected {tokens[parser.pos]!r}")
    return Keyword(text, match)


class _Parser:
    def __init__(self, tokens: list[str], text: str, source: str):
        self.tokens, self.text, self.source, self.pos = tokens, text, source, 0

    def error(self, why: str) -> InputError:
        return InputError(self.source, "", f"{why} in {self.text!r}; expected words joined by and / or / not, "
                                           "with parentheses, as pytest's -k takes")

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise self.error("the expression ends early")
        self.pos += 1
        return token

    def expression(self) -> Match:  # or-expression
        left = self.conjunction()
        while self.peek() == "or":
            self.take()
            right = self.conjunction()
            left = (lambda a, b: lambda name: a(name) or b(name))(left, right)
        return left

    def conjunction(self) -> Match:
        left = self.negation()
        while self.peek() == "and":
            self.take()
            right = self.negation()
            left = (lambda a, b: lambda name: a(name) and b(name))(left, right)
        return left

    def negation(self) -> Match:
        if self.peek() == "not":
            self.take()
            inner = self.negation()
            return lambda name: not inner(name)
        return self.atom()

    def atom(self) -> Match:
        token = self.take()
        if token == "(":
            inner = self.expression()
            if self.take() != ")":
                raise self.error("a '(' without its ')'")
            return inner
        if token == ")" or token in _OPERATORS:
            raise self.error(f"{token!r} where a word was expected")
        word = token.lower()
        return lambda name: word in name.lower()
