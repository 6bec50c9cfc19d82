"""vLLM's cudagraph-mode decision as the harness's runner: FULL is the harness's `full` runner (one
graph: no Python, so no connector hook, runs in a replay), PIECEWISE is `breakable` (graph segments
with the attention layers, and so vLLM's connector hooks around them, eager between them), as vLLM's
piecewise mode splits its graph at the attention ops.

The fences ask vLLM for FULL (the scenario's backend must be `full`) with the harness's
`LayerwiseConnector` declaring `requires_piecewise_for_cudagraph` False or True, and run what the
installed release's VllmConfig settled on:

- `vllm_layerwise`: declares False: FULL on every release.
- `vllm_layerwise_piecewise`: declares True: PIECEWISE where the release checks the declaration
  (0.17.0 on, vllm-project/vllm#31057), FULL where it does not (0.16.0).
- `vllm_layerwise_piecewise_nodowngrade`: declares True, and vLLM's decision is made but not taken:
  FULL on every release (teeth: the downgrade disabled must race).

`VllmGraphs(connector, extra_config)` is the same for any connector class (`fence-harness
connector-check`). Right before each forward it lets vLLM's scheduler decide when that forward runs
(`VllmLoad.before_forward`): for a connector that loads asynchronously, once its worker has
reported the load finished. `same_step=True` (the `vllm_check_full_same_step` mutant) runs the
forward in its load's own step whatever the connector answered, so only its hooks can order it.
"""

from __future__ import annotations

from typing import Any

from harness.engines import vllm as eng
from harness.records.errors import EngineContractBroken
from harness.records.scenario import Backend

RUNNER_OF = {eng.FULL: Backend.FULL, eng.PIECEWISE: Backend.BREAKABLE}


class VllmGraphs:
    """The runner of the mode vLLM's VllmConfig settles on for `connector` (None: the harness's
    `LayerwiseConnector`) with `extra_config`; `downgrade=False` keeps FULL whatever vLLM decided."""

    def __init__(self, connector: type | None, extra_config: dict[str, Any], *, downgrade: bool = True,
                 same_step: bool = False):
        self.connector, self.extra_config, self.downgrade = connector, dict(extra_config), downgrade
        self.same_step = same_step
        self.mode = ""  # what vLLM decided
        self.backend = Backend.FULL  # what runs
        self.runner: Any = None

    def setup(self, s: Any) -> None:
        from harness.engines import vllm_load

        eng.load().module(eng.CONFIG)  # the connector contract usable here, or the reason it is not

        if self.connector is None:
            from harness.engines.vllm_connector import LayerwiseConnector  # imports vLLM

            self.connector = LayerwiseConnector
        load = vllm_load.current()
        self.mode = load.configure(self.connector, self.extra_config)
        if load.scheduler is not None:
            load.scheduler.same_step = self.same_step
        if self.mode not in RUNNER_OF:
            raise EngineContractBroken(f"vLLM settled on cudagraph mode {self.mode}; the harness maps FULL and "
                                       "PIECEWISE only")
        self.backend = RUNNER_OF[self.mode] if self.downgrade else Backend.FULL
        if self.backend is not Backend.FULL:
            self.runner = s.runner(self.backend)

    def __call__(self, ctx: Any) -> Any:
        from harness.engines import vllm_load

        if ctx.runner.backend is not Backend.FULL:
            raise EngineContractBroken(f"the vLLM fences ask vLLM for FULL: the scenario's backend must be full, "
                                       f"not {ctx.runner.backend.value}")
        vllm_load.current().before_forward(ctx.host_wait)
        return self.runner  # None: the scenario's full graph


def _strategy(extra_config: dict[str, Any], downgrade: bool, description: str):
    def make() -> VllmGraphs:
        return VllmGraphs(None, extra_config, downgrade=downgrade)

    make.makes_strategy = True  # type: ignore[attr-defined]
    make.__doc__ = description
    return make


# The connector `fence-harness connector-check` checks (set by `checking`; None: the harness's own).
_checked: tuple[type | None, dict[str, Any]] = (None, {})


def checking(connector: type | None, extra_config: dict[str, Any] | None = None) -> None:
    """The connector the `vllm_check*` fences configure vLLM with (one check at a time)."""
    global _checked
    _checked = (connector, dict(extra_config or {}))


def _checked_strategy(downgrade: bool, description: str, same_step: bool = False):
    def make() -> VllmGraphs:
        return VllmGraphs(*_checked, downgrade=downgrade, same_step=same_step)

    make.makes_strategy = True  # type: ignore[attr-defined]
    make.__doc__ = description
    return make


FENCES = {
    "vllm_layerwise": _strategy(
        {"requires_piecewise": False}, True,
        "The installed vLLM's cudagraph mode for a layerwise connector declaring requires_piecewise_for_cudagraph "
        "False (FULL asked for; engine = \"vllm\")."),
    "vllm_layerwise_piecewise": _strategy(
        {"requires_piecewise": True}, True,
        "The installed vLLM's cudagraph mode for the same connector declaring True: PIECEWISE where VllmConfig "
        "checks the declaration (vllm-project/vllm#31057)."),
    "vllm_layerwise_piecewise_nodowngrade": _strategy(
        {"requires_piecewise": True}, False,
        "Mutant: the connector declares True and VllmConfig's decision is not taken (FULL whatever it said)."),
    "vllm_check": _checked_strategy(
        True, "The installed vLLM's cudagraph mode for the connector `fence-harness connector-check` checks."),
    "vllm_check_full": _checked_strategy(
        False, "A FULL graph for the connector `fence-harness connector-check` checks, whatever it declares."),
    "vllm_check_full_same_step": _checked_strategy(
        False, "Mutant: a FULL graph for the connector `fence-harness connector-check` checks, its forward run in "
        "its load's own step whatever its scheduler side answered (only its hooks can order the reads).", True),
}
