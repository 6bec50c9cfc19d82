"""SGLang's own load-back bookkeeping and full-graph fence, driven by the harness.

What is the engine's, and what is the harness's:

- engine: `LayerDoneCounter` (the ring of 3 event sets, producer advance with its
  reuse assertion, the consumer index, `wait_until`) and `LayerLoadingEvent`
  (`start_event`, per-layer `complete`, `wait`, `finish_event`) from
  `sglang/srt/managers/cache_controller.py`, and the fence
  `PrefillCudaGraphRunner._wait_for_layer_loads` from
  `sglang/srt/model_executor/runner/prefill_cuda_graph_runner.py`, called
  unchanged on the smallest stand-in for the runner it needs (`_is_full_backend`
  and `model_runner.token_to_kv_pool.layer_transfer_counter`).
- harness: the model, pools and their accessors (whose waits call the engine
  counter's `wait_until`), the copies, faults, runners and oracle.

The engine module's `device_module` is pointed at the harness's device, so its
events and waits are the harness's: real CUDA events on a GPU, the simulator's
on the CPU.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import ModuleType, SimpleNamespace
from typing import Any

from harness.engines.engine import Engine
from harness.records.errors import InputError
from harness.records.scenario import Backend

CONTROLLER = "sglang.srt.managers.cache_controller"
RUNNER = "sglang.srt.model_executor.runner.prefill_cuda_graph_runner"
# What the adapter uses, by module: the names must exist or the adapter refuses to run.
NEEDED = {
    CONTROLLER: ("LayerDoneCounter", "LayerLoadingEvent", "device_module"),
    RUNNER: ("PrefillCudaGraphRunner", "PrefillCudaGraphRunner._wait_for_layer_loads"),
}
INSTALL = "make test-engine, or: pip install '.[sglang]' && pip install --no-deps sglang==0.5.23"


@dataclass(frozen=True)
class Sglang:
    version: str
    # Any: sglang has no types here (it may not even be installed); load() checks every name used
    controller: Any  # the CONTROLLER module: bind() sets its device_module
    runner_cls: type[Any]

    def counter(self, dev, num_layers: int):
        """The engine's own LayerDoneCounter, its events made on the harness's device."""
        self.bind(dev)
        return self.controller.LayerDoneCounter(num_layers)

    def bind(self, dev) -> None:
        # LayerLoadingEvent reads the module-level device_module when it makes events and
        # when it waits: point it at this device (one scenario runs at a time).
        self.controller.device_module = DeviceModule(dev)

    def wait_for_layer_loads(self, stand_in) -> None:
        self.runner_cls._wait_for_layer_loads(stand_in)


class DeviceModule:
    """The part of a torch device module that the engine's load-back events use."""

    def __init__(self, dev):
        self.dev = dev

    def Event(self, *args, **kwargs):  # noqa: N802 - mirrors torch.cuda.Event
        return self.dev.Event()

    def current_stream(self, *args):
        return self.dev.current_stream()

    def stream(self, s):
        return self.dev.stream(s)


@functools.lru_cache(maxsize=1)
def load(source: str = "engine", key: str = "engine") -> Sglang:
    """Import the engine and check every name the adapter needs; InputError (exit 2) if not."""
    import importlib

    try:
        import sglang
    except ImportError as e:
        raise InputError(source, key, f"engine 'sglang' is not importable here ({e}); install it: {INSTALL}") from None
    version = getattr(sglang, "__version__", "unknown")
    modules = {}
    for name in NEEDED:
        try:
            modules[name] = importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - any import failure is the same answer
            raise InputError(source, key, f"sglang {version}: cannot import {name} ({type(e).__name__}: {e})") from None
    missing = [f"{mod.rsplit('.', 1)[-1]}.{attr}" for mod, attrs in NEEDED.items() for attr in attrs
               if _lookup(modules[mod], attr) is None]
    if missing:
        raise InputError(source, key, f"sglang {version} has no {', '.join(missing)}; the adapter needs them "
                                      "(it was written against sglang 0.5.23)")
    return Sglang(version, modules[CONTROLLER], modules[RUNNER].PrefillCudaGraphRunner)


def _lookup(module: ModuleType, dotted: str):
    obj: object = module
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def stand_in_runner(full_backend: bool, counter) -> SimpleNamespace:
    """The smallest object `_wait_for_layer_loads` runs on."""
    pool = SimpleNamespace(layer_transfer_counter=counter)
    return SimpleNamespace(_is_full_backend=full_backend, model_runner=SimpleNamespace(token_to_kv_pool=pool))


def engine_fence(ctx) -> None:
    """The engine's own fence, `PrefillCudaGraphRunner._wait_for_layer_loads`, before replay."""
    load().wait_for_layer_loads(stand_in_runner(ctx.runner.backend is Backend.FULL, ctx.counter))


def _reverted(self) -> None:
    """`_wait_for_layer_loads` as it was before the fix: nothing."""


def engine_reverted_fence(ctx) -> None:
    """The same call with the engine's fence replaced by a no-op (the fix reverted)."""
    load()
    _reverted(stand_in_runner(ctx.runner.backend is Backend.FULL, ctx.counter))


ENGINE = Engine("sglang", load, {"engine": engine_fence, "engine_reverted": engine_reverted_fence})
