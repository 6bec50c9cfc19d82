"""Worked examples for `fence-harness connector-check`: V1 KV connectors built on the harness's
layerwise connector (`harness.engines.vllm_connector.LayerwiseConnector`), each with its declaration.

    fence-harness connector-check harness.examples.vllm_connectors:DeclaresFalse    # race, exit 1
    fence-harness connector-check harness.examples.vllm_connectors:DeclaresTrue     # honest (0.17.0 on)
    fence-harness connector-check harness.examples.vllm_connectors:NoWait           # race, exit 1
    fence-harness connector-check harness.examples.vllm_connectors:WaitsAtStart     # honest, at a cost

This module imports vLLM (a connector subclasses its `KVConnectorBase_V1`).
"""

from __future__ import annotations

from typing import Any

from harness.engines.vllm_connector import LayerwiseConnector


class DeclaresFalse(LayerwiseConnector):
    """Loads layer by layer and waits per layer, but says FULL is fine: it is not."""

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        return False


class DeclaresTrue(LayerwiseConnector):
    """The same connector, declaring that it needs PIECEWISE."""

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        return True


class NoWait(DeclaresTrue):
    """Declares True, but its wait_for_layer_load waits for nothing: no graph mode can save it."""

    def wait_for_layer_load(self, layer_name: str) -> None:
        self._worker().hooks.append(f"wait_for_layer_load:{layer_name}")


class WaitsAtStart(DeclaresTrue):
    """Makes the forward stream wait for the whole load in start_load_kv (before the forward is
    enqueued), so a FULL graph is ordered after every layer: its declaration of True costs a
    piecewise graph for nothing."""

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        super().start_load_kv(forward_context, **kwargs)
        op = self._worker().last_op
        assert op is not None
        op.finish_event.wait()  # the current (forward) stream waits on the last layer's event
