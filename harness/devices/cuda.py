"""The CUDA device: real streams, events, pinned-memory copies and CUDA graphs.

Python-level bookkeeping here runs at enqueue time only; a graph replay runs
none of it, which is exactly the property under test.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import statistics
import threading
import time
import weakref
from collections.abc import Callable, Sequence

import torch

from harness.devices import nvml
from harness.devices.base import (
    Device,
    Event,
    Flags,
    FlagValues,
    Gate,
    Graph,
    Memory,
    Stream,
    _Capture,
    _Stream,
    collector_paused,
)
from harness.devices.cuda_graph import GraphReader
from harness.devices.memcpy_batch import MemcpyBatch
from harness.records.errors import (
    DeviceUnavailable,
    FlagUnavailable,
    GateUnavailable,
    GraphUnavailable,
    HarnessError,
    ReplayTimeout,
)
from harness.records.graph_model import GraphModel
from harness.records.trace import (
    Copy,
    CopyToHost,
    Delay,
    FlagWait,
    FlagWrite,
    Hold,
    Record,
    Region,
    SpanKind,
    Wait,
)


class CudaStream(Stream):
    def __init__(self, device: CudaDevice, raw: torch.cuda.Stream, name: str):
        self._device = device
        self.raw = raw
        self.id = device._new_id()
        self.name = name

    def wait_event(self, event: Event) -> None:
        dev = self._device
        raw = event.raw  # type: ignore[attr-defined]
        if not dev.recording:
            self.raw.wait_event(raw)  # the hot path
            return
        if dev.capturing and not event.created:
            return  # torch enqueues nothing on an event CUDA has not created: the graph gets no wait node
        dev._note(Wait(self.id, event.id, dev.capturing, event))
        if dev.timing:
            with dev._timed(self, SpanKind.WAIT, f"wait e{event.id}"):
                self.raw.wait_event(raw)
        else:
            self.raw.wait_event(raw)


class CudaEvent(Event):
    def __init__(self, device: CudaDevice, external: bool, created: bool = True):
        self._device = device
        self.id = device._new_id()
        self.external = external
        # external=True lets a captured graph wait on an event recorded outside it
        self.raw = torch.cuda.Event(external=True) if external else torch.cuda.Event()
        if external and created:
            # CUDA creates an event at its first record, and torch enqueues no wait on an
            # event not created yet: a graph captured before anything recorded this one
            # would hold no wait node for it at all. One record here makes it exist.
            self.raw.record()
        device._events.add(self)

    @property
    def created(self) -> bool:
        return bool(self.raw.cuda_event)  # torch's handle stays null until the first record

    def record(self, stream: Stream | None = None) -> None:
        dev = self._device
        if stream is None and not dev.recording:
            self.raw.record()  # the hot path: the current stream, without wrapping it
            return
        stream = stream or dev.current_stream()
        if dev.recording:
            dev._note(Record(stream.id, self.id, self))
        self.raw.record(stream.raw)  # type: ignore[attr-defined]

    def query(self) -> bool:
        done = self.raw.query()
        if done:
            self._device._saw(self)
        return done

    def synchronize(self) -> None:
        self.raw.synchronize()
        self._device._saw(self)


class CudaGraph(Graph):
    """`frontiers`: the capture's dependency set before each captured op and at the end (node
    handles), or None with `why` where the graph cannot be read."""

    def __init__(self, device: CudaDevice, graph: torch.cuda.CUDAGraph, graph_id: int, body,
                 frontiers: list[tuple[int, ...]] | None, why: str = ""):
        self._device = device
        self.raw = graph
        self.id = graph_id
        self.body = body
        self._frontiers = frontiers
        self._why = why
        self._model: GraphModel | None = None
        # The value writes a replay makes (flags, indices, value): the host's view of what the
        # flags may hold follows them, as it follows an eager write.
        self._flag_writes = [(op.handle, tuple(op.handle.ids.index(f) for f in op.flags), op.value)
                             for op in body if isinstance(op, FlagWrite) and isinstance(op.handle, CudaFlags)]

    def model(self) -> GraphModel:
        """Read once, on first use: a scenario that never checks its graphs pays nothing."""
        if self._model is None:
            if self._frontiers is None:
                raise GraphUnavailable(self._why)
            events = {int(e.raw.cuda_event): e.id for e in list(self._device._events) if e.raw.cuda_event}
            flags = {int(ptr): fid for fs in list(self._device._flag_sets) if isinstance(fs, CudaFlags)
                     for fid, ptr in zip(fs.ids, fs._ptrs, strict=True)}
            self._model = self._device._graph_reader().read(self.raw.raw_cuda_graph(), self.id,
                                                            self._frontiers, events, flags=flags)
        return self._model

    def replay(self) -> None:
        dev = self._device
        dev._replayed(self)
        if self._flag_writes:
            stream = dev.current_stream()
            for flags, which, value in self._flag_writes:
                dev._flags_written(flags, which, value, stream)
        if dev.timing:
            with dev._timed(dev.current_stream(), SpanKind.REPLAY, f"replay graph {self.id}"):
                self.raw.replay()
        else:
            self.raw.replay()


def _driver():
    """CUDA's driver API through cuda-bindings (newer layout first), or None."""
    try:
        from cuda.bindings import driver
    except ImportError:
        try:
            from cuda import cuda as driver  # cuda-python before 12.6
        except ImportError:
            return None
    return driver


