"""vLLM's CPU offloading handlers (`vllm/v1/kv_offload/worker/cpu_gpu.py`) on the harness device, for
a connector vLLM's factory made (its own `OffloadingConnector`, or any connector that moves KV
through those handlers).

The handlers are vLLM's code; what the harness supplies is what they reach of CUDA, patched into
the handler module only while one of the connector's calls runs (`patched()`):

- `ops.swap_blocks` (compiled, `torch.ops._C_cache_ops`): each run of consecutive block pairs of the
  mapping is one harness copy on the stream vLLM made current, with the device region and the host
  rows it touches: `dev.copy_to_host` for a store, `dev.copy_async` for a load. A load copy is also
  where the scenario's fault applies, as the harness's own load op applies it (`begin_load`: the
  gate held before the op's first copy, the delay once before each layer's first copy), and after
  a layer's copies the op's event for that layer is recorded on that stream (the harness's marker
  of how far vLLM's load got; nothing in vLLM waits on it);
- `torch.cuda.Stream`, `current_stream`, `stream` and `torch.Event` (`StreamsOf`): the harness
  device's streams and events, `elapsed_time` answering 0 (the transfer statistics only);
- `torch.zeros` for the CPU tensors the handlers allocate: host tensors, pinned only where the
  harness device is a GPU (the simulator has no pinned memory); each is matched, in allocation
  order, with the cache it mirrors, so every copy is named by its pool and layer.

A tensor vLLM hands `swap_blocks` that is none of these is the connector's contract broken
(`EngineContractBroken`), never a silent copy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import torch

from harness.devices.base import Device, Stream
from harness.engines.vllm_stand_ins import StreamsOf, TorchOf, Where, patched, swap_blocks, swap_ends
from harness.protocol.schedules import LoadOp
from harness.records.errors import EngineContractBroken
from harness.records.trace import Pool

CPU_GPU = "vllm.v1.kv_offload.worker.cpu_gpu"
NEEDED = {CPU_GPU: ("ops", "torch", "CpuGpuOffloadingHandlers")}
HOST = "offload"  # the name of vLLM's CPU tensors in the op list's host regions


class _Torch(TorchOf):
    """`TorchOf` with the handler module's streams, and its CPU tensors allocated as it asks, each
    registered with the handlers (`HandlerDevice.host_tensor`)."""

    def zeros(self, shape: Sequence[int], *args: Any, device: Any = None, pin_memory: bool = False,
              **kwargs: Any) -> torch.Tensor:
        if str(device) != "cpu":
            return torch.zeros(shape, *args, device=device, **kwargs)
        t = torch.zeros(shape, *args, pin_memory=pin_memory and self._o.dev.torch_device.type == "cuda", **kwargs)
        self._o.host_tensor(t)
        return t


class HandlerDevice:
    """What vLLM's offloading handlers reach of CUDA, for the caches `caches` (vLLM's layer name ->
    (the harness's global layer id, the registered `[2, blocks, 1, heads, head_dim]` view))."""

    def __init__(self, dev: Device, module: Any, caches: dict[str, tuple[int, torch.Tensor]]):
        self.dev, self.module = dev, module
        self.streams: list[Stream] = []  # the streams vLLM's handlers made
        self.idle = dev.Stream("offload-idle")  # StreamsOf's compute stream when vLLM's wait is removed
        self.waits_on_compute = True
        self.last_stream: Stream | None = None
        self._layers = [lid for lid, _ in caches.values()]  # in the order the handlers allocate host tensors
        # Where each tensor vLLM hands swap_blocks lives: (pool, global layer id, on the device).
        self._where: Where = {}
        for lid, view in caches.values():
            for i, p in enumerate((Pool.K, Pool.V)):
                self._where[view[i].data_ptr()] = (p, lid, True)
        self._torch = _Torch(self, StreamsOf(self, "offload", torch.cuda))
        self._ops = SimpleNamespace(swap_blocks=self._swap_blocks)
        self.op: LoadOp | None = None  # the load op the next load copies belong to
        self._paused: set[int] = set()
        self.loads = self.stores = 0  # harness copies, each way

    def host_tensor(self, t: torch.Tensor) -> None:
        """A CPU tensor the handlers allocated: the next cache's, in their order."""
        n = len([w for w in self._where.values() if not w[2]]) // 2
        if n >= len(self._layers) or t.dim() < 2 or t.shape[0] != 2:
            raise EngineContractBroken(f"vLLM's offloading handlers allocated a CPU tensor of shape {tuple(t.shape)}, "
                                       "not a K/V pair of one of the registered caches")
        for i, p in enumerate((Pool.K, Pool.V)):
            self._where[t[i].data_ptr()] = (p, self._layers[n], False)

    def patched(self) -> contextlib.AbstractContextManager:
        return patched(self.module, {"torch": self._torch, "ops": self._ops})

    def begin_load(self, op: LoadOp | None) -> None:
        """The load op the next load copies belong to (its fault, its events); None: none."""
        self.op, self._paused = op, set()

    def _swap_blocks(self, src: torch.Tensor, dst: torch.Tensor, *args: Any) -> None:
        """`ops.swap_blocks(src, dst, [block_size_in_bytes,] block_mapping)`: a load's copies behind
        its fault, and its layer's completion after them."""
        pool, layer, to_host = swap_ends(self._where, src, dst)
        if not to_host:
            self._fault(layer)
        copies = swap_blocks(self.dev, src, dst, args[-1].tolist(), pool, layer, to_host, HOST)
        if to_host:
            self.stores += copies
            return
        self.loads += copies
        if self.op is not None:
            self.op.event_set.complete(layer)  # on the stream vLLM made current
            for listener in self.op.listeners:
                listener(layer)

    def _fault(self, layer: int) -> None:
        op = self.op
        if op is None:
            return  # a load the harness did not start (none: the set-up only stores)
        op.hold()
        if layer not in self._paused:
            self._paused.add(layer)
            op.pause(layer)
