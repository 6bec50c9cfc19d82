"""SGLang's own prefill replay entry point, load-back bookkeeping and pools, driven by the harness.

Whatever release is installed, the adapter runs its code by name and never asks which
release it is: the fix under test (0.5.23's wait before replay) is found, or missed, by
the release's own `PrefillCudaGraphRunner.execute`, not by the adapter.

- `LayerDoneCounter` / `LayerLoadingEvent` (`sglang/srt/managers/cache_controller.py`):
  the load-event ring the pools' accessors wait through; its events are made on the
  harness's device (the module's `device_module` is pointed at it).
- the device pools (`MHATokenToKVPool`, `HybridLinearKVPool`, `HybridReqToTokenPool` with
  its `MambaPool`, `sglang/srt/mem_cache/memory_pool.py`): the model's KV and Mamba state
  and their waiting accessors (`harness.engines.sglang_pools`).
- the load chain (`HiCacheController.load` / `start_loading`, `L2TransferEngine`,
  `MHATokenToKVPoolHost`) for attention-only models (`harness.engines.sglang_load`), and
  for models with Mamba layers `HybridCacheController` over a `HostPoolGroup` of
  `MHATokenToKVPoolHost` and `MambaPoolHost` (`harness.engines.sglang_hybrid_load`); the
  copy kernel the harness's.
- `PrefillCudaGraphRunner.execute` (`.../model_executor/runner/prefill_cuda_graph_runner.py`),
  called unbound on an instance of the engine's own class made without `__init__`, so
  every `self.method` it calls is that release's; its body replay is the engine's own
  `FullCudaGraphBackend.replay`, which replays the harness's captured graph
  (`harness.engines.sglang_execute`).

Each module of `NEEDED` must import and have the names listed; otherwise the adapter
refuses to run with one line naming what is missing and the version found.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harness.engines.engine import import_engine

if TYPE_CHECKING:
    from harness.devices.base import Device
    from harness.engines.engine import EngineLoader
    from harness.protocol.counter import LoadCounter
    from harness.protocol.layout import Layout
    from harness.protocol.pools import HostPool, HybridPool

CONTROLLER = "sglang.srt.managers.cache_controller"
RUNNER = "sglang.srt.model_executor.runner.prefill_cuda_graph_runner"
BACKEND = "sglang.srt.model_executor.runner_backend.full_cuda_graph_backend"
BATCH = "sglang.srt.model_executor.forward_batch_info"
SPEC = "sglang.srt.speculative.spec_info"
ATTENTION = "sglang.srt.layers.attention.base_attn_backend"
# The engine's own test helper that publishes a process's runtime configuration (the
# releases that read one in `execute` have it; one that has none publishes nothing).
TEST_UTILS = "sglang.test.test_utils"
MEMORY = "sglang.srt.mem_cache.memory_pool"
MAMBA = "sglang.srt.configs.mamba_utils"
TRANSFER = "sglang.srt.mem_cache.l2_transfer"
HOST_MHA = "sglang.srt.mem_cache.pool_host.mha"
# The hybrid chain (models with Mamba layers): its controller, host pools, their group and
# entries, and the transfer record of a side pool.
HYBRID = "sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller"
ASSEMBLER = "sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler"
HOST_GROUP = "sglang.srt.mem_cache.pool_host"
HOST_MAMBA = "sglang.srt.mem_cache.pool_host.mamba"
STORAGE = "sglang.srt.mem_cache.hicache_storage"

# What the adapter uses, by module: the names must exist or the adapter refuses to run.
NEEDED = {
    CONTROLLER: ("LayerDoneCounter", "LayerLoadingEvent", "device_module", "HiCacheController.load",
                 "HiCacheController.start_loading"),
    RUNNER: ("PrefillCudaGraphRunner.execute", "PrefillCudaGraphRunner.load_batch",
             "PrefillCudaGraphRunner._shape_key", "LogitsProcessorOutput", "Backend.FULL"),
    BACKEND: ("FullCudaGraphBackend.replay", "FullCudaGraphBackend.replay_session"),
    BATCH: ("ForwardBatch", "ForwardMode.EXTEND", "CaptureHiddenMode.NULL"),
    SPEC: ("SpeculativeAlgorithm.NONE",),
    ATTENTION: ("AttentionBackend",),
    MEMORY: ("MHATokenToKVPool.get_key_buffer", "MHATokenToKVPool.get_value_buffer", "HybridLinearKVPool",
             "HybridReqToTokenPool.mamba2_layer_cache", "MambaPool.mamba2_layer_cache"),
    MAMBA: ("Mamba2CacheParams", "Mamba2StateShape", "Mamba2StateDType"),
    TRANSFER: ("L2TransferEngine.submit_host_to_device", "device_module"),
    HOST_MHA: ("MHATokenToKVPoolHost.load_to_device_per_layer",),
    HYBRID: ("HybridCacheController.load", "HybridCacheController.start_loading"),
    ASSEMBLER: ("build_pool_entry",),
    HOST_GROUP: ("HostPoolGroup",),
    HOST_MAMBA: ("MambaPoolHost.load_to_device_per_layer",),
    STORAGE: ("PoolTransfer", "PoolName.KV", "PoolName.MAMBA"),
}
INSTALL = "make test-engine, or: pip install '.[sglang]' && pip install --no-deps sglang==0.5.23"


@dataclass(frozen=True)
class Sglang:
    version: str
    # Any: sglang has no types here (it may not even be installed); load() checks every name used
    modules: dict[str, Any]

    @property
    def controller(self) -> Any:
        """The cache controller module: bind() sets its device_module."""
        return self.modules[CONTROLLER]

    @property
    def runner_cls(self) -> type[Any]:
        return self.modules[RUNNER].PrefillCudaGraphRunner

    def counter(self, dev: Device, num_layers: int) -> LoadCounter:
        """The engine's own LayerDoneCounter, its events made on the harness's device."""
        self.bind(dev)
        return self.controller.LayerDoneCounter(num_layers)

    def pools(self, dev: Device, layout: Layout) -> HybridPool:
        """The engine's own device pools for the layout, behind the harness's pool interface."""
        from harness.engines.sglang_pools import EnginePools  # torch: not at the command line's start

        return EnginePools(self.modules, dev, layout)

    def loader(self, dev: Device, layout: Layout, pools: HybridPool, host: HostPool) -> EngineLoader:
        """The engine's own load chain over its pools: `HiCacheController` for an attention-only
        model (`harness.engines.sglang_load`), `HybridCacheController` with the KV and Mamba
        host pools for a model with Mamba layers (`harness.engines.sglang_hybrid_load`)."""
        self.bind(dev)
        m = self.modules
        if layout.shape.mamba_layers:
            from harness.engines.sglang_hybrid_load import HybridLoad, Modules  # torch: not at start-up

            mods = Modules(m[CONTROLLER], m[TRANSFER], m[HOST_MHA], m[HOST_MAMBA], m[HYBRID], m[ASSEMBLER],
                           m[HOST_GROUP], m[STORAGE])
            return HybridLoad(mods, dev, layout, pools, host, self.controller.device_module)
        from harness.engines.sglang_load import EngineLoad  # torch: not at the command line's start
        from harness.engines.sglang_pools import EnginePools

        if not isinstance(pools, EnginePools):  # the chain copies into the engine's own pools alone
            raise TypeError(f"the engine's load chain needs the engine's own pools, not {type(pools).__name__}")
        return EngineLoad(m[CONTROLLER], m[TRANSFER], m[HOST_MHA], dev, layout, pools.engine_kv_pool, host,
                          self.controller.device_module)

    def bind(self, dev: Device) -> None:
        # LayerLoadingEvent reads the module-level device_module when it makes events and
        # when it waits: point it at this device (one scenario runs at a time).
        self.controller.device_module = DeviceModule(dev)


class DeviceModule:
    """The part of a torch device module that the engine's load-back code uses, on a harness device."""

    def __init__(self, dev):
        self.dev = dev

    def Event(self, *args, **kwargs):  # noqa: N802 - mirrors torch.cuda.Event
        return self.dev.Event(external=bool(kwargs.get("external", False)))

    def current_stream(self, *args):
        return self.dev.current_stream()

    def stream(self, s):
        return self.dev.stream(s)

    def Stream(self, *args, **kwargs):  # noqa: N802 - mirrors torch.cuda.Stream
        """A stream the engine makes: its transfer engine's, of which only host-to-device runs here."""
        return self.dev.Stream("load")


@functools.lru_cache(maxsize=1)
def load(source: str = "engine", key: str = "engine") -> Sglang:
    """Import the engine and check every name the adapter needs; InputError (exit 2) if not."""
    version, modules = import_engine("sglang", NEEDED, INSTALL, source, key)
    return Sglang(version, modules)

