"""What vLLM's offloading code reaches of torch, CUDA and host memory, stood in by the harness's
device: one set of stand-ins for every vLLM module the adapter drives that way (the offloading
handlers, `vllm_handlers`, `vllm_offload`; the CPU offloading worker, `vllm_worker_store`,
`vllm_offload_load`; SimpleCPUOffloadConnector's worker, `vllm_simple_offload`).

- `StreamsOf`: the stream names (`torch.cuda`'s, or `current_platform`'s): the streams vLLM makes,
  the compute stream as it sees it, the stream it enters.
- `TorchOf`: `torch` as such a module reaches it: the harness's events; `HostCopyTorch` adds the CPU
  tensors vLLM allocates, answered with views of the harness's host copy (`host_view`).
- `patched`: a module's names set to the stand-ins for the length of one of vLLM's calls.
- `PageRanges`: where a byte pointer of vLLM's copy descriptors lies (which tensor, which row).
- `swap_blocks`: vLLM's `ops.swap_blocks` on the harness device (the handlers' copy primitive).
- `EngineStore`: what vLLM's three store paths share as the harness's write-back: no fault of their
  own, the start on the forward stream, the finish on the stream vLLM stored on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from harness.devices.base import Device, Event, Gate, Stream
from harness.engines.vllm_pools import plain
from harness.faults.plan import FaultPlan
from harness.protocol.layout import Layout
from harness.protocol.writeback import TransferPolicy, WriteBack, WriteOp
from harness.records.errors import EngineContractBroken
from harness.records.trace import Pool, Region

_Stream = Stream  # `StreamsOf.Stream` shadows the class inside it


class StreamsOf:
    """The stream names vLLM's offloading code reaches (`torch.cuda`'s in the handlers' module,
    `current_platform`'s in the worker's) on the harness device: the streams it makes (named
    `{prefix}-N`, kept in `owner.streams`), the compute stream as it sees it (the current one, or
    `owner.idle` where the scenario removes vLLM's wait) and the last stream it entered
    (`owner.last_stream`); every other name is `fallback`'s."""

    def __init__(self, owner: Any, prefix: str, fallback: Any):
        self._o, self._prefix, self._fallback = owner, prefix, fallback

    def Stream(self, *args: Any, **kwargs: Any) -> Stream:  # noqa: N802 - torch.cuda.Stream
        o = self._o
        s = o.dev.Stream(f"{self._prefix}-{len(o.streams)}")
        o.streams.append(s)
        return s

    def current_stream(self, *args: Any) -> _Stream:
        o = self._o
        return o.dev.current_stream() if o.waits_on_compute else o.idle

    @contextlib.contextmanager
    def stream(self, s: _Stream) -> Iterator[None]:
        self._o.last_stream = s
        with self._o.dev.stream(s):
            yield

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fallback, name)


class TorchOf:
    """`torch` as one of vLLM's modules reaches it: the harness device's events (of `owner.dev`),
    with `elapsed_time` answering 0 (vLLM reads it for its transfer statistics only), `cuda` where
    given (a `StreamsOf`), every other name torch's own."""

    def __init__(self, owner: Any, cuda: Any = None):
        self._o = owner
        if cuda is not None:
            self.cuda = cuda

    def Event(self, *args: Any, **kwargs: Any) -> Event:  # noqa: N802 - torch.Event
        e = self._o.dev.Event()
        e.elapsed_time = lambda other: 0.0  # the statistics only
        return e

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


class HostCopyTorch(TorchOf):
    """`TorchOf`, and the CPU tensors vLLM allocates answered by `owner.next_host_tensor(shape)`: views
    of the harness's host copy, so what vLLM's copies write is what the probes observe."""

    def zeros(self, shape: Sequence[int], *args: Any, device: Any = None, **kwargs: Any) -> torch.Tensor:
        if str(device) != "cpu":
            return torch.zeros(shape, *args, device=device, **kwargs)
        return self._o.next_host_tensor(tuple(shape))


def host_view(views: Iterator[torch.Tensor], shape: tuple[int, ...], who: str) -> torch.Tensor:
    """The next of the harness's host-copy views, for the CPU tensor of `shape` that `who` (vLLM's
    code, in words) allocates; EngineContractBroken where it asks for more, or for another shape."""
    view = next(views, None)
    if view is None or tuple(view.shape) != shape:
        raise EngineContractBroken(f"{who} asked for a CPU tensor of shape {shape}, not the harness's host copy "
                                   "of one layer")
    return view


@contextlib.contextmanager
def patched(module: Any, values: dict[str, Any], *, where_present: bool = False) -> Iterator[None]:
    """`module`'s names set to `values` inside the block, put back after it. `where_present`: only the
    names the module has (a name one release has and another has not)."""
    names = [n for n in values if hasattr(module, n)] if where_present else list(values)
    saved = [(n, getattr(module, n)) for n in names]
    for n in names:
        setattr(module, n, values[n])
    try:
        yield
    finally:
        for n, value in reversed(saved):
            setattr(module, n, value)


