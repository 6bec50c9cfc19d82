"""Name -> callable for the three things a user can plug in.

A fence strategy, an accessor wait policy and a load-back schedule are each
named by a built-in name or by `package.module:callable` (importable from the
working directory or the Python path). Resolving imports the module, finds the
callable and checks that it can be called the way the harness calls it; every
failure is an `InputError` (one line, exit 2) naming where the name came from.

    fence(ctx: FenceContext) -> Runner | None             harness.protocol.fences (or a class
                                                          with setup(s) and __call__(ctx))
    accessor(counter, layer_id: int, pool: str) -> None   harness.protocol.accessors
    schedule(op: LoadOp) -> None                          harness.protocol.schedules
"""

from __future__ import annotations

import difflib
import enum
import importlib
import inspect
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.records.errors import InputError

_SPEC_RE = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*")


class Kind(enum.Enum):
    FENCE = "fence"
    ACCESSOR = "accessor"
    SCHEDULE = "schedule"


@dataclass(frozen=True)
class _KindInfo:
    signature: str  # how the harness calls it, for messages
    arity: int  # positional arguments it is called with


_INFO = {
    Kind.FENCE: _KindInfo("fence(ctx)", 1),
    Kind.ACCESSOR: _KindInfo("accessor(counter, layer_id, pool)", 3),
    Kind.SCHEDULE: _KindInfo("schedule(op)", 1),
}


def builtins(kind: Kind) -> dict[str, Callable]:
    # Imported here: the registries import the device layer, which this module need not.
    if kind is Kind.FENCE:
        from harness.protocol.fences import FENCES

        return FENCES
    if kind is Kind.ACCESSOR:
        from harness.protocol.accessors import ACCESSORS

        return ACCESSORS
    from harness.protocol.schedules import SCHEDULES

    return SCHEDULES


def is_plugin(name: str) -> bool:
    return ":" in name


def resolve(kind: Kind, name: str, source: str = "<inline>", key: str = "") -> Callable:
    """The callable `name` stands for; InputError(source, key, ...) when it cannot be had."""
    key = key or kind.value
    table = builtins(kind)
    if not isinstance(name, str):
        raise InputError(source, key, f"expected a {kind.value} name or 'package.module:callable'")
    if not is_plugin(name):
        if name in table:
            return table[name]
        close = difflib.get_close_matches(name, list(table), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise InputError(
            source, key,
            f"unknown {kind.value} {name!r}; valid: {', '.join(table)}, "
            f"or a plugin as 'package.module:callable'{hint}",
        )
    return _load_plugin(kind, name, source, key)


def _load_plugin(kind: Kind, spec: str, source: str, key: str) -> Callable:
    info = _INFO[kind]
    if not _SPEC_RE.fullmatch(spec):
        raise InputError(source, key, f"bad plugin path {spec!r}; expected 'package.module:callable'")
    module_name, _, attr = spec.partition(":")
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, "")  # a user's own module next to their scenario files
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise InputError(source, key, f"cannot import {module_name!r} for {spec!r}: {e}") from None
    except Exception as e:  # noqa: BLE001 - a broken plugin module must not give a traceback
        raise InputError(
            source, key, f"importing {module_name!r} for {spec!r} failed: {type(e).__name__}: {e}"
        ) from None
    fn = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise InputError(source, key, f"module {module_name!r} has no {attr!r} (from {spec!r})")
    if not callable(fn):
        raise InputError(source, key, f"{spec!r} is not callable; a {kind.value} is {info.signature}")
    _check_signature(fn, kind, spec, source, key)
    return fn


def _check_signature(fn: Callable, kind: Kind, spec: str, source: str, key: str) -> None:
    info = _INFO[kind]
    args = range(info.arity)
    if kind is Kind.FENCE and inspect.isclass(fn):
        # A strategy with set-up: instances are called, so check __call__ (with self).
        fn, args = fn.__call__, range(info.arity + 1)
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins without a signature: trust them
    try:
        sig.bind(*args)
    except TypeError:
        raise InputError(
            source, key,
            f"{spec!r} takes {sig} but a {kind.value} is called as {info.signature}",
        ) from None
