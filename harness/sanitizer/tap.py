"""What torch enqueues, fed to the stream sanitizer's model (`harness.sanitizer.model`).

Three taps, as PyTorch's CUDA sanitizer (`torch/cuda/_sanitizer.py`) has them, and one more:

- `OpWatch`, a `TorchDispatchMode`: every aten operation, with the memory each tensor
  argument reads or writes, from the operator's schema (an argument that is written is
  `Tensor(a!)`; a view's alias is metadata only; outputs are written, but for an operator that
  only allocates, `empty` and its kin, which runs no kernel). CUDA tensors, and
  pinned host tensors (the source of an async H2D copy, the target of a D2H one): an
  operation on a CUDA tensor runs on the current stream; one on pinned host tensors only
  is the host's own work.
- torch's GPU trace (`torch._C._activate_gpu_trace`, `torch.cuda._gpu_trace`): event
  creation, record, wait, destruction; allocation and free; device, stream and event
  synchronisation. The trace cannot be turned off once on; its callbacks are on torch's
  registries only while a watch watches, and forward to whichever model is watching. An
  allocation is told with the current stream: the caching allocator's pool it came from.
- patches held only while watching: `CUDAGraph.capture_begin`, `capture_end`, `replay`
  (torch tells the trace nothing of graphs), `Event.query` (a query that says done is a
  host observation, as a synchronize is) and `Event.__init__` (which events are external).

Spans are byte ranges from the tensor's pointer, shape and strides (a strided view is
taken as its whole extent). Stacks are short: the innermost frames outside torch and
this module.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from harness.devices.base import collector_paused
from harness.records.errors import SanitizerError
from harness.sanitizer.model import SanitizerModel, Site, Span, Use

__all__ = ["OpWatch", "CudaWatch", "cuda_space", "short_stack"]

aten = torch.ops.aten
FACTORY = re.compile(r"aten::(new_.*|.*_like)$")  # factories that take a tensor read only its metadata
# Operators that only allocate: no kernel runs, nothing is written. Their output is memory the
# allocator may have handed out with a freed owner's accesses still pending: only the first
# kernel that writes it (a fill, a copy) can race with those.
ALLOCATES_ONLY = re.compile(r"aten::(empty|empty_strided|empty_permuted|empty_like|new_empty|new_empty_strided)$")


@functools.cache
def _factory_kind(name: str) -> tuple[bool, bool]:
    """(takes a tensor for its metadata only, only allocates) for an operator's schema name: once per
    operator, not once per call (the tap sees every operation)."""
    return bool(FACTORY.match(name)), bool(ALLOCATES_ONLY.match(name))


RECORD_STREAM = aten.record_stream.default  # not a kernel: the allocator's note that a stream uses a block
# Reads that hand a device value to the host as a Python scalar: the host waits for the stream.
SCALAR_READS = {aten._local_scalar_dense.default, aten.equal.default, aten.is_nonzero.default}

_TORCH_DIR = os.path.dirname(torch.__file__)
_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_QUIET = (
    _TORCH_DIR,
    os.path.join(_HERE, "devices", "torch_watch.py"),
    os.path.join(_HERE, "frontends", "sanitizer.py"),
    os.path.join(_HERE, "sanitizer.py"),
    os.path.dirname(os.__file__) + os.sep + "contextlib.py",
)


def short_stack(depth: int, skip: int = 1) -> tuple[str, ...]:
    """The innermost `depth` frames outside torch and the sanitizer, outermost first."""
    frames: list[str] = []
    f = sys._getframe(skip)
    while f is not None and len(frames) < depth:
        path = f.f_code.co_filename
        if not path.startswith(_QUIET):
            short = os.sep.join(path.split(os.sep)[-2:])
            frames.append(f"{short}:{f.f_lineno} in {f.f_code.co_name}")
        f = f.f_back  # type: ignore[assignment]
    return tuple(reversed(frames))


def cuda_space(t: torch.Tensor) -> str | None:
    """The address space a tensor's memory counts in: its CUDA device, pinned host memory, or none."""
    if t.is_cuda:
        return f"cuda:{t.device.index}"
    if t.device.type == "cpu" and t.dim() > 0 and t.is_pinned():  # a 0-dim one: a wrapped scalar
        return "host"
    return None