class CudaGate(Gate):
    """`cuStreamWaitValue32` on a pinned host flag: the stream polls it until the host writes.

    Each hold waits for a higher value (GEQ), so the flag never needs resetting and
    a late write from an old watchdog can only open a gate that was due anyway.
    """

    mode = "cuStreamWaitValue32"

    def __init__(self, device: CudaDevice, timeout_s: float):
        cu = _driver()
        if cu is None:
            raise GateUnavailable("cuda.bindings is not importable (pip install cuda-bindings)")
        self._cu = cu
        self._device = device
        self.id = device._new_id()
        self.timeout_s = timeout_s
        self.timed_out = False
        self.flag = torch.zeros(1, dtype=torch.int32).pin_memory()
        err, ptr = cu.cuMemHostGetDevicePointer(self.flag.data_ptr(), 0)
        if err != cu.CUresult.CUDA_SUCCESS:
            raise GateUnavailable(f"cuMemHostGetDevicePointer failed: {err}")
        self._dptr = ptr
        self._target = 0
        self._watchdog: threading.Timer | None = None
        self._lock = threading.Lock()

    def _write(self, value: int) -> None:
        # A plain store into pinned memory: the device sees it on its next poll.
        ctypes.c_int32.from_address(self.flag.data_ptr()).value = value

    def hold(self) -> None:
        cu = self._cu
        stream = self._device.current_stream()
        with self._lock:
            if self._watchdog is not None:
                raise HarnessError("gate held twice without a release")
            self._target += 1
            if self._device.recording:
                self._device._note(Hold(stream.id, self.id))
            begin = self._device.mark(stream) if self._device.timing else None
            (err,) = cu.cuStreamWaitValue32(
                cu.CUstream(stream.raw.cuda_stream), self._dptr, self._target,
                cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ,
            )
            if self._device.timing:
                self._device._span(stream, SpanKind.GATE, f"gate {self.id}", begin, self._device.mark(stream))
            if err != cu.CUresult.CUDA_SUCCESS:
                raise GateUnavailable(f"cuStreamWaitValue32 failed: {err}")
            self._watchdog = threading.Timer(self.timeout_s, self._expire)
            self._watchdog.daemon = True
            self._watchdog.start()

    def _expire(self) -> None:
        with self._lock:
            if self._watchdog is None:
                return
            self.timed_out = True
            self._watchdog = None
            self._write(self._target)

    def release(self) -> None:
        with self._lock:
            if self._watchdog is not None:
                self._watchdog.cancel()
                self._watchdog = None
            self._write(self._target)


