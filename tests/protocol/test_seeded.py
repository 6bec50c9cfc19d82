"""Seeded draws kept once per process (`harness.protocol.seeded`): the same numbers as drawing
afresh, shared where nothing writes them, and a testbed's own where something may."""

from __future__ import annotations

import dataclasses

import torch

from harness.devices.sim import SimDevice
from harness.model.stack import _draw_weights, init_weights
from harness.protocol.pools import HostPool, _draw_host
from harness.protocol.seeded import KEPT
from harness.run.testbed import Testbed
from tests.support.builders import SMALL_HYBRID, small_scenario


def _tensors(weights) -> list[torch.Tensor]:
    layers, final_norm, x = weights
    return [getattr(w, f.name) for w in layers for f in dataclasses.fields(w)] + [final_norm, x]


def test_kept_weights_are_the_numbers_a_fresh_draw_gives():
    testbed = Testbed(small_scenario(seed=5), SimDevice())
    fresh = _draw_weights.__wrapped__(SMALL_HYBRID, testbed.layout.total_new, 5)  # type: ignore[attr-defined]
    kept = init_weights(testbed.layout, 5, torch.device("cpu"))
    assert all(torch.equal(a, b) for a, b in zip(_tensors(kept), _tensors(fresh), strict=True))


def test_testbeds_of_one_shape_and_seed_share_weights_on_the_cpu_but_not_host_pools():
    a, b = (Testbed(small_scenario(seed=11), SimDevice()) for _ in range(2))
    assert a.model.layers[0].w_qkv.data_ptr() == b.model.layers[0].w_qkv.data_ptr()  # nothing writes a weight
    # A hazard or a write-back may write its host pool: each has its own memory, with the same data.
    assert a.host.k.data_ptr() != b.host.k.data_ptr() and torch.equal(a.host.k, b.host.k)
    other = Testbed(small_scenario(seed=12), SimDevice())
    assert not torch.equal(other.host.k, a.host.k) and not torch.equal(other.model.x, a.model.x)


def test_a_host_pool_written_leaves_the_next_one_its_data():
    testbed = Testbed(small_scenario(seed=13), SimDevice())
    kept = testbed.host.k.clone()
    testbed.host.k.fill_(0)
    again = HostPool(SimDevice(), testbed.layout, 13)
    assert torch.equal(again.k, kept)


def test_only_the_last_few_keys_are_kept():
    _draw_host.cache_clear()  # type: ignore[attr-defined]
    shapes = (((2, 3), torch.float32),)
    for seed in range(KEPT + 3):
        _draw_host(shapes, seed)
    assert _draw_host.cache_info().currsize == KEPT  # type: ignore[attr-defined]
