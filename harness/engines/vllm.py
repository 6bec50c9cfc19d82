"""vLLM's own KV-connector contract, driven by the harness: the attention layer's connector hooks and
VllmConfig's cudagraph-mode decision, on the installed release.

Whatever release is installed, the adapter calls its code by name and never asks which release it
is: whether a connector that declares `requires_piecewise_for_cudagraph` gets a piecewise graph is
decided by the release's own `VllmConfig.__post_init__` (0.17.0 downgrades FULL to PIECEWISE for it,
vllm-project/vllm#31057; 0.16.0 has no such check), not by the adapter.

- `VllmConfig` / `CompilationConfig` / `KVTransferConfig` (`vllm/config/`): one whole VllmConfig per
  scenario, built with no model, FULL cudagraph mode asked for and the scenario's connector named by
  module path; the mode it settles on is vLLM's decision. vLLM reads the platform for it
  (`current_platform.support_static_graph_mode()`): the harness's device is set as vLLM's current
  platform, an out-of-tree `Platform` that captures graphs (`HarnessPlatform`), the moment
  `vllm.platforms` is imported, before any other module of vLLM binds it: on a CUDA host vLLM would
  otherwise resolve its own CUDA platform, which imports its compiled ops. The same platform on the
  simulator and on a GPU; a module that holds another is refused loudly (`check_platform`).
- the worker's connector: made by vLLM's own `ensure_kv_transfer_initialized` (its
  `KVConnectorFactory` imports the connector by module path), handed the KV caches with
  `register_kv_caches`, its metadata bound and its `start_load_kv` called inside the engine's own
  `set_forward_context`, as the model runner's connector mixin does before the forward
  (`harness.engines.vllm_load`).
- the attention layer's hooks: vLLM's own `unified_attention`
  (`vllm/model_executor/layers/attention/attention.py`), whose `maybe_transfer_kv_layer` decorator
  calls the connector's `wait_for_layer_load(layer_name)` before the attention kernel and
  `save_kv_layer(layer_name, kv_cache, attn_metadata)` after it, reading the forward context
  (`harness.engines.vllm_pools`). The attention kernel is the harness's.

Each module of `NEEDED` must import and have the names listed; otherwise the adapter refuses to run
with one line naming what is missing and the version found.
"""

from __future__ import annotations

import functools
import importlib
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from harness.engines.engine import import_engine, lookup
from harness.records.errors import InputError

if TYPE_CHECKING:
    from harness.devices.base import Device, Stream
    from harness.engines.engine import EngineLoader
    from harness.protocol.counter import LoadCounter
    from harness.protocol.layout import Layout
    from harness.protocol.pools import HostPool, HybridPool
    from harness.protocol.writeback import HostBackup, TransferPolicy, WriteBack

PLATFORMS = "vllm.platforms"
PLATFORM = "vllm.platforms.interface"
CONFIG = "vllm.config"
COMPILATION = "vllm.config.compilation"
CONNECTOR = "vllm.distributed.kv_transfer.kv_connector.v1.base"
TRANSFER = "vllm.distributed.kv_transfer.kv_transfer_state"
FORWARD = "vllm.forward_context"
ATTENTION = "vllm.model_executor.layers.attention.attention"
# Where a release keeps the attention layer's module: 0.16.0 on under `model_executor`, 0.13.0 and
# 0.14.0 as `vllm.attention.layer`. The first that imports stands under ATTENTION's key.
ATTENTION_AT = (ATTENTION, "vllm.attention.layer")

NEEDED = {
    PLATFORMS: (),
    PLATFORM: ("Platform", "PlatformEnum.OOT"),
    CONFIG: ("VllmConfig", "CompilationConfig", "KVTransferConfig", "CacheConfig"),
    COMPILATION: ("CUDAGraphMode.FULL", "CUDAGraphMode.PIECEWISE", "CompilationMode.VLLM_COMPILE"),
    CONNECTOR: ("KVConnectorBase_V1.wait_for_layer_load", "KVConnectorBase_V1.save_kv_layer",
                "KVConnectorBase_V1.start_load_kv", "KVConnectorBase_V1.bind_connector_metadata",
                "KVConnectorMetadata", "KVConnectorRole.WORKER"),
    TRANSFER: ("ensure_kv_transfer_initialized", "ensure_kv_transfer_shutdown", "get_kv_transfer_group"),
    FORWARD: ("set_forward_context", "get_forward_context"),
    ATTENTION: ("unified_attention", "Attention.get_attn_backend", "AttentionBackend.get_kv_cache_shape"),
}
INSTALL = ("make engine-matrix (vllm 0.16.0 and 0.17.0, each in .engines/vllm-VERSION), or: "
           "pip install --no-deps vllm==0.17.0 beside the .[vllm] extra")

