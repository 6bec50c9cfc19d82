"""The plugin API's version (`harness.api.API_VERSION`), what each version changed, and the names
later versions removed: one table, so an old plugin gets one line naming the replacement instead of
a wrong answer.

A plugin module may say which version it is written for with a module-level `HARNESS_API = N`.
Loading one that names another version is an error (exit 2) that says what changed since; one
that names none is taken as written for the current version. Any change of meaning of a name in
`harness.api` adds a version here and a CHANGELOG entry.
"""

from __future__ import annotations

from harness.records.errors import ApiChanged

API_VERSION = 2

# version -> what it changed, in a line (the CHANGELOG has the whole entry)
CHANGES: dict[int, str] = {
    1: "the first plugin API: a fence's ctx.op was the pending load op's event set",
    2: "ctx.op is the pending LoadOp (its events are op.start_event / op.load_events / op.finish_event); "
       "a layer completes only through op.complete(layer), which records its event and runs the "
       "on_layer_loaded listeners on the load stream; schedules and accessors may be classes, made "
       "once per scenario",
}

# (owner, name) -> what to use instead, for names a version removed
REMOVED: dict[tuple[str, str], tuple[int, str]] = {
    ("LoadOp", "events"): (2, "use op.start_event, op.load_events and op.finish_event, and complete a layer "
                              "with op.complete(layer), which also runs the on_layer_loaded listeners"),
    ("LoadOp", "wait"): (2, "ctx.op is the pending LoadOp, not its event set: wait on a layer with "
                            "ctx.forward.wait_event(ctx.op.load_events[layer])"),
}


def removed_name(owner: str, name: str) -> AttributeError:
    """The error for `owner.name`: ApiChanged naming the replacement where a version removed it,
    else a plain AttributeError."""
    if (owner, name) in REMOVED:
        version, instead = REMOVED[(owner, name)]
        return ApiChanged(f"{owner}.{name} was removed in plugin API {version}: {instead}")
    return AttributeError(f"{owner!r} object has no attribute {name!r}")


def version_mismatch(declared: object) -> str | None:
    """Why a plugin module declaring `HARNESS_API = declared` cannot be loaded, or None when it can."""
    if declared is None or declared == API_VERSION:
        return None
    if not isinstance(declared, int) or isinstance(declared, bool) or declared not in CHANGES:
        return f"HARNESS_API = {declared!r} names no plugin API version; this harness speaks {API_VERSION}"
    since = "; ".join(f"{v}: {CHANGES[v]}" for v in sorted(CHANGES) if v > declared)
    if declared > API_VERSION:
        return f"it is written for plugin API {declared}, newer than this harness's {API_VERSION}"
    return f"it is written for plugin API {declared}; this harness speaks {API_VERSION}. Changed since: {since}"
