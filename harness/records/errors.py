"""One root exception, with the specific kinds the CLI maps to exit codes.

Inner layers raise these; only the CLI prints them (one line, no traceback).
"""

from __future__ import annotations


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


class ReplayTimeout(HarnessError):
    """A replay, a load-back or a gate did not finish within its deadline."""

    exit_code = 1
