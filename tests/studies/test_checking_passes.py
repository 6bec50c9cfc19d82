"""The harness's own device work per checked replay, counted on the CPU: the kernels a look runs and
the bytes they move (from the tensors' sizes), the batch's counting and packing, and that what they
compute is what the per-replay reductions did.

A look is one elementwise comparison per run of segments and one row reduction per stretch of one row
width, then the row's copy and the cursor: six kernels at the attention shapes, whose bytes are the
arena and ground truth read once and a bool per compared word written and read once. Group counts and
the masks' bits are made once per batch.
"""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from harness.devices.sim import SimDevice
from harness.model.arena import arena_layout
from harness.protocol.layout import plan_layout
from harness.records.scenario import DType, ModelShape, Request, Tolerance
from harness.run.oracle import MASK_ALIGN, Oracle, mask_width, pack_bits, unpack_bits
from harness.studies.checking_speed import attention, checked_replayer, tiny_hybrid

ATTENTION = ModelShape(layers="AAA", hidden=256, heads=2, kv_heads=2, head_dim=128, state=16)
HYBRID = ModelShape(layers="AMAM", hidden=16, heads=2, kv_heads=1, head_dim=8, state=4, conv=3, expand=2,
                    page_size=4, dtype=DType.FP32)


def oracle_of(shape: ModelShape, batch: tuple[Request, ...], tolerance: Tolerance = Tolerance()) -> Oracle:
    arena = arena_layout(plan_layout(shape, batch))
    truth = torch.randn(arena.size, generator=torch.Generator().manual_seed(0)).to(
        torch.bfloat16 if shape.dtype is DType.BF16 else torch.float32)
    return Oracle(arena, truth, tolerance)


# Ops that make a view: metadata, no kernel.
VIEWS = {"aten::slice", "aten::view", "aten::as_strided", "aten::select", "aten::unsqueeze", "aten::alias"}


def top_level_ops(fn) -> list[str]:
    """The aten ops `fn` runs at the top level, views left out, and the dtype casts they make inside
    (on a GPU each is a kernel here: elementwise ops, reductions on given outputs, casts). `any` is
    the exception: on the CPU it casts its input to bool first, on a GPU it reads it as it is
    (PyTorch's get_allany_iter), so its cast is no kernel there."""
    fn()  # once outside the profiler: nothing left to set up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()

    def cast_in(e) -> bool:
        return e.name == "aten::_to_copy" and not (e.cpu_parent.name == "aten::to"
                                                   and e.cpu_parent.cpu_parent is not None
                                                   and e.cpu_parent.cpu_parent.name == "aten::any")

    return [e.name for e in prof.events()
            if (e.cpu_parent is None and e.name.startswith("aten::") and e.name not in VIEWS)
            or (e.cpu_parent is not None and cast_in(e))]


def test_an_attention_look_is_two_compares_and_two_reductions():
    o = oracle_of(ATTENTION, (Request(64, 8), Request(32, 4)))
    mask = torch.zeros(o.mask_width, dtype=torch.bool)
    arena = o.truth.clone()
    ops = top_level_ops(o.comparer(arena, mask))
    # k and v probes in one bit comparison and one reduction (their rows are one width), the output
    # by value in one comparison and one reduction: nothing is allocated, nothing copied.
    assert ops == ["aten::ne", "aten::ne", "aten::any", "aten::any"]
    assert len(ops) == len(o.look_passes())


def test_a_hybrid_look_runs_exactly_its_listed_passes():
    o = oracle_of(HYBRID, (Request(5, 3), Request(2, 6)))
    mask = torch.zeros(o.mask_width, dtype=torch.bool)
    ops = top_level_ops(o.comparer(o.truth.clone(), mask))
    passes = o.look_passes()
    assert len(ops) == len(passes)
    assert ops.count("aten::ne") == sum(p.what.startswith("compare") for p in passes)
    assert ops.count("aten::any") == sum(p.what == "any per unit" for p in passes)