# The connectors whose offloading worker a write-back hazard's store can run through (a scenario's
# `connector`; the first is the default): OffloadingConnector's handlers (`harness.engines.vllm_offload`)
# and SimpleCPUOffloadConnector's worker (`harness.engines.vllm_simple_offload`, 0.19.0 on).
WRITEBACK_CONNECTORS = ("OffloadingConnector", "SimpleCPUOffloadConnector")

# What the scenario's graph mode asks vLLM for, and what it may settle on, as the harness's runners.
FULL, PIECEWISE = "FULL", "PIECEWISE"
# The KV cache's block, in tokens: one slot, as the harness's caches are laid out (`harness.engines.vllm_pools`).
BLOCK_SIZE = 1


@dataclass(frozen=True)
class Vllm:
    version: str
    modules: dict[str, Any]  # Any: vllm has no types here (it may not even be installed)
    # Why the connector contract's modules (`NEEDED`) cannot be used on this release, or None: a
    # part that needs them says so when it is used (`module`), so the offloading worker's parts run
    # where the contract does not (0.27.0 on in the .[vllm] extra: its vllm.config needs Transformers 5).
    contract_error: InputError | None = None

    def counter(self, dev: Device, num_layers: int) -> LoadCounter:
        """The connector's load events: vLLM has no counter of its own (a connector keeps its own
        events); the harness's ring stands for them, and the harness's connector waits through it."""
        from harness.protocol.loadback import LayerDoneCounter

        return LayerDoneCounter(dev, num_layers)

    def pools(self, dev: Device, layout: Layout) -> HybridPool:
        """The KV caches vLLM hands a connector (one tensor a layer, K and V stacked), their reads
        inside vLLM's own attention entry point."""
        from harness.engines.vllm_pools import VllmPools  # torch: not at the command line's start

        return VllmPools(self, dev, layout)

    def loader(self, dev: Device, layout: Layout, pools: HybridPool, host: HostPool) -> EngineLoader | None:
        """The worker's connector, made by vLLM from a VllmConfig: its `start_load_kv` starts each
        load op (`harness.engines.vllm_load`). None on a release whose connector contract is not
        usable here (`contract_error`): the harness's own load op stands in, the attention runs with no
        connector, and the contract's fences say why they cannot run."""
        from harness.engines.vllm_load import VllmLoad
        from harness.engines.vllm_pools import VllmPools

        if self.contract_error is not None:
            return None

        if not isinstance(pools, VllmPools):
            raise TypeError(f"the connector loads into vLLM's KV caches, not {type(pools).__name__}")
        return VllmLoad(self, dev, layout, pools, host)

    def writeback(self, dev: Device, layout: Layout, pools: HybridPool, forward: Stream,
                  host: HostBackup, connector: str | None = None) -> WriteBack:
        """The write-back through a vLLM connector's own offloading worker: OffloadingConnector's (the
        default: its handlers, `harness.engines.vllm_offload`, or from 0.27.0, where the release has
        `kv_offload/cpu/gpu_worker.py`, its `CPUOffloadingWorker`, `harness.engines.vllm_worker_store`)
        or SimpleCPUOffloadConnector's worker (`harness.engines.vllm_simple_offload`); vLLM decides the
        stream and the waits of each store."""
        if connector == "SimpleCPUOffloadConnector":
            from harness.engines import vllm_scheduler, vllm_simple_offload

            names = getattr(pools, "names", {})
            self.modules.update(import_needed(self.version, {**vllm_simple_offload.NEEDED,
                                                              vllm_scheduler.KV_CACHE: vllm_scheduler.NEEDED[
                                                                  vllm_scheduler.KV_CACHE]}))
            config = vllm_scheduler.kv_cache_config(self, layout, names, BLOCK_SIZE)
            return vllm_simple_offload.VllmSimpleOffload(self, dev, layout, pools, forward, host, config)
        from harness.engines import vllm_offload, vllm_offload_load

        if vllm_offload_load.available():  # 0.27.0 on: the OffloadingConnector's worker is CPUOffloadingWorker
            from harness.engines import vllm_worker_store

            self.modules.update(import_needed(self.version, vllm_worker_store.NEEDED))
            return vllm_worker_store.VllmWorkerStore(self, dev, layout, pools, forward, host)
        self.modules.update(import_needed(self.version, vllm_offload.NEEDED))
        return vllm_offload.VllmOffload(self, dev, layout, pools, forward, host)

    def offload_loader(self, dev: Device, layout: Layout, pools: HybridPool, host: HostPool,
                       policy: TransferPolicy) -> EngineLoader:
        """The batch's load through vLLM's own CPU offloading worker (`CPUOffloadingWorker.submit_load`,
        0.27.0 on: `harness.engines.vllm_offload_load`), for a hazard whose load is an offloaded
        prefix loaded back into freshly allocated blocks (`load_before_zeroing`)."""
        from harness.engines import vllm_offload_load

        self.modules.update(import_needed(self.version, vllm_offload_load.NEEDED))
        return vllm_offload_load.make(self, dev, layout, pools, host, policy)

    # ---- what the adapter's modules reach through it ------------------------------------------
    # The KV cache's block, in tokens (`BLOCK_SIZE`), for the modules that build vLLM's configs.
    block_size = BLOCK_SIZE

    def require(self, needed: dict[str, tuple[str, ...]]) -> None:
        """`needed`'s modules imported, checked (`import_needed`) and kept for `module`."""
        self.modules.update(import_needed(self.version, needed))

    def module(self, name: str) -> Any:
        """One of the modules imported and checked so far (`NEEDED`'s by `load()`, others by the part
        that needs them); InputError (exit 2) naming why where the connector contract is not usable."""
        if name not in self.modules and name in NEEDED and self.contract_error is not None:
            raise self.contract_error
        return self.modules[name]

    def connector_config(self, connector: type, extra_config: dict[str, Any]) -> Any:
        return connector_config(self, connector, extra_config)

    def decided_mode(self, config: Any) -> str:
        return decided_mode(config)


