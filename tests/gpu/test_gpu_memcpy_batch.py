"""The batched host-to-device copy on a real GPU: pages from pinned host memory land where they
should, in one `cudaMemcpyBatchAsync`, traced or not, and in stream order behind earlier work."""

from __future__ import annotations

import pytest
import torch

from harness.records.trace import Copy, Region

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cuda():
    from harness.devices.cuda import CudaDevice

    dev = CudaDevice()
    if dev._batch is None:
        pytest.skip("no cudaMemcpyBatchAsync here (cuda-bindings missing or a driver before 12.8)")
    return dev


def _pages(dev, pages=64, rows=16, width=1024):
    host = torch.randn(pages, rows, width).to(torch.bfloat16).pin_memory()
    dst = torch.zeros(pages * rows, width, dtype=torch.bfloat16, device=dev.torch_device)
    order = torch.randperm(pages).tolist()  # scattered pages, as the page-first pool holds them
    copies = [(dst[i * rows:(i + 1) * rows], host[p], Region("k", 0, i * rows, (i + 1) * rows), None)
              for i, p in enumerate(order)]
    want = torch.cat([host[p] for p in order]).to(dev.torch_device)
    return copies, dst, want


@pytest.mark.parametrize("traced", [False, True])
def test_a_batch_lands_every_page(cuda, traced, monkeypatch):
    calls = []
    real = cuda._batch.copy
    monkeypatch.setattr(cuda._batch, "copy", lambda *a: calls.append(len(a[2])) or real(*a))
    copies, dst, want = _pages(cuda)
    load = cuda.Stream("load")
    if traced:
        with cuda.tracing() as trace, cuda.stream(load):
            cuda.copy_batch_async(copies)
        assert len([op for op in trace.ops if isinstance(op, Copy)]) == len(copies)
    else:
        with cuda.stream(load):
            cuda.copy_batch_async(copies)
    cuda.synchronize()
    assert calls == [len(copies)]  # one call, every page
    torch.testing.assert_close(dst, want, rtol=0, atol=0)


def test_a_batch_runs_in_stream_order_behind_earlier_work(cuda):
    # A sleep enqueued first holds the batch: read at once (torch's streams do not wait on each
    # other), nothing has landed; once the device is done, every page has.
    copies, dst, want = _pages(cuda)
    load = cuda.Stream("load")
    with cuda.stream(load):
        cuda.delay(20_000)
        cuda.copy_batch_async(copies)
    assert not torch.equal(dst.cpu(), want.cpu())  # read at once, on another stream: not landed
    cuda.synchronize()
    torch.testing.assert_close(dst, want, rtol=0, atol=0)