@pytest.mark.parametrize("prefix", [2048])
def test_the_look_reads_arena_and_truth_once_and_a_bool_per_word(prefix):
    s = attention(prefix).scenario
    o = oracle_of(s.model, s.batch)
    arena_bytes = o.truth.numel() * o.truth.element_size()
    passes = o.look_passes()
    total = sum(p.bytes for p in passes)
    # Two reads of the arena's size, then a bool per int64 word written and read back (an eighth
    # each), and a bool per unit and per output element: nothing else.
    words = arena_bytes // 8
    assert total <= 2 * arena_bytes + 2 * words + 4 * o.mask_width + 4 * 32 * s.model.hidden
    assert len(passes) == 4


def test_the_batch_counts_are_each_groups_stale_units():
    o = oracle_of(HYBRID, (Request(5, 3), Request(2, 6)))
    rows, batch = 5, 7
    g = torch.Generator().manual_seed(4)
    masks = torch.zeros((batch, o.mask_width), dtype=torch.bool)
    masks[:, :len(o.units)] = torch.rand((batch, len(o.units)), generator=g) < 0.3
    counts = torch.full((o.counts_size(batch),), -1, dtype=torch.long)
    bits = torch.zeros((batch, o.mask_width // MASK_ALIGN), dtype=torch.uint8)
    o.counter(masks, counts, bits)(rows)
    got = o.counts_of(counts, batch, rows)
    # Each group's count, walked unit by unit.
    want = torch.zeros((rows, len(o.groups)), dtype=torch.long)
    for r in range(rows):
        g_at = -1
        last = None
        for i, u in enumerate(o.units):
            key = (u.kind, u.layer, u.pool)
            if key != last:
                g_at, last = g_at + 1, key
            want[r, g_at] += int(masks[r, i])
    assert torch.equal(got, want)
    for r in range(rows):
        assert torch.equal(unpack_bits(bits[r], len(o.units)), masks[r, :len(o.units)])
    assert len(top_level_ops(lambda: o.counter(masks, counts, bits)(rows))) == len(o.batch_passes(rows))


def test_bits_round_trip_in_rows_of_any_length():
    g = torch.Generator().manual_seed(1)
    for units in (1, 7, 8, 9, 100):
        w = mask_width(units)
        masks = torch.zeros((3, w), dtype=torch.bool)
        masks[:, :units] = torch.rand((3, units), generator=g) < 0.5
        bits = torch.empty((3, w // MASK_ALIGN), dtype=torch.uint8)
        pack_bits(masks, bits)
        for r in range(3):
            assert torch.equal(unpack_bits(bits[r], units), masks[r, :units])
        assert w % MASK_ALIGN == 0 and w >= units


@pytest.mark.parametrize("shape", [tiny_hybrid(), attention(256, layers=2)], ids=["tiny-hybrid", "attention"])
def test_a_replays_look_is_its_compares_its_row_and_the_cursor(shape):
    r = checked_replayer(SimDevice(), shape.scenario)
    obs = r.observer
    ops = top_level_ops(lambda: (obs._compare_into_row(), obs.cursor.zero_()))
    # The compares and reductions, the row's copy, the cursor's step (and the zero_ this test adds).
    assert len(ops) == len(r.oracle.look_passes()) + 3
    assert ops[-3:] == ["aten::index_copy_", "aten::add_", "aten::zero_"]


@pytest.mark.parametrize("infinite_truth", [False, True])
def test_a_tolerance_compares_values_into_the_same_mask(infinite_truth):
    o = oracle_of(HYBRID, (Request(5, 3), Request(2, 6)), Tolerance(rtol=1e-2, atol=1e-3))
    truth = o.truth.clone()
    if infinite_truth:
        truth[-1] = float("inf")  # the last output element: isclose, computed whole
        o = Oracle(arena_layout(plan_layout(HYBRID, (Request(5, 3), Request(2, 6)))), truth,
                   Tolerance(rtol=1e-2, atol=1e-3))
    arena = truth.clone()
    arena[-2] = arena[-2] * (1 + 1e-4)  # within the tolerance
    assert not o.judge(arena).stale
    arena[-2] = arena[-2] + 1.0
    v = o.judge(arena)
    assert v.output_differs and v.stale_units == 1 and not v.stale_reads
