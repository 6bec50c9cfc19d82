"""One `cudaMemcpyBatchAsync` for many host-to-device copies, as sgl_kernel's page-first copy
kernel issues them (sglang-kernel 0.4.9, which sglang 0.5.22 and 0.5.23 pin): on a CUDA 12.8+
driver, a layer's page copies are one runtime call, not a call a page.

Pure over the runtime module it is given (cuda-bindings' `cuda.bindings.runtime`, or a stand-in
in the tests): the attributes are the kernel's (the source read in stream order, host to device),
and a runtime or driver without the call answers `None`, so the caller copies one at a time, as
the kernel falls back to `transfer_page_direct` a page.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.records.errors import CopyFailed

# The driver version (1000 * major + 10 * minor) from which the call exists.
MIN_DRIVER = 12080


class MemcpyBatch:
    """`copy(dsts, srcs, sizes, stream)`: one batched, stream-ordered host-to-device copy."""

    def __init__(self, runtime: Any, device_index: int):
        self._rt = runtime
        attrs = runtime.cudaMemcpyAttributes()
        attrs.srcAccessOrder = runtime.cudaMemcpySrcAccessOrder.cudaMemcpySrcAccessOrderStream
        attrs.srcLocHint.type = runtime.cudaMemLocationType.cudaMemLocationTypeHost
        attrs.srcLocHint.id = 0
        attrs.dstLocHint.type = runtime.cudaMemLocationType.cudaMemLocationTypeDevice
        attrs.dstLocHint.id = device_index
        attrs.flags = 0
        self._attrs = [attrs]
        errors = runtime.cudaError_t
        self._success = errors.cudaSuccess
        # What the kernel answers by copying a page at a time; any other error is an error.
        self._unsupported = {errors.cudaErrorNotSupported, errors.cudaErrorCallRequiresNewerDriver}

    @classmethod
    def load(cls, device_index: int, runtime: Any = None) -> MemcpyBatch | None:
        """The batch call on this host, or None where the bindings, the runtime or the driver lack it."""
        if runtime is None:
            try:
                from cuda.bindings import runtime as bindings
            except ImportError:
                return None
            runtime = bindings
        if not hasattr(runtime, "cudaMemcpyBatchAsync"):
            return None
        try:
            err, version = runtime.cudaDriverGetVersion()
            if err != runtime.cudaError_t.cudaSuccess or version < MIN_DRIVER:
                return None
            return cls(runtime, device_index)
        except (AttributeError, RuntimeError, TypeError):  # bindings of another shape: copy a page at a time
            return None

    def copy(self, dsts: Sequence[int], srcs: Sequence[int], sizes: Sequence[int], stream: int) -> bool:
        """Enqueue the copies on `stream` (a raw handle); False where the call is unsupported (nothing
        was enqueued: copy them one at a time). Any other failure raises."""
        rt = self._rt
        (err,) = rt.cudaMemcpyBatchAsync(list(dsts), list(srcs), list(sizes), len(sizes), self._attrs, [0], 1,
                                         rt.cudaStream_t(stream))
        if err == self._success:
            return True
        if err in self._unsupported:
            return False
        raise CopyFailed(f"cudaMemcpyBatchAsync of {len(sizes)} copies failed: {err}")