def _span(t: torch.Tensor, space: str) -> tuple[Span, int] | None:
    """(its bytes, its allocation's first byte), or None for no memory."""
    if t.layout != torch.strided or t.numel() == 0:
        return None
    try:
        ptr = t.data_ptr()
    except RuntimeError:  # a tensor with no storage (fake, functional)
        return None
    if not ptr:
        return None
    size = t.element_size()
    extent = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    return Span(space, ptr, ptr + extent * size), ptr - int(t.storage_offset()) * size


def cuda_stream_id(stream: Any) -> int:
    """The handle of the stream an operator got as a `Stream` argument (the model's stream id)."""
    handle = getattr(stream, "cuda_stream", None)
    if handle is None:  # a generic torch.Stream, as the dispatcher hands it on
        handle = torch.cuda.Stream(stream_id=stream.stream_id, device_index=stream.device_index,
                                   device_type=stream.device_type).cuda_stream
    return int(handle)


def _arguments(schema: Any, args: tuple, kwargs: dict) -> Iterator[tuple[Any, Any]]:
    positional = schema.arguments[: len(args)]
    yield from zip(positional, args, strict=False)
    for a in schema.arguments[len(args):]:
        if a.name in kwargs:
            yield a, kwargs[a.name]


class OpWatch(TorchDispatchMode):
    """Every aten operation's uses of tracked memory, to the model.

    `stream_of()` is the current stream's id; `space_of(tensor)` the address space a
    tensor counts in ("host" for host memory, anything else is device memory), or None
    for one to ignore; `stream_id(stream)` the id of a `Stream` argument (`record_stream`'s).
    The defaults are CUDA's; tests pass their own to run on CPU tensors.
    """

    def __init__(self, model: SanitizerModel, *, stream_of: Callable[[], int] | None = None,
                 space_of: Callable[[torch.Tensor], str | None] = cuda_space, stack_depth: int = 6,
                 lock: threading.Lock | threading.RLock | None = None,
                 stream_id: Callable[[Any], int] = cuda_stream_id) -> None:
        super().__init__()
        self.model = model
        self.stream_of = stream_of or (lambda: torch.cuda.current_stream().cuda_stream)
        self.space_of = space_of
        self.stream_id = stream_id
        self.stack_depth = stack_depth
        self.lock = lock or threading.Lock()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is RECORD_STREAM:
            self._record_stream(*args, **kwargs)
            return func(*args, **kwargs)
        schema = func._schema
        factory, allocates_only = _factory_kind(schema.name)
        found: dict[Span, list] = {}  # span -> [is_write, base, argument names]

        def note(value: Any, is_write: bool, metadata_only: bool, name: str) -> None:
            if not isinstance(value, torch.Tensor) or (metadata_only and not is_write):
                return
            space = self.space_of(value)
            if space is None:
                return
            got = _span(value, space)
            if got is None:
                return
            span, base = got
            entry = found.setdefault(span, [False, base, []])
            entry[0] |= is_write
            if name not in entry[2]:
                entry[2].append(name)

        for argument, value in _arguments(schema, args, kwargs):
            alias = argument.alias_info
            is_write = alias is not None and alias.is_write
            metadata_only = factory or (alias is not None and not alias.is_write)
            pytree.tree_map_(lambda v, w=is_write, m=metadata_only, n=argument.name: note(v, w, m, n), value)
        out = func(*args, **kwargs)
        device_input = any(isinstance(v, torch.Tensor) and self.space_of(v) not in (None, "host")
                           for v in pytree.tree_leaves((args, kwargs)))
        returns = schema.returns
        pairs = [(returns[0], out)] if len(returns) == 1 else list(zip(returns, out, strict=False))
        for ret, value in pairs:
            # A factory's output is new memory it fills (zeros_like writes it); a view's is not written.
            metadata_only = allocates_only or (ret.alias_info is not None and not ret.alias_info.is_write)
            if not metadata_only:
                pytree.tree_map_(lambda v: note(v, True, False, "output"), value)
        if found:
            operator = str(schema.name) + (f".{schema.overload_name}" if schema.overload_name else "")
            stack = short_stack(self.stack_depth, 2)
            uses = [Use(span, w, Site(operator, ", ".join(names), stack), base)
                    for span, (w, base, names) in found.items()]
            with self.lock:
                if all(u.span.space == "host" for u in uses):
                    self.model.host_op(uses)  # the host runs it, now
                else:
                    self.model.op(self.stream_of(), uses)
        if device_input and self._blocks_host(func, args, kwargs, out):
            # A copy into pageable host memory (or a scalar read) returns only once the stream's
            # work so far has finished: the host has seen it, as after a stream synchronize.
            with self.lock:
                self.model.stream_sync(self.stream_of())
        return out

    def _record_stream(self, tensor: torch.Tensor, s: Any) -> None:
        """`tensor.record_stream(s)`: the block's free will wait for `s` (the model's `record_stream`)."""
        space = self.space_of(tensor)
        got = _span(tensor, space) if space not in (None, "host") else None
        if got is not None:
            with self.lock:
                self.model.record_stream(got[1], self.stream_id(s))

    def _blocks_host(self, func: Any, args: tuple, kwargs: dict, out: Any) -> bool:
        if func in SCALAR_READS:
            return True
        written = [out, *(v for a, v in _arguments(func._schema, args, kwargs)
                          if a.alias_info is not None and a.alias_info.is_write)]
        return any(isinstance(v, torch.Tensor) and v.device.type == "cpu" and self.space_of(v) is None
                   for v in pytree.tree_leaves(written))