class PageRanges:
    """The byte ranges of the tensors vLLM's batched copy descriptors point into, a page a row:
    each registered with its part (the index of its K or V tensor) and whether it is device memory."""

    def __init__(self, page: int):
        self.page = page
        self._ranges: list[tuple[int, int, int, bool]] = []  # (base pointer, rows, part, on the device)

    def add(self, t: torch.Tensor, rows: int, part: int, on_device: bool) -> None:
        self._ranges.append((t.data_ptr(), rows, part, on_device))

    def where(self, ptr: int) -> tuple[int, int, bool]:
        """(part, row, on the device) of a descriptor's byte pointer."""
        for start, rows, part, on_dev in self._ranges:
            if start <= ptr < start + self.page * rows:
                if (ptr - start) % self.page:
                    raise EngineContractBroken("vLLM's copy descriptor points inside a page")
                return part, (ptr - start) // self.page, on_dev
        raise EngineContractBroken("vLLM's copy descriptor points into memory the harness did not register")


def block_runs(mapping: list[list[int]]) -> Iterator[tuple[int, int, int]]:
    """(src, dst, count) for each run of consecutive pairs of a block mapping."""
    i = 0
    while i < len(mapping):
        s0, d0 = mapping[i]
        n = 1
        while i + n < len(mapping) and mapping[i + n] == [s0 + n, d0 + n]:
            n += 1
        yield s0, d0, n
        i += n


Where = dict[int, tuple[str, int, bool]]  # a tensor's data pointer -> (pool, layer, on the device)


def swap_ends(where: Where, src: torch.Tensor, dst: torch.Tensor) -> tuple[str, int, bool]:
    """(pool, layer, device to host) of one `ops.swap_blocks(src, dst, ...)`: both tensors the same
    pool and layer's, one on each side."""
    try:
        sp, slid, s_dev = where[src.data_ptr()]
        dp, dlid, d_dev = where[dst.data_ptr()]
    except KeyError:
        raise EngineContractBroken("vLLM's swap_blocks was handed a tensor the harness did not register") from None
    if (sp, slid) != (dp, dlid) or s_dev == d_dev:
        raise EngineContractBroken(f"vLLM's swap_blocks copies {sp} L{slid} to {dp} L{dlid}")
    return sp, slid, s_dev


def swap_blocks(dev: Device, src: torch.Tensor, dst: torch.Tensor, mapping: list[list[int]], pool: str,
                layer: int, to_host: bool, host: str) -> int:
    """`ops.swap_blocks(src, dst, [block_size_in_bytes,] block_mapping)` between `swap_ends`' ends:
    each run of consecutive (src, dst) block pairs one copy on the current stream; the copies made."""
    s, d = plain(src), plain(dst)
    copies = 0
    for s0, d0, n in block_runs(mapping):
        dev_rows, host_rows = (s0, d0) if to_host else (d0, s0)
        region = Region(pool, layer, dev_rows, dev_rows + n)
        host_region = Region(Pool.on_host(host, pool), layer, host_rows, host_rows + n)
        if to_host:
            dev.copy_to_host(d[d0 : d0 + n], s[s0 : s0 + n], region, host_region)
        else:
            dev.copy_async(d[d0 : d0 + n], s[s0 : s0 + n], region, host_region)
        copies += 1
    return copies


class EngineStore(WriteBack):
    """A store of vLLM's as the harness's write-back: the batch's new tokens' blocks (device slots)
    to its host rows, through `_store`, on the current (forward) stream."""

    layout: Layout
    waits_on_compute: bool
    WHAT = "vLLM's offloading store"  # for the error of a fault it cannot run under

    def write(self, fault: FaultPlan, policy: TransferPolicy, gate: Gate | None = None) -> WriteOp:
        if gate is not None or fault.pause_us(0) > 0:
            raise EngineContractBroken(f"{self.WHAT} runs with no fault of its own (the hazard store_before_compute)")
        self.waits_on_compute = policy.write_fence
        start = self.dev.Event()
        start.record()
        finish = self.dev.Event()
        finish.record(self._store())  # after vLLM's own end of the store, on the stream it stored on
        return WriteOp(self.dev, start, start, finish, policy)

    def _store(self) -> Stream:
        """Enqueue the batch's store through vLLM's code; the stream it stored on."""
        raise NotImplementedError

    def batch_blocks(self) -> tuple[list[int], list[int]]:
        """The batch's new tokens: their device slots and their host rows, request after request."""
        requests = self.layout.requests
        return [slot for r in requests for slot in r.new], [row for r in requests for row in r.tokens]
