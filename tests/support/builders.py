"""Scenarios and model shapes the tests share: small enough for the simulator to compute on the CPU
in milliseconds, with every layer kind in them."""

from __future__ import annotations

import dataclasses

from harness.records.scenario import Backend, Expect, ModelShape, Request, Scenario

# Attention, Mamba, attention, Mamba: both pools, both accessors, both kinds of load copy.
SMALL_HYBRID = ModelShape(layers="AMAM", hidden=64, heads=2, kv_heads=1, head_dim=32, state=4)
# Two requests of different prefixes: several pages, and a request that ends mid-page.
SMALL_BATCH = (Request(48, 4), Request(16, 2))


def small_scenario(**changes) -> Scenario:
    """A full-graph race on the small hybrid (no fence, no fault); `changes` set any field."""
    base = Scenario("s", SMALL_HYBRID, SMALL_BATCH, Backend.FULL, Expect.RACE)
    return dataclasses.replace(base, **changes)


def shrink(s: Scenario) -> Scenario:
    """The same scenario on the small model (its own layer pattern) and batch."""
    return s.with_overrides(model=dataclasses.replace(SMALL_HYBRID, layers=s.model.layers), batch=SMALL_BATCH)
