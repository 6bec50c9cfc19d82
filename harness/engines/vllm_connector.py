"""A connector on vLLM's V1 connector API (a subclass of vLLM's own `KVConnectorBase_V1`) that loads
layer by layer on the harness's load stream, behind the harness's faults.

vLLM imports it by module path (`KVTransferConfig.kv_connector_module_path`) and makes the worker's
instance itself (`KVConnectorFactory.create_connector`). What it does on the worker side:

- `start_load_kv(forward_context)`: with the metadata vLLM bound (`LoadRequest`: the replay's fault,
  gate and layer listeners), starts one load op through the harness's `Transfer`: the start event on
  the scheduling (forward) stream, then on the load stream each layer's copies and its load event.
- `wait_for_layer_load(layer_name)`: the current stream waits on that layer's load event (nothing
  while no load is pending, and so nothing while a graph is captured).
- `save_kv_layer(...)`: counted, no device work (the store side is not under test here).
- `requires_piecewise_for_cudagraph(extra_config)`: `extra_config["requires_piecewise"]`, False
  unless set; the declaration vLLM's VllmConfig reads (0.17.0 on).

The scheduler side answers that nothing is cached, so nothing would be scheduled to load: the harness
starts each load op itself, with the metadata it binds. This module imports vLLM: only vLLM's factory
and the adapter's own modules import it, once vLLM is known importable.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata

from harness.devices.base import Device, Gate, Stream
from harness.faults.plan import FaultPlan
from harness.protocol.counter import LoadCounter
from harness.protocol.layout import Layout
from harness.protocol.loadback import CopyPlan
from harness.protocol.schedules import LayerListener, LoadOp, layerwise, start_loading
from harness.records.errors import EngineContractBroken


@dataclass
class LoadRequest(KVConnectorMetadata):
    """What the harness binds as the connector's metadata for one forward: one load op to start."""

    fault: FaultPlan
    gate: Gate | None = None
    listeners: Sequence[LayerListener] = ()


@dataclass
class Transfer:
    """The harness's copy primitive, as a connector reaches it: the device, the load stream, the load
    events' ring, each layer's planned copies, and the layer names vLLM calls the hooks with."""

    dev: Device
    stream: Stream
    counter: LoadCounter
    copies: CopyPlan
    layout: Layout
    layer_ids: dict[str, int]  # vLLM's layer name -> the harness's global layer id
    last_op: LoadOp | None = None
    started: int = 0
    waits: int = 0
    saves: int = 0
    hooks: list[str] = field(default_factory=list)  # the hooks' calls in order, kept for one forward

    def start(self, request: LoadRequest) -> LoadOp:
        """One load op, started on the current (scheduling) stream, copies on the load stream."""
        self.last_op = start_loading(self.dev, self.counter, self.stream, self.copies, request.fault, self.layout,
                                     layerwise, request.gate, request.listeners)
        self.started += 1
        return self.last_op

    def layer(self, layer_name: str) -> int:
        if layer_name not in self.layer_ids:
            raise EngineContractBroken(f"vLLM called the connector with layer {layer_name!r}, which the harness "
                                       "did not register")
        return self.layer_ids[layer_name]

    def wait(self, layer_name: str) -> None:
        """The current stream waits on the pending load op's event for the layer."""
        self.waits += 1
        self.counter.wait_until(self.layer(layer_name))


_transfer: Transfer | None = None


def bind_transfer(transfer: Transfer | None) -> None:
    """The transfer the next connector vLLM makes will load through (one scenario at a time)."""
    global _transfer
    _transfer = transfer


def current_transfer() -> Transfer:
    if _transfer is None:
        raise EngineContractBroken("a harness connector was made with no transfer bound "
                                   "(vLLM made it outside the harness's scenario)")
    return _transfer


class LayerwiseConnector(KVConnectorBase_V1):
    """Loads layer by layer on the harness's load stream; waits per layer in `wait_for_layer_load`."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None):
        super().__init__(vllm_config, role, kv_cache_config)
        self.transfer = current_transfer() if role.name == "WORKER" else None
        self.kv_caches: dict[str, Any] = {}

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        return bool(extra_config.get("requires_piecewise", False))

    # ---- worker side ---------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        self.kv_caches = dict(kv_caches)

    def _worker(self) -> Transfer:
        if self.transfer is None:
            raise EngineContractBroken("a worker hook was called on the scheduler's connector")
        return self.transfer

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        request = self._get_connector_metadata()
        if not isinstance(request, LoadRequest):
            raise EngineContractBroken(f"the connector's metadata is a {type(request).__name__}, not a LoadRequest")
        t = self._worker()
        t.hooks.append("start_load_kv")
        t.start(request)

    def wait_for_layer_load(self, layer_name: str) -> None:
        t = self._worker()
        t.hooks.append(f"wait_for_layer_load:{layer_name}")
        t.wait(layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        t = self._worker()
        t.hooks.append(f"save_kv_layer:{layer_name}")
        t.saves += 1

    def wait_for_save(self) -> None:
        """Nothing is stored, so nothing to wait for."""

    # ---- scheduler side: nothing cached, nothing to schedule -----------------------------
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        return 0, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        return None

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return KVConnectorMetadata()