class CudaFlags(Flags):
    """Flags in device memory (one int32 tensor), written with `cuStreamWriteValue32` and waited on
    with `cuStreamWaitValue32` (GEQ), through cuda-bindings. Both are stream memory operations:
    captured, each is a node of the graph (CUDA 12's batch memop node), so a replay waits on
    what the flag holds when it gets there. Device memory, not pinned host memory: the device polls
    it without crossing PCIe. A write is preceded by a memory barrier (the default flag), so what
    the stream copied before it is visible to whoever sees the flag."""

    def __init__(self, device: CudaDevice, count: int, initial: int):
        cu = _driver()
        if cu is None:
            raise FlagUnavailable("value waits need cuda.bindings (pip install cuda-bindings)")
        self._cu, self._device = cu, device
        self.initial = initial
        self.ids = tuple(device._new_id() for _ in range(count))
        self.words = torch.full((count,), initial, dtype=torch.int32, device=device.torch_device)
        base, size = self.words.data_ptr(), self.words.element_size()
        self._ptrs = [cu.CUdeviceptr(base + i * size) for i in range(count)]
        self._geq = cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ
        self._barrier = cu.CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_DEFAULT
        self._streams: dict[int, object] = {}  # raw stream handle -> CUstream, built once
        self.values = FlagValues(count, initial)
        device._made_flags(self)  # also names a graph's value-wait and value-write nodes

    def _cu_stream(self, stream: CudaStream):
        handle = stream.raw.cuda_stream
        s = self._streams.get(handle)
        if s is None:
            s = self._streams[handle] = self._cu.CUstream(handle)
        return s

    def _check(self, err, what: str) -> None:
        if err != self._cu.CUresult.CUDA_SUCCESS:
            raise FlagUnavailable(f"{what} failed: {err}")

    def write(self, index: int, value: int) -> None:
        dev = self._device
        stream = dev.current_stream()
        if dev.recording:
            dev._note(FlagWrite(stream.id, (self.ids[index],), value, self))
        dev._flags_written(self, (index,), value, stream)
        (err,) = self._cu.cuStreamWriteValue32(self._cu_stream(stream), self._ptrs[index], value, self._barrier)
        self._check(err, "cuStreamWriteValue32")

    def write_all(self, value: int) -> None:
        dev = self._device
        stream = dev.current_stream()
        if dev.recording:
            dev._note(FlagWrite(stream.id, self.ids, value, self))
        dev._flags_written(self, range(len(self.ids)), value, stream)
        self.words.fill_(value)  # one kernel on the current stream

    def wait(self, index: int, value: int) -> None:
        dev = self._device
        stream = dev.current_stream()
        if dev.recording:
            dev._note(FlagWait(stream.id, self.ids[index], value, dev.capturing, self))
        begin = dev.mark(stream) if dev.timing else None
        (err,) = self._cu.cuStreamWaitValue32(self._cu_stream(stream), self._ptrs[index], value, self._geq)
        if dev.timing:
            dev._span(stream, SpanKind.WAIT, f"wait flag f{self.ids[index]} >= {value}", begin, dev.mark(stream))
        self._check(err, "cuStreamWaitValue32")


