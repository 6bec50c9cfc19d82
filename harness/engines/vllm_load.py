"""The worker's KV connector, made by vLLM from a VllmConfig, starting each load op.

`configure(connector, extra_config)` builds one whole VllmConfig (FULL asked for, the connector named
by module path: `harness.engines.vllm.connector_config`, through the loaded adapter, which is passed in
and not imported here), reads the cudagraph mode vLLM settled on, and has vLLM make the worker's
connector (`ensure_kv_transfer_initialized`, after `ensure_kv_transfer_shutdown` of the previous
scenario's). The connector gets the KV caches
(`register_kv_caches`) and, for the harness's own connectors, the harness's `Transfer` (the load
stream, the load events, the planned copies).

A load op (`start`) is what vLLM's model runner does before the forward (its connector mixin):
`bind_connector_metadata(metadata)`, then `start_load_kv(get_forward_context())` inside the engine's
own `set_forward_context`. The metadata is the harness's `LoadRequest` (the replay's fault, gate and
listeners): the connector applies the fault on its load stream.

Until a fence configures another, the connector is the harness's `LayerwiseConnector` declaring
False (the ground truth's load, and scenarios whose fence is not vLLM's, use it).

A connector that is not the harness's (vLLM's own `OffloadingConnector`, a user's, through
`fence-harness connector-check`) gets what a real engine gives it instead
(`harness.engines.vllm_scheduler`): the model's `KVCacheConfig` for both roles, the scheduler's
connector beside the worker's, vLLM's offloading handlers on the harness device
(`harness.engines.vllm_handlers`), the batch's prefixes offloaded by earlier requests, and its
metadata built by its own scheduler side; a load op is then the connector's `start_load_kv` of
the batch's requests, and `before_forward` is the scheduler's decision of when their forward runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from harness.devices.base import Device, Event, Gate
from harness.engines.vllm_pools import FORWARD, VllmPools
from harness.faults.plan import FaultPlan
from harness.protocol.layout import Layout
from harness.protocol.loadback import plan_copies
from harness.protocol.pools import HostPool
from harness.protocol.schedules import LayerListener, LoadOp
from harness.records.errors import EngineContractBroken

TRANSFER = "vllm.distributed.kv_transfer.kv_transfer_state"

_current: VllmLoad | None = None


def current() -> VllmLoad:
    """This scenario's loader (the fences' way to it: one scenario runs at a time)."""
    if _current is None:
        raise EngineContractBroken("a vLLM fence ran in a scenario whose engine is not vllm")
    return _current


class VllmLoad:
    def __init__(self, engine: Any, dev: Device, layout: Layout, pools: VllmPools, host: HostPool):
        from harness.engines import vllm_connector as conn  # imports vLLM: only once it is known importable

        global _current
        self.engine, self.dev, self.layout, self.pools = engine, dev, layout, pools
        self.counter = engine.counter(dev, layout.shape.num_layers)
        self.stream = dev.Stream("load")
        self.transfer = conn.Transfer(dev, self.stream, self.counter, plan_copies(layout, host, pools), layout,
                                      {name: lid for lid, name in pools.names.items()})
        self.host = host
        self.connector: Any = None
        self.config: Any = None
        self.scheduler: Any = None  # vLLM's scheduler steps, for a connector that is not the harness's
        self.mode = ""
        self.configure(conn.LayerwiseConnector, {})
        _current = self

    def configure(self, connector: type, extra_config: dict[str, Any]) -> str:
        """The connector class vLLM is configured with, and the cudagraph mode vLLM settled on."""
        from harness.engines import vllm_connector as conn

        transfer = self.engine.module(TRANSFER)
        transfer.ensure_kv_transfer_shutdown()
        if self.scheduler is not None:
            self.scheduler.retire()
            self.scheduler = None
        self.config = self.engine.connector_config(connector, extra_config)
        self.mode = self.engine.decided_mode(self.config)
        self.pools.bind(self.config)
        if issubclass(connector, conn.LayerwiseConnector):
            conn.bind_transfer(self.transfer)
            try:
                transfer.ensure_kv_transfer_initialized(self.config)
            finally:
                conn.bind_transfer(None)
            self.connector = self._made(connector)
            self.connector.register_kv_caches(self.pools.registered)
        else:
            self._engine_connector(connector)
        return self.mode

    def _made(self, connector: type) -> Any:
        made: Any = self.engine.module(TRANSFER).get_kv_transfer_group()
        if not isinstance(made, connector):
            raise EngineContractBroken(f"vLLM made a {type(made).__name__}, not the {connector.__name__} "
                                       "it was configured with")
        return made

    def _engine_connector(self, connector: type) -> None:
        """A connector that is not the harness's, given what a real engine gives it (the module's text)."""
        from harness.engines import vllm_handlers, vllm_scheduler

        self.engine.require({**vllm_scheduler.NEEDED, **vllm_handlers.NEEDED})
        kv_config = vllm_scheduler.kv_cache_config(self.engine, self.layout, self.pools.names, self.engine.block_size)
        module = self.engine.module(vllm_handlers.CPU_GPU)
        names = self.pools.names
        handlers = vllm_handlers.HandlerDevice(
            self.dev, module, {names[lid]: (lid, self.pools.registered[names[lid]])
                               for lid in self.layout.shape.attention_layers})
        with handlers.patched():
            self.engine.module(TRANSFER).ensure_kv_transfer_initialized(self.config, kv_config)
            self.connector = self._made(connector)
            self.connector.register_kv_caches(self.pools.registered)
        self.scheduler = vllm_scheduler.VllmScheduler(self.engine, self.dev, self.layout, names, self.config,
                                                      kv_config, self.connector, handlers, self.counter,
                                                      self.pools.forward_context)
        self.scheduler.offload_prefixes(self.host, self.pools)

    def start(self, fault: FaultPlan, gate: Gate | None, listeners: Sequence[LayerListener]) -> LoadOp:
        from harness.engines import vllm_connector as conn

        if self.scheduler is not None:
            return self.scheduler.load(fault, gate, listeners, self.stream)
        started = self.transfer.started
        self.transfer.hooks.clear()
        self.connector.bind_connector_metadata(conn.LoadRequest(fault, gate, tuple(listeners)))
        fc = self.engine.module(FORWARD)
        with self.pools.forward_context():
            self.connector.start_load_kv(fc.get_forward_context())
        op = self.transfer.last_op
        if self.transfer.started != started + 1 or op is None:
            raise EngineContractBroken(f"the connector's start_load_kv started {self.transfer.started - started} "
                                       "load ops, not one")
        return op

    def before_forward(self, host_wait: Callable[[Event], None]) -> None:
        """Right before the batch's forward: vLLM's scheduler runs it once the connector's load lets
        it (a connector that is not the harness's; the harness's own loads in the forward's step)."""
        if self.scheduler is not None:
            self.scheduler.before_forward(host_wait)
