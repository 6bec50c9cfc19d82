"""The batched host-to-device copy (`harness.devices.memcpy_batch`) against a stand-in runtime:
the attributes sgl_kernel's page-first kernel passes, the fall-back answers, the driver gate;
and the engine's hybrid chain issuing a layer's pages as one batch (on the simulator)."""

from __future__ import annotations

import enum
from types import SimpleNamespace

import pytest

from harness.devices.memcpy_batch import MIN_DRIVER, MemcpyBatch
from harness.records.errors import CopyFailed


class Err(enum.Enum):
    cudaSuccess = 0  # noqa: N815
    cudaErrorInvalidValue = 1  # noqa: N815
    cudaErrorCallRequiresNewerDriver = 36  # noqa: N815
    cudaErrorNotSupported = 801  # noqa: N815


class Runtime:
    """What the module calls of cuda-bindings' runtime, recording each batch."""

    cudaError_t = Err  # noqa: N815
    cudaMemcpySrcAccessOrder = SimpleNamespace(cudaMemcpySrcAccessOrderStream="stream-order")  # noqa: N815
    cudaMemLocationType = SimpleNamespace(  # noqa: N815
        cudaMemLocationTypeHost="host", cudaMemLocationTypeDevice="device")

    def __init__(self, driver: int = 13000, answer: Err = Err.cudaSuccess):
        self.driver, self.answer, self.calls = driver, answer, []

    @staticmethod
    def cudaMemcpyAttributes():  # noqa: N802
        return SimpleNamespace(srcLocHint=SimpleNamespace(), dstLocHint=SimpleNamespace())

    def cudaDriverGetVersion(self):  # noqa: N802
        return Err.cudaSuccess, self.driver

    @staticmethod
    def cudaStream_t(handle):  # noqa: N802
        return ("stream", handle)

    def cudaMemcpyBatchAsync(self, dsts, srcs, sizes, count, attrs, idxs, n_attrs, stream):  # noqa: N802
        self.calls.append((dsts, srcs, sizes, count, attrs, idxs, n_attrs, stream))
        return (self.answer,)


def test_one_call_carries_every_copy_with_the_kernels_attributes():
    rt = Runtime()
    batch = MemcpyBatch.load(3, rt)
    assert batch is not None and batch.copy([10, 20], [1, 2], [64, 64], 77)
    ((dsts, srcs, sizes, count, attrs, idxs, n_attrs, stream),) = rt.calls
    assert (dsts, srcs, sizes, count, idxs, n_attrs, stream) == ([10, 20], [1, 2], [64, 64], 2, [0], 1, ("stream", 77))
    (a,) = attrs
    assert a.srcAccessOrder == "stream-order" and a.flags == 0  # in stream order, as the kernel asks
    assert (a.srcLocHint.type, a.dstLocHint.type, a.dstLocHint.id) == ("host", "device", 3)


@pytest.mark.parametrize("answer", [Err.cudaErrorNotSupported, Err.cudaErrorCallRequiresNewerDriver])
def test_unsupported_answers_false_so_the_caller_copies_one_at_a_time(answer):
    assert MemcpyBatch(Runtime(answer=answer), 0).copy([1], [2], [8], 5) is False


def test_any_other_failure_is_an_error_naming_it():
    with pytest.raises(CopyFailed, match="cudaMemcpyBatchAsync of 1 copies failed: .*InvalidValue"):
        MemcpyBatch(Runtime(answer=Err.cudaErrorInvalidValue), 0).copy([1], [2], [8], 5)


def test_no_batch_below_the_driver_that_has_it_or_without_the_call():
    assert MemcpyBatch.load(0, Runtime(driver=MIN_DRIVER - 10)) is None
    assert MemcpyBatch.load(0, Runtime(driver=MIN_DRIVER)) is not None
    assert MemcpyBatch.load(0, SimpleNamespace(cudaError_t=Err)) is None  # bindings without the call
    odd = SimpleNamespace(cudaError_t=Err, cudaMemcpyBatchAsync=None, cudaDriverGetVersion=lambda: (Err.cudaSuccess,
                                                                                                    MIN_DRIVER))
    assert MemcpyBatch.load(0, odd) is None  # no attribute types: bindings of another shape


def test_the_base_device_copies_a_batch_one_at_a_time_in_order():
    import torch

    from harness.devices.sim import SimDevice
    from harness.records.trace import Copy, Region

    dev = SimDevice()
    dst = torch.zeros(4)
    src = torch.arange(4.0)
    copies = [(dst[i:i + 1], src[i:i + 1], Region("k", 0, i, i + 1), None) for i in range(4)]
    with dev.tracing() as trace:
        with dev.stream(dev.Stream("load")):
            dev.copy_batch_async(copies)
    dev.synchronize()
    assert torch.equal(dst, src)
    assert [op.dst for op in trace.ops if isinstance(op, Copy)] == [c[2] for c in copies]
