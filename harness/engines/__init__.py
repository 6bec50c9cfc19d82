"""Adapters that run a serving engine's own load-back bookkeeping and fence under the harness.

`sglang`: the engine's `LayerDoneCounter` / `LayerLoadingEvent` and
`PrefillCudaGraphRunner._wait_for_layer_loads` (see `harness.engines.sglang`).
"""

ENGINES = ("sglang",)