# ---- torch's GPU trace: forwarded to the model watching now --------------------------

_watching: list[CudaWatch] = []
# Every dispatch mode a watch has used, kept for the life of the process, as PyTorch's sanitizer
# keeps its one mode (`torch.cuda._sanitizer.cuda_sanitizer`). Each is off every stack and holds
# no model. (torch 2.11's stack reads, pops and pushes keep a mode's reference count, measured on
# an H200: keeping them is caution, not a fix of a seen fault.)
_retired: list[OpWatch] = []

# The mark on a `torch.cuda.Event` made with `external=True` while a watch watched (its CUDA event
# exists only from its first record, so the flag waits on the Python object until then). A mark, not
# a set of the events: a `WeakSet` of them crashed the process on an H200 (docs/sanitizer.md), so the
# watch keeps no reference to an event, weak or strong.
_EXTERNAL = "_harness_sanitizer_external"

# (registry, the forwarder it calls) per GPU-trace callback: on the registries while a watch
# watches, off them after. The trace itself cannot be turned off once on.
_TRACE = (
    ("EventCreationCallbacks", "forget_event"),
    ("EventDeletionCallbacks", "forget_event"),
    ("EventRecordCallbacks", "record"),
    ("EventWaitCallbacks", "wait"),
    ("MemoryAllocationCallbacks", "allocate"),  # with the current stream: the pool it came from
    ("MemoryDeallocationCallbacks", "free"),
    ("DeviceSynchronizationCallbacks", "host_sync"),
    ("StreamSynchronizationCallbacks", "stream_sync"),
    ("EventSynchronizationCallbacks", "event_sync"),
)
_callbacks: list[tuple[Any, Callable[..., None]]] = []


def _forward(method: str) -> Callable[..., None]:
    def callback(*args: int) -> None:
        if _watching:
            w = _watching[-1]
            with w.lock:
                if method == "allocate":  # the caching allocator allocates on the current stream
                    (base,) = args
                    w.model.allocate(base, w.stream_of())
                else:
                    getattr(w.model, method)(*args)

    return callback