class CudaDevice(Device):
    name = "cuda"
    clock = "device"

    def __init__(self, index: int = 0):
        super().__init__()
        if not torch.cuda.is_available():
            raise DeviceUnavailable("--device cuda: no CUDA device is visible to torch here")
        self.index = index
        self.torch_device = torch.device("cuda", index)
        torch.cuda.set_device(self.torch_device)
        # Weak: a scenario's streams go with its bench, so a long run (a soak, many scenarios)
        # does not make every synchronize poll the streams of all scenarios before it.
        self._streams: weakref.WeakValueDictionary[int, CudaStream] = weakref.WeakValueDictionary()
        self._owned: weakref.WeakSet[CudaStream] = weakref.WeakSet()  # streams work is enqueued on
        self._events: weakref.WeakSet[CudaEvent] = weakref.WeakSet()  # to name a graph node's event
        self._reader: GraphReader | None = None
        self._batch = MemcpyBatch.load(index)  # batched H2D copies, where the driver has them (12.8+)
        # A batch's pointers and sizes by the identity of the sequence (kept, so the id stays its).
        self._batches: dict[int, tuple[object, tuple[list[int], list[int], list[int]] | None]] = {}
        self._frontiers: list[tuple[int, ...]] | None = None  # while capturing a graph that can be read
        self.cycles_per_us = self._calibrate_sleep()
        # Timeline markers are timed against this one event (device time, any stream).
        self._epoch = torch.cuda.Event(enable_timing=True)
        self._epoch.record()
        self._epoch.synchronize()

    # ---- device_module surface ---------------------------------------------------
    def _wrap(self, raw: torch.cuda.Stream, name: str) -> CudaStream:
        key = raw.cuda_stream
        s = self._streams.get(key)
        if s is None:
            s = CudaStream(self, raw, name)
            self._streams[key] = s
        self._name_stream(s)
        return s

    def Stream(self, name: str) -> CudaStream:  # noqa: N802
        # Always a new stream of the harness's, with this name: torch hands the CUDA streams of its
        # pool out again (round robin), so a later testbed's stream can be one an earlier testbed
        # wrapped under another name; the newest wrapper answers for that CUDA stream from now on.
        raw = torch.cuda.Stream(self.torch_device)
        s = self._streams[raw.cuda_stream] = CudaStream(self, raw, name)
        self._name_stream(s)
        self._owned.add(s)
        return s

    def Event(self, *, external: bool = False, created: bool = True) -> CudaEvent:  # noqa: N802
        return CudaEvent(self, external, created)

    def Flags(self, count: int, initial: int) -> CudaFlags:  # noqa: N802
        return CudaFlags(self, count, initial)

    def current_stream(self) -> CudaStream:
        return self._wrap(torch.cuda.current_stream(self.torch_device), "default")

    def stream(self, stream: _Stream) -> contextlib.AbstractContextManager:
        return torch.cuda.stream(stream.raw)  # type: ignore[attr-defined]


    # ---- harness surface ------------------------------------------------------------
    def copy_async(self, dst: torch.Tensor, src: torch.Tensor, region: Region, source: Region | None = None) -> None:
        if not self.recording:
            dst.copy_(src, non_blocking=True)  # the hot path
            return
        stream = self.current_stream()
        self._note(Copy(stream.id, region, src.numel() * src.element_size(), (dst, src), source))
        with self._timed_if(stream, SpanKind.COPY, f"H2D {region}"):
            dst.copy_(src, non_blocking=True)

    def copy_batch_async(self, copies: Sequence[tuple[torch.Tensor, torch.Tensor, Region, Region | None]]) -> None:
        """One `cudaMemcpyBatchAsync` where the driver has it (12.8+) and every piece is contiguous,
        as sgl_kernel's page-first kernel issues its page copies; else one copy each, as it falls
        back. Never under capture: the driver has no graph node for a batched copy."""
        batch = self._batch
        args = None if batch is None or not copies or torch.cuda.is_current_stream_capturing() else (
            self._batch_args(copies))
        stream = self.current_stream()
        if batch is None or args is None or not stream.raw.cuda_stream:  # the call rejects the legacy stream
            super().copy_batch_async(copies)
            return
        dsts, srcs, sizes = args
        if not self.recording:
            if not batch.copy(dsts, srcs, sizes, stream.raw.cuda_stream):
                super().copy_batch_async(copies)
            return
        for (d, s, region, source), size in zip(copies, sizes, strict=True):
            self._note(Copy(stream.id, region, size, (d, s), source))
        with self._timed_if(stream, SpanKind.COPY, f"H2D batch of {len(copies)} from {copies[0][2]}"):
            if not batch.copy(dsts, srcs, sizes, stream.raw.cuda_stream):
                for d, s, _, _ in copies:
                    d.copy_(s, non_blocking=True)

    def _batch_args(self, copies: Sequence[tuple[torch.Tensor, torch.Tensor, Region, Region | None]]
                    ) -> tuple[list[int], list[int], list[int]] | None:
        """The pointers and sizes of a batch (None: a piece is not contiguous, so it cannot be one
        pointer copy), built once per batch the caller keeps (an engine kernel's plan is the same
        every load op): the compiled kernel spends no host time on them beyond pointer arithmetic,
        so neither may this."""
        found = self._batches.get(id(copies))
        if found is None or found[0] is not copies:
            if len(self._batches) > 1024:
                self._batches.clear()
            whole = all(d.is_contiguous() and s.is_contiguous() for d, s, _, _ in copies)
            found = self._batches[id(copies)] = (copies, (
                [d.data_ptr() for d, _, _, _ in copies], [s.data_ptr() for _, s, _, _ in copies],
                [s.numel() * s.element_size() for _, s, _, _ in copies]) if whole else None)
        return found[1]

    def copy_to_host(self, dst: torch.Tensor, src: torch.Tensor, src_region: Region, dst_region: Region) -> None:
        # Into pinned memory (empty_host), so non_blocking is truly asynchronous to the host.
        if not self.recording:
            dst.copy_(src, non_blocking=True)
            return
        stream = self.current_stream()
        self._note(CopyToHost(stream.id, src_region, dst_region, src.numel() * src.element_size(), (dst, src)))
        with self._timed_if(stream, SpanKind.D2H, f"D2H {src_region}"):
            dst.copy_(src, non_blocking=True)

    def delay(self, us: float) -> None:
        if us <= 0:
            return
        cycles = int(us * self.cycles_per_us)
        if not self.recording:
            torch.cuda._sleep(cycles)
            return
        stream = self.current_stream()
        self._note(Delay(stream.id, us))
        with self._timed_if(stream, SpanKind.DELAY, f"delay {us:g}us"):
            torch.cuda._sleep(cycles)

    def _timed_if(self, stream: _Stream, kind: str, name: str) -> contextlib.AbstractContextManager:
        return self._timed(stream, kind, name) if self.timing else contextlib.nullcontext()

    def gate(self, timeout_s: float) -> CudaGate:
        return CudaGate(self, timeout_s)

    def mark(self, stream: _Stream, reuse=None):
        e = reuse if reuse is not None else torch.cuda.Event(enable_timing=True)
        e.record(stream.raw)  # type: ignore[attr-defined]
        return e

    def marker_us(self, marker) -> float | None:
        return self._epoch.elapsed_time(marker) * 1e3 if marker is not None else None

    def _calibrate_sleep(self, cycles: int = 200_000, repeats: int = 7) -> float:
        """Cycles of `torch.cuda._sleep` per microsecond, measured on this device now.

        The spin counts SM clock cycles, and the clock varies between parts and
        moment to moment, so it is measured with device events, never assumed.
        """
        s = torch.cuda.Stream(self.torch_device)
        with torch.cuda.stream(s):
            torch.cuda._sleep(cycles)  # warm-up: clocks ramp and the kernel loads
            samples = []
            for _ in range(repeats):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                torch.cuda._sleep(cycles)
                b.record()
                b.synchronize()
                samples.append(a.elapsed_time(b) * 1e3)  # ms -> us
        return cycles / statistics.median(samples)

    def capture(self, fn: Callable[[], None], *, warmup: int = 2) -> CudaGraph:
        # The collector stays off while capturing: freeing an old graph (a cycle the collector
        # breaks) mid-capture destroys it under capture, which invalidates the capture.
        gc.collect()
        with collector_paused():
            return self._capture_graph(fn, warmup)

    def _capture_graph(self, fn: Callable[[], None], warmup: int) -> CudaGraph:
        # Capture on a side stream, never the default one (a legacy-stream capture fails),
        # after warm-up there, as torch.cuda.graphs recommends.
        caller = torch.cuda.current_stream(self.torch_device)
        side = torch.cuda.Stream(self.torch_device)
        side.wait_stream(caller)
        with torch.cuda.stream(side):
            for _ in range(warmup):
                fn()
        caller.wait_stream(side)
        torch.cuda.synchronize(self.torch_device)
        graph, why = self._keepable_graph()
        graph_id = self._new_id()
        self._capture = _Capture(graph_id, [])
        self._frontiers = [] if not why else None
        try:
            with torch.cuda.graph(graph, stream=side):
                self._wrap(side, "capture")
                fn()
                self._take_frontier()  # after the last op
        finally:
            body, self._capture = self._capture.body, None
            frontiers, self._frontiers = self._frontiers, None
        if not why:
            graph.instantiate()  # now, not at the first replay (a kept graph is instantiated lazily)
        # Captured work does not run, but tools that model streams (PyTorch's CUDA
        # sanitizer) treat it as if it had: order the caller after it, as after warm-up.
        caller.wait_stream(side)
        why = why or self._frontier_why
        return self._captured(CudaGraph(self, graph, graph_id, body, frontiers, why))

    # ---- reading a captured graph (harness.devices.cuda_graph) ---------------------------
    _frontier_why = ""

    def _graph_reader(self) -> GraphReader:
        if self._reader is None:
            self._reader = GraphReader()  # GraphUnavailable without cuda.bindings
        return self._reader

    def _keepable_graph(self) -> tuple[torch.cuda.CUDAGraph, str]:
        """A graph that keeps its cudaGraph_t after capture, so its nodes can be read; or a plain
        one and why not."""
        try:
            self._graph_reader()
        except GraphUnavailable as e:
            return torch.cuda.CUDAGraph(), str(e)
        try:
            return torch.cuda.CUDAGraph(keep_graph=True), ""
        except TypeError:
            return torch.cuda.CUDAGraph(), f"torch {torch.__version__} cannot keep a captured graph (keep_graph)"

    def _take_frontier(self) -> None:
        """The capture's dependency set now, on the capturing stream: where the next op's nodes begin."""
        if self._frontiers is None:
            return
        try:
            stream = torch.cuda.current_stream(self.torch_device).cuda_stream
            self._frontiers.append(self._graph_reader().frontier(stream))
        except GraphUnavailable as e:
            self._frontiers, self._frontier_why = None, str(e)

    def _note(self, op) -> None:
        if self._capture is not None:
            self._take_frontier()  # before the op's work is enqueued
        super()._note(op)

    def synchronize(self, timeout_s: float = 30.0) -> None:
        """Poll an event on every stream we know, so a stuck replay ends in an error."""
        marks = []
        for s in [*self._owned, self.current_stream()]:
            e = torch.cuda.Event()
            e.record(s.raw)
            marks.append(e)
        deadline = time.monotonic() + timeout_s
        spins = 0
        while not all(e.query() for e in marks):
            if time.monotonic() > deadline:
                raise ReplayTimeout(
                    f"device work did not finish within {timeout_s:g}s "
                    "(a hung replay or a load stream that never ran)"
                )
            spins += 1
            if spins > 1000:  # long waits: stop burning a core
                time.sleep(50e-6)
        # All work has finished, so this returns at once; it makes the host sync visible to
        # tools that watch CUDA's synchronize calls (PyTorch's CUDA sanitizer), which an
        # event query is not.
        torch.cuda.synchronize(self.torch_device)
        self._synchronized()

    def empty_host(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(tuple(shape), dtype=dtype, pin_memory=True)

    def _made_streams(self) -> Sequence[CudaStream]:
        return sorted(self._owned, key=lambda s: s.id)

    def memory(self) -> Memory:
        free, _ = torch.cuda.mem_get_info(self.torch_device)
        allocated = torch.cuda.memory_allocated(self.torch_device)
        # Blocks torch's caching allocator holds but no tensor uses are this process's to take too.
        cached = torch.cuda.memory_reserved(self.torch_device) - allocated
        return Memory("GPU memory", allocated, free + cached)

    def describe(self) -> dict:
        d = super().describe()
        props = torch.cuda.get_device_properties(self.torch_device)
        d.update(
            gpu=props.name,
            cuda=torch.version.cuda,
            sm_count=props.multi_processor_count,
            memory_gib=round(props.total_memory / 2**30, 1),
            sleep_cycles_per_us=round(self.cycles_per_us, 1),
        )
        driver = nvml.driver_version()
        if driver:
            d["driver"] = driver
        return d
