"""The pieces of the engine pools' adapter that need no engine: per-layer tensors indexed as one
stacked tensor, and constructors called by their signature (CPU, no sglang)."""

from __future__ import annotations

import pytest
import torch

from harness.engines.sglang_pools import construct
from harness.protocol.pools import LayerTensors
from harness.records.errors import EngineContractBroken


def test_layer_tensors_index_as_a_stacked_tensor_would():
    stacked = torch.arange(2 * 5 * 3, dtype=torch.float32).view(2, 5, 3)
    layers = LayerTensors([stacked[0].clone(), stacked[1].clone()])
    assert layers[1, 2:4].equal(stacked[1, 2:4]) and layers[0].equal(stacked[0])
    layers[:, 1:3].fill_(-1.0)
    stacked[:, 1:3] = -1.0
    assert all(a.equal(b) for a, b in zip(layers, stacked, strict=True)) and len(layers) == 2


def test_a_constructor_gets_only_what_its_signature_names_and_a_missing_need_is_named():
    class Old:
        def __init__(self, size, *, layer_num, extra=None):
            self.args = (size, layer_num, extra)

    assert construct(Old, size=3, layer_num=2, transfer_layer_id_max=9).args == (3, 2, None)
    with pytest.raises(EngineContractBroken, match="Old requires layer_num"):
        construct(Old, size=3)
