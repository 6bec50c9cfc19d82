"""The vLLM engine's fences, by name: the cudagraph-mode fences of its connector contract
(`harness.engines.vllm_graphs`) and the offloading load's (`vllm_offload_end`).

Kept apart from the modules that run them so that naming a fence imports neither torch nor vLLM.
"""

from __future__ import annotations

from typing import Any

from harness.engines import vllm_graphs


def vllm_offload_end(ctx: Any) -> None:
    """The forward stream waits on the end event vLLM recorded for the batch's offloading load: vLLM's
    scheduler runs the request once its load is reported finished (hazard load_before_zeroing)."""
    from harness.engines import vllm_offload_load

    vllm_offload_load.end_fence(ctx)


FENCES: dict[str, Any] = {**vllm_graphs.FENCES, "vllm_offload_end": vllm_offload_end}