def _gpu_trace() -> Any:
    try:
        import torch.cuda._gpu_trace as gpu_trace
    except ImportError:  # torch before 2.2 kept it here
        import torch.utils._cuda_trace as gpu_trace  # type: ignore[no-redef]
    return gpu_trace


def _install_trace() -> None:
    """Torch's GPU trace on (once per process) and the forwarders on its registries."""
    gpu_trace = _gpu_trace()
    if not _callbacks:
        torch._C._activate_gpu_trace()
        _callbacks.extend((getattr(gpu_trace, registry), _forward(method)) for registry, method in _TRACE)
    for registry, callback in _callbacks:
        if callback not in registry.callback_list:
            registry.add_callback(callback)


def _uninstall_trace() -> None:
    """The forwarders off torch's registries: after a watch, torch's trace calls nothing of ours."""
    for registry, callback in _callbacks:
        # A new list, not a removal in place: a thread firing the trace now goes on over the old one.
        registry.callback_list = [cb for cb in registry.callback_list if cb is not callback]


def _leave_dispatch_stack(mode: OpWatch) -> list[str]:
    """`mode` off this thread's dispatch-mode stack, by its own `__exit__`.

    A mode entered inside the watch and still active sits above it; a plain exit would pop that
    one (torch pops the top, whoever it is) and leave this one on the stack for good. Those above
    are lifted off, this one exits, and they go back in their order, still active. Returns their
    class names (none: it was on top). Not on the stack at all: nothing to pop.
    """
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack, _pop_mode, _push_mode

    stack = _get_current_dispatch_mode_stack()
    at = next((i for i, m in enumerate(stack) if m is mode), None)
    if at is None:
        return []
    above = stack[at + 1:]
    for _ in above:
        _pop_mode()
    try:
        mode.__exit__(None, None, None)
    finally:
        for other in above:
            _push_mode(other)
    return [type(m).__name__ for m in above]


