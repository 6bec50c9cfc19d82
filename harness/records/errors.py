"""One root exception, with the specific kinds the CLI maps to exit codes.

Inner layers raise these; only the CLI prints them (one line, no traceback).
"""

from __future__ import annotations

import signal

from harness.records.trace import Region


class HarnessError(Exception):
    """Root of every error the harness raises on purpose."""

    exit_code = 1


class InputError(HarnessError):
    """Bad user input: a scenario file, a key, a command-line value.

    The message names the file, the key and what would be valid.
    """

    exit_code = 2

    def __init__(self, source: str, key: str, message: str):
        self.source = source
        self.key = key
        self.message = message
        where = f"{source}: {key}" if key else source
        super().__init__(f"{where}: {message}")


class DeviceUnavailable(HarnessError):
    """The requested device cannot be used here (no CUDA, bindings missing)."""

    exit_code = 2


class TooLarge(HarnessError):
    """What was asked for would not fit in the device's memory, by a reading taken before it ran
    out (the simulator's device memory is the host's, where running out kills the process)."""

    exit_code = 2


class ReplayTimeout(HarnessError):
    """A replay, a load-back or a gate did not finish within its deadline."""

    exit_code = 1


class DeviceLost(HarnessError):
    """A CUDA error other than out of memory: the context is unusable, nothing more can run.

    `result` is the scenario it happened in, ended as an error (when there was one).
    """

    exit_code = 2

    def __init__(self, message: str, result: object = None):
        super().__init__(message)
        self.result = result


class GateUnavailable(HarnessError):
    """No gate can be built here (the message says why); a long delay stands in for it."""


class FlagUnavailable(HarnessError):
    """Value waits (`Device.Flags`) cannot be built on this device: install cuda-bindings."""


class CopyFailed(HarnessError):
    """A batched host-to-device copy (`cudaMemcpyBatchAsync`) failed with an error other than
    "unsupported" (which falls back to one copy at a time): that scenario's error."""


class GateTimeout(HarnessError):
    """A gate stayed shut past its timeout; its watchdog opened it."""


class PressureError(HarnessError):
    """The pressure fault's contention did not start in time, or died while the replays ran.

    It ends the scenario it happened in, as that scenario's error (replays that ran without
    the contention they asked for must not pass for replays under it); the run goes on.
    """


class CaptureInvalidated(HarnessError):
    """A plain event was waited on inside a capture (CUDA invalidates the capture).

    Use an external event (`dev.Event(external=True)`): a wait on one is captured as a
    graph node.
    """


class GraphUnavailable(HarnessError):
    """A captured graph cannot be read here (no cuda.bindings, a torch without `keep_graph`): the
    graph check says so and checks nothing; it is no scenario's error."""


class GraphMismatch(HarnessError):
    """The op list the harness recorded for a capture differs from the graph the device holds: the
    analyser's picture of that graph is wrong, so the scenario ends in this error."""


class SlotReusedEarly(HarnessError):
    """The ring of load-event sets wrapped onto a set whose last load had not finished."""


class PluginError(HarnessError):
    """A plugin (fence, accessor, schedule) raised, or returned something it must not.

    It ends the scenario it happened in, as that scenario's error; the run goes on.
    Fix the plugin named in the message.
    """


class ApiChanged(PluginError, AttributeError):
    """A plugin used a name of the plugin API that an API version removed or renamed (see
    `harness.records.plugin_api`). The message names the replacement. An AttributeError too, so
    `hasattr` and `getattr(obj, name, default)` still answer as they would for a missing name."""


class EngineContractBroken(HarnessError):
    """An engine adapter's guard against a false clean did not hold: the engine's replay entry
    point did not load the batch, did not replay the harness's graph exactly once, or the host
    synchronised between the load's start and the replay. It ends that scenario as an error;
    the message says which."""


class NotRestored(HarnessError):
    """Every load op of the batch landed (the host waited for it), and slots it should have restored
    do not hold their host data: the engine's load chain restored them nowhere, or somewhere else.
    Not an ordering bug (no wait can fix it): the scenario's verdict is `wrong`, with these slots.

    `regions`: the slots, each one copy of the harness's plan of what a restore holds."""

    def __init__(self, regions: tuple[Region, ...]):
        self.regions = regions
        super().__init__(f"not restored: {describe_regions(regions)}")


def describe_regions(regions: tuple[Region, ...], most: int = 6) -> str:
    """Regions in a line: the first `most`, then how many more."""
    shown = ", ".join(str(r) for r in regions[:most])
    return shown + (f" and {len(regions) - most} more" if len(regions) > most else "")


class ReportInputError(InputError):
    """A results document that cannot be read: not JSON, another schema, a key missing.

    Give `report` / `compare` a results.json written by this harness (schema version 1).
    """


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM while a command runs: both take KeyboardInterrupt's path, so the run
    stops the same way (the finished scenarios kept as a partial results.json)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class SanitizerError(HarnessError):
    """`harness.sanitizer` cannot watch as asked (one already watching, say)."""


class RacesFound(SanitizerError):
    """`harness.sanitizer` with `raise_on_race=True` saw unordered accesses; the message lists them."""

    def __init__(self, report: str, races: list):
        super().__init__(report)
        self.races = races