@functools.lru_cache(maxsize=1)
def load(source: str = "engine", key: str = "engine") -> Vllm:
    """Import the engine (InputError, exit 2, if it is not importable), vLLM's platform first (the
    harness's set as it imports: `install_platform`), and check every name the connector contract
    needs: where one is missing, the parts that need them fail with that InputError when used, and
    the others (the offloading worker's) run. A module of vLLM holding another platform is an
    InputError too (`check_platform`)."""
    from harness.records.errors import EngineContractBroken

    version, modules = import_engine("vllm", {PLATFORMS: ()}, INSTALL, source, key, importer=_import)
    missing: InputError | None = None
    contract: dict[str, Any] = {}
    try:
        _, contract = import_engine("vllm", NEEDED, INSTALL, source, key, importer=_import)
    except InputError as e:
        missing = e
    try:
        check_platform()
    except EngineContractBroken as e:
        raise InputError(source, key, f"vllm {version}: {e}") from None
    return Vllm(version, {**modules, **contract}, missing)


def import_needed(version: str, needed: dict[str, tuple[str, ...]]) -> dict[str, Any]:
    """`needed`'s modules, each checked for its names; EngineContractBroken naming what is missing."""
    from harness.records.errors import EngineContractBroken

    modules = {}
    for name, attrs in needed.items():
        try:
            modules[name] = _import(name)
        except Exception as e:  # noqa: BLE001 - any import failure is the same answer
            raise EngineContractBroken(f"vllm {version}: cannot import {name} ({type(e).__name__}: {e})") from None
        missing = [a for a in attrs if lookup(modules[name], a) is None]
        if missing:
            raise EngineContractBroken(f"vllm {version}'s {name} has no {', '.join(missing)}")
    return modules


def _import(name: str) -> ModuleType:
    """The module; for ATTENTION, the first of `ATTENTION_AT` the release has (a release without
    the newer package fails with ModuleNotFoundError naming it, and the next place is tried).
    `vllm.platforms` comes with the harness's platform already set (`install_platform`)."""
    places = ATTENTION_AT if name == ATTENTION else (name,)
    for at in places[:-1]:
        try:
            return importlib.import_module(at)
        except ModuleNotFoundError as e:
            if not e.name or not at.startswith(e.name):
                raise
    module = importlib.import_module(places[-1])
    if name == PLATFORMS:
        install_platform(module)
    return module


_platform: Any = None


def harness_platform(iface: ModuleType) -> Any:
    """The simulator (or the harness's CUDA device) as vLLM's current platform: an out-of-tree
    platform that captures graphs, so VllmConfig takes its graph-mode branch as on a GPU, and that
    is CUDA-alike, as the GPU the harness's device stands for is (vLLM's CPU offloading refuses any
    other platform: `CPUOffloadingSpec.get_handlers`) (`iface`: `vllm.platforms.interface`). The
    same platform on both devices, so vLLM takes the same branches on a GPU as on the simulator."""
    global _platform
    if _platform is not None:
        return _platform
    base: Any = iface.Platform

    class HarnessPlatform(base):
        _enum = iface.PlatformEnum.OOT
        device_name = "cpu"
        device_type = "cpu"

        @classmethod
        def support_static_graph_mode(cls) -> bool:
            return True

        def is_cuda_alike(self) -> bool:
            return True

    _platform = HarnessPlatform()
    return _platform