class CudaWatch:
    """All three taps, for one model, between `start()` and `stop()`.

    `stream_of`, `space_of` and `stream_id` are `OpWatch`'s (CUDA's by default); the patches call
    the `on_*` methods, which tests call directly on CPU.
    """

    def __init__(self, model: SanitizerModel, *, stack_depth: int = 6, stream_of: Callable[[], int] | None = None,
                 space_of: Callable[[torch.Tensor], str | None] = cuda_space,
                 stream_id: Callable[[Any], int] = cuda_stream_id) -> None:
        self.model = model
        # Re-entrant: a tensor freed while the model is being fed (the cycle collector runs inside
        # any Python call) fires the trace's free callback on this thread, under this lock.
        self.lock = threading.RLock()
        self.stream_of = stream_of or (lambda: torch.cuda.current_stream().cuda_stream)
        self.ops = OpWatch(model, stack_depth=stack_depth, lock=self.lock, stream_of=self.stream_of,
                           space_of=space_of, stream_id=stream_id)
        self.stack_depth = stack_depth
        self._saved: list[tuple[type, str, Any]] = []
        self._thread: int | None = None

    def start(self) -> None:
        if _watching:
            raise SanitizerError("a harness.sanitizer is already watching: one at a time")
        _install_trace()
        self._patch()
        _watching.append(self)
        self._thread = threading.get_ident()
        try:
            self.ops.__enter__()
        except BaseException:
            _watching.remove(self)
            _uninstall_trace()
            self._unpatch()
            raise

    def stop(self) -> None:
        """Undo `start()` in reverse, each tap off before what it feeds goes: nothing forwards to
        this model any more, the dispatch mode leaves this thread's stack (in order, see
        `_leave_dispatch_stack`), the trace's callbacks leave torch's registries, the patches go,
        and the mode is kept (`_retired`), holding no model. The cycle collector is off meanwhile:
        a CUDA tensor or event it frees fires the trace, or a patch, half-way through."""
        lifted: list[str] = []
        wrong_thread = self._thread is not None and self._thread != threading.get_ident()
        with collector_paused():
            if self in _watching:
                _watching.remove(self)
            try:
                if not wrong_thread:  # the stack is per thread: another thread's holds nothing of this
                    lifted = _leave_dispatch_stack(self.ops)
            finally:
                _uninstall_trace()
                self._unpatch()
                self.ops.model = SanitizerModel()  # drop the watched model, keep the mode
                _retired.append(self.ops)
        if wrong_thread:
            raise SanitizerError("a harness.sanitizer must exit on the thread that entered it (torch's "
                                 "dispatch modes are per thread); its mode stays on that thread's stack")
        if lifted:
            raise SanitizerError(f"dispatch mode(s) entered inside the sanitizer's block were still active at its "
                                 f"exit: {', '.join(lifted)}; they stay active, the sanitizer's mode is gone")

    def _unpatch(self) -> None:
        for cls, name, value in reversed(self._saved):
            if value is None:
                delattr(cls, name)  # it was the base class's: uncover it
            else:
                setattr(cls, name, value)
        self._saved.clear()

    # ---- what the patches tell the model
    def on_capture_begin(self, graph: object) -> None:
        with self.lock:
            self.model.capture_begin(id(graph), self.stream_of())

    def on_capture_end(self, graph: object) -> None:
        with self.lock:
            self.model.capture_end(id(graph))

    def on_replay(self, graph: object, stack: tuple[str, ...]) -> None:
        with self.lock:
            self.model.replay(id(graph), self.stream_of(), stack)

    def on_query_done(self, event: int) -> None:
        with self.lock:
            self.model.event_sync(event)

    def on_external_record(self, event: int) -> None:
        with self.lock:
            self.model.external_event(event)

    # ---- the patches
    def _swap(self, cls: type, name: str, make: Callable[[Any], Any]) -> None:
        own = cls.__dict__.get(name)
        self._saved.append((cls, name, own))
        setattr(cls, name, make(own if own is not None else getattr(cls, name)))

    def _patch(self) -> None:
        watch = self

        def capture_begin(old):
            def wrapped(graph, *a, **kw):
                out = old(graph, *a, **kw)
                watch.on_capture_begin(graph)
                return out
            return wrapped

        def capture_end(old):
            def wrapped(graph, *a, **kw):
                try:
                    return old(graph, *a, **kw)
                finally:
                    watch.on_capture_end(graph)
            return wrapped

        def replay(old):
            def wrapped(graph, *a, **kw):
                out = old(graph, *a, **kw)
                watch.on_replay(graph, short_stack(watch.stack_depth, 2))
                return out
            return wrapped

        def query(old):
            def wrapped(event):
                done = old(event)
                if done and event.cuda_event:
                    watch.on_query_done(event.cuda_event)
                return done
            return wrapped

        def init(old):
            # torch makes an event in `__new__`; its `__init__` is object's, which refuses arguments
            # once a class overrides it, so only an `__init__` of torch's own would be called on.
            inherited = old is object.__init__

            def wrapped(event, enable_timing=False, blocking=False, interprocess=False, external=False):
                if not inherited:
                    old(event, enable_timing=enable_timing, blocking=blocking, interprocess=interprocess,
                        external=external)
                if external:
                    setattr(event, _EXTERNAL, True)
            return wrapped

        def record(old):
            def wrapped(event, *a, **kw):
                out = old(event, *a, **kw)
                if getattr(event, _EXTERNAL, False):  # created at its first record: say what it is now
                    watch.on_external_record(event.cuda_event)
                return out
            return wrapped

        graph_cls, event_cls = torch.cuda.CUDAGraph, torch.cuda.Event
        self._swap(graph_cls, "capture_begin", capture_begin)
        self._swap(graph_cls, "capture_end", capture_end)
        self._swap(graph_cls, "replay", replay)
        self._swap(event_cls, "query", query)
        self._swap(event_cls, "__init__", init)
        self._swap(event_cls, "record", record)
