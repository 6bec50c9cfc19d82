"""Adapters that run a serving engine's own code under the harness, chosen by name.

`sglang`: the installed release's own `PrefillCudaGraphRunner.execute` around the
harness's graph, its `LayerDoneCounter` / `LayerLoadingEvent` (see `harness.engines.sglang`
and `harness.engines.sglang_execute`).
`vllm`: the installed release's own attention-layer connector hooks (`unified_attention`) and
VllmConfig's FULL-to-PIECEWISE decision for a KV connector, around the harness's model, and its
CPU offloading worker's stores and loads (see `harness.engines.vllm`, `harness.engines.vllm_graphs`,
`harness.engines.vllm_offload`, `harness.engines.vllm_offload_load`).
A scenario picks one with `engine = "NAME"`; its fences are then named like any other.
"""

from __future__ import annotations

from harness.engines import sglang, sglang_execute, vllm, vllm_fences
from harness.engines.engine import Adapter, Engine
from harness.records.errors import InputError

ENGINES: dict[str, Engine] = {
    e.name: e for e in (Engine("sglang", sglang.load, sglang_execute.FENCES),
                        Engine("vllm", vllm.load, vllm_fences.FENCES))
}


def engine_named(name: str, source: str = "engine", key: str = "engine") -> Engine:
    if name not in ENGINES:
        raise InputError(source, key, f"unknown engine {name!r}; valid: {', '.join(ENGINES)}")
    return ENGINES[name]


def load_engine(name: str, source: str = "engine", key: str = "engine") -> Adapter:
    """The engine's adapter, loaded; InputError (exit 2) when it cannot be used here."""
    return engine_named(name, source, key).load(source, key)


def engine_of_fence(fence: str) -> Engine | None:
    """The engine a fence name belongs to, or None for the harness's own fences."""
    return next((e for e in ENGINES.values() if fence in e.fences), None)


__all__ = ["ENGINES", "Adapter", "Engine", "engine_named", "engine_of_fence", "load_engine"]
