"""Scenario definitions: frozen records of what to build, break and expect.

A scenario is model shape x batch x backend x fence x fault x expectation. The
TOML loader and its validation live in `harness.scenario_file`; this module only
holds the records and the closed sets of names.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field, replace


class NamedEnum(str, enum.Enum):
    """An enum whose values are the names used in scenario files and on the CLI."""

    @classmethod
    def names(cls) -> list[str]:
        return [m.value for m in cls]

    def __str__(self) -> str:  # what reports and error messages print
        return self.value


class Backend(NamedEnum):
    EAGER = "eager"  # plain forward; per-layer waits fire in the accessors
    BREAKABLE = "breakable"  # graph segments, pool-reading ops eager between them
    FULL = "full"  # the whole body one CUDA graph: no Python runs on replay


class Fence(NamedEnum):
    NONE = "none"
    FINAL_EVENT = "final_event"  # one wait on the pending load op's final event


class FaultKind(NamedEnum):
    NONE = "none"
    DELAY = "delay"  # a spin on the load stream before layer copies


class DelayWhere(NamedEnum):
    EACH = "each"  # before every layer's copy
    FIRST = "first"  # before layer 0's copy only


class Expect(NamedEnum):
    RACE = "race"
    CLEAN = "clean"


class DType(NamedEnum):
    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"


LAYER_KINDS = {"A": "attention", "M": "mamba"}


@dataclass(frozen=True)
class ModelShape:
    layers: str = "AMAM"  # one letter a layer: A attention (GQA), M Mamba-style
    hidden: int = 256
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    state: int = 16  # SSM state size per channel
    conv: int = 4  # causal conv width
    expand: int = 2  # Mamba inner width = expand * hidden
    page_size: int = 16
    dtype: DType = DType.BF16
    kv_slots: int = 0  # device KV pool token slots; 0 = sized from the batch
    mamba_slots: int = 0  # device Mamba pool slots (slot 0 reserved); 0 = from the batch

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, k in enumerate(self.layers) if k == "A")

    @property
    def mamba_layers(self) -> tuple[int, ...]:
        return tuple(i for i, k in enumerate(self.layers) if k == "M")

    @property
    def d_inner(self) -> int:
        return self.expand * self.hidden

    @property
    def kind(self) -> str:
        """attention, mamba or hybrid: how reports group models."""
        kinds = set(self.layers)
        if kinds == {"A"}:
            return "attention"
        if kinds == {"M"}:
            return "mamba"
        return "hybrid"


@dataclass(frozen=True)
class Request:
    prefix: int  # cached prefix tokens, loaded back from host
    new: int  # new tokens this prefill computes


@dataclass(frozen=True)
class Fault:
    kind: FaultKind = FaultKind.NONE
    us: float = 0.0
    where: DelayWhere = DelayWhere.EACH

    def delay_before(self, layer: int) -> float:
        """Microseconds to spin on the load stream before `layer`'s copy."""
        if self.kind is not FaultKind.DELAY:
            return 0.0
        if self.where is DelayWhere.FIRST and layer != 0:
            return 0.0
        return self.us

    def describe(self) -> str:
        if self.kind is FaultKind.NONE:
            return "none"
        return f"delay {self.us:g}us {self.where.value}"


@dataclass(frozen=True)
class Tolerance:
    """Comparison tolerance against ground truth; exact (0, 0) by default.

    Probes are copies of pool memory, so they are always compared bit-exactly;
    the tolerance applies to the computed outputs and post-prefill Mamba state,
    for kernels that are not deterministic between eager and graph replay.
    """

    rtol: float = 0.0
    atol: float = 0.0

    @property
    def exact(self) -> bool:
        return self.rtol == 0.0 and self.atol == 0.0


@dataclass(frozen=True)
class Scenario:
    name: str
    model: ModelShape
    batch: tuple[Request, ...]
    backend: Backend
    expect: Expect
    fence: Fence = Fence.NONE
    waits: bool = True  # do the pool accessors wait on the per-layer load events
    fault: Fault = field(default_factory=Fault)
    replays: int = 100
    seed: int = 0
    poison: float = float("nan")
    tolerance: Tolerance = field(default_factory=Tolerance)
    source: str = "<inline>"  # the file it came from, for messages

    def describe(self) -> str:
        waits = "" if self.waits else " waits=off"
        return (
            f"{self.model.kind}[{self.model.layers}] {self.backend}+{self.fence}"
            f"{waits} fault={self.fault.describe()}"
        )

    def with_overrides(self, **changes) -> "Scenario":
        return replace(self, **changes)


def kv_slots_needed(shape: ModelShape, batch: tuple[Request, ...]) -> int:
    """KV slots a batch needs: whole pages per request, plus page 0 (padding, never used)."""
    page = shape.page_size
    return page + sum(math.ceil((r.prefix + r.new) / page) * page for r in batch)
