"""Name -> callable for the three things a user can plug in.

A fence strategy, an accessor wait policy and a load-back schedule are each
named by a built-in name or by `package.module:callable` (importable from the
working directory or the Python path). Resolving imports the module, finds the
callable and checks that it can be called the way the harness calls it; every
failure is an `InputError` (one line, exit 2) naming where the name came from.

    fence(ctx: FenceContext) -> Runner | None
    accessor(counter: LoadCounter, layer_id: int, pool: str) -> None
    schedule(op: LoadOp) -> None

(the types: `harness.api`). Each may instead be a class whose instances are called so: the
harness makes one instance per scenario, with no arguments, so what an instance keeps is that
scenario's alone; a fence class may also have `setup(s: FenceSetup)`, called once before anything
is captured. A plugin module may declare the plugin API version it is written for
(`HARNESS_API = 2`); another version is an InputError saying what changed since.

A plugin is the user's code, so what it raises at run time is its own failure, not
the harness's: a resolved plugin is wrapped so that an exception from it becomes a
`PluginError` naming the plugin, which ends that scenario as an error and lets the
run go on. Built-ins are not wrapped: an exception from one is a harness bug.
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
from typing import Any

from harness.records.errors import HarnessError, InputError, PluginError
from harness.records.plugin_api import version_mismatch

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
        from harness.engines import ENGINES
        from harness.protocol.fences import FENCES

        return {**FENCES, **{name: fn for e in ENGINES.values() for name, fn in e.fences.items()}}
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


def import_spec(spec: str, source: str, key: str) -> Any:
    """The object `package.module:name` names, its module imported (and its API version checked);
    InputError(source, key, ...) when it cannot be had."""
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
    why = version_mismatch(getattr(module, "HARNESS_API", None))
    if why is not None:
        raise InputError(source, key, f"plugin module {module_name!r} for {spec!r}: {why}")
    found: Any = module
    for part in attr.split("."):
        found = getattr(found, part, None)
        if found is None:
            raise InputError(source, key, f"module {module_name!r} has no {attr!r} (from {spec!r})")
    return found


def _load_plugin(kind: Kind, spec: str, source: str, key: str) -> Callable:
    info = _INFO[kind]
    fn = import_spec(spec, source, key)
    if not callable(fn):
        raise InputError(source, key, f"{spec!r} is not callable; a {kind.value} is {info.signature}")
    if inspect.isclass(fn):
        # A strategy class: made once per scenario with no arguments, its instances called; check
        # both (with self), and a fence's set-up.
        _check_signature(fn, 0, spec, f"a {kind.value} class is made with no arguments, once per scenario",
                         source, key)
        if not any("__call__" in vars(base) for base in fn.__mro__[:-1]):  # the class's own, not type's
            raise InputError(source, key, f"class {spec!r} has no __call__; its instances are called as "
                                          f"{info.signature}")
        _check_signature(fn.__call__, info.arity + 1, spec, f"a {kind.value} is called as {info.signature}",
                         source, key)
        if kind is Kind.FENCE and hasattr(fn, "setup"):
            _check_signature(fn.setup, 2, f"{spec}.setup", "a fence's setup is called as setup(s)",
                             source, key)
        return _guarded_class(fn, spec, kind)
    _check_signature(fn, info.arity, spec, f"a {kind.value} is called as {info.signature}", source, key)
    return _Guarded(fn, spec, kind.value)


def _check_signature(fn: Callable, arity: int, what: str, called: str, source: str, key: str) -> None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins without a signature: trust them
    try:
        sig.bind(*range(arity))
    except TypeError:
        raise InputError(source, key, f"{what!r} takes {sig} but {called}") from None


class _Guarded:
    """A plugin callable whose exceptions become a PluginError naming it; its other attributes
    (a schedule's `records_in_graph`, a strategy's own state) read through to it."""

    def __init__(self, fn: Callable, spec: str, role: str):
        self.fn, self.spec, self.role = fn, spec, role
        self.__name__ = getattr(fn, "__name__", spec)

    def __getattr__(self, name: str) -> Any:
        fn = self.__dict__.get("fn")
        if fn is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(fn, name)

    def __call__(self, *args: Any) -> Any:
        try:
            return self.fn(*args)
        except HarnessError:
            raise  # the harness's own answer through the plugin (a timeout of ctx.host_wait, say)
        except Exception as e:  # noqa: BLE001 - the user's code: its failure, reported as such
            raise PluginError(f"plugin {self.spec!r} ({self.role}) raised {type(e).__name__}: {e}") from e


def _guarded_class(cls: type, spec: str, kind: Kind) -> Callable[[], Any]:
    """A factory of the class's instances, with their setup and __call__ guarded."""

    def make() -> Any:
        instance = _Guarded(cls, spec, f"{kind.value} construction")()
        guarded = _Guarded(instance, spec, kind.value)
        if hasattr(instance, "setup"):
            guarded.setup = _Guarded(instance.setup, spec, f"{kind.value} setup")  # type: ignore[attr-defined]
        return guarded

    make.makes_strategy = True  # type: ignore[attr-defined]
    return make


def for_scenario(strategy: Callable) -> Callable:
    """The fence, schedule or accessor one scenario runs: a strategy class (or a plugin's) gets a fresh
    instance, so what it keeps (its events, flags or captured graphs) is that scenario's alone."""
    return strategy() if inspect.isclass(strategy) or getattr(strategy, "makes_strategy", False) else strategy