def install_platform(platforms: ModuleType) -> None:
    """The harness's platform as vLLM's current one, set as soon as `vllm.platforms` is imported and
    before any other module of vLLM reads it (most bind `current_platform` when they are imported).
    Left to itself, vLLM resolves its platform on the first read, and on a CUDA host (NVML sees a
    GPU) that imports `vllm.platforms.cuda`, whose first line imports the compiled `vllm._C`: absent
    from a pack, and built for another torch anyway. A platform vLLM resolved before this ran is
    refused (EngineContractBroken, naming it) unless it is vLLM's "no device found" one, the one a
    CPU host resolves."""
    from harness.records.errors import EngineContractBroken

    iface = importlib.import_module(PLATFORM)
    ours = harness_platform(iface)
    resolved = platforms.__dict__.get("_current_platform")
    if resolved is not None and resolved is not ours and not isinstance(resolved, iface.UnspecifiedPlatform):
        raise EngineContractBroken(f"vLLM resolved its own platform ({type(resolved).__name__}) before the "
                                   "harness's was set; import vLLM through harness.engines.vllm.load()")
    setattr(platforms, "_current_platform", ours)  # noqa: B010 - what vllm.platforms.__getattr__ answers
    setattr(platforms, "current_platform", ours)  # noqa: B010 - what `from vllm.platforms import` binds
    if resolved is None or resolved is ours:
        return
    # A module imported before (on a CPU host, bound to the "no device found" platform) sees what it
    # would have bound had the harness's platform been there first: vLLM's CPU offloading, say, asks
    # its module's platform whether it is CUDA-alike.
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("vllm.") and vars(module).get("current_platform") is resolved:
            setattr(module, "current_platform", ours)  # noqa: B010 - a module of vLLM's, not typed here


def check_platform() -> None:
    """Every module of vLLM imported so far holds the harness's platform, or vLLM's "no device found"
    one (bound on a CPU host by a module imported before the adapter loaded). One that holds another
    (vLLM's CUDA platform, resolved on a GPU host before the harness's was set), or vLLM's CUDA
    platform module imported at all, is an EngineContractBroken naming it: never a run on vLLM's
    CUDA code paths with its compiled ops missing."""
    from harness.records.errors import EngineContractBroken

    if _platform is None:
        return
    iface = sys.modules.get(PLATFORM)
    unspecified = getattr(iface, "UnspecifiedPlatform", ())
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] != "vllm" or module is None:
            continue
        if name == "vllm.platforms.cuda":
            raise EngineContractBroken("vLLM imported its CUDA platform (vllm.platforms.cuda), which needs its "
                                       "compiled ops; the harness's platform stands for it")
        held = getattr(module, "__dict__", {}).get("current_platform")
        if held is not None and held is not _platform and not isinstance(held, unspecified):
            raise EngineContractBroken(f"vLLM's {name} holds the platform {type(held).__name__}, not the harness's "
                                       "(vLLM resolved its own before the harness's was set)")


def use_harness_platform(engine: Vllm) -> None:
    """vLLM's current platform is the harness's (`install_platform` set it at import; set again where
    a test or a check set another since), and no module of vLLM holds another (`check_platform`)."""
    install_platform(engine.module(PLATFORMS))
    check_platform()




def connector_config(engine: Vllm, connector: type, extra_config: dict[str, Any], mode: str = FULL) -> Any:
    """A whole VllmConfig with no model: `mode` asked for (FULL), `connector` named by module path
    for both roles, the cache's block size the harness's (what a model's config would set, and a
    connector's spec reads); `compilation_config.cudagraph_mode` is then vLLM's decision."""
    use_harness_platform(engine)
    cfg, comp = engine.module(CONFIG), engine.module(COMPILATION)
    kv = cfg.KVTransferConfig(kv_connector=connector.__name__, kv_connector_module_path=connector.__module__,
                              kv_role="kv_both", kv_connector_extra_config=dict(extra_config))
    compilation = cfg.CompilationConfig(cudagraph_mode=getattr(comp.CUDAGraphMode, mode),
                                        mode=comp.CompilationMode.VLLM_COMPILE)
    return cfg.VllmConfig(compilation_config=compilation, kv_transfer_config=kv,
                          cache_config=cfg.CacheConfig(block_size=BLOCK_SIZE))


def decided_mode(config: Any) -> str:
    """The cudagraph mode a VllmConfig settled on, by name (FULL, PIECEWISE, ...)."""
    return str(config.compilation_config.cudagraph_mode.name)
