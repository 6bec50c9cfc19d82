"""Scenario definitions: frozen records of what to build, break and expect.

A scenario is model shape x batch x backend x fence x fault x expectation. The
TOML loader and its validation live in `harness.input.scenario_file`; this module only
holds the records and the closed sets of names.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path


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


class FaultKind(NamedEnum):
    """The built-in faults' names. What each one does is its strategy's (`harness.faults`, one
    module a fault); `harness.faults.registry.FAULTS` holds every fault by name, these and any a
    project registers, and `Fault.kind` is one of its names."""

    NONE = "none"
    DELAY = "delay"  # a spin on the load stream before layer copies
    GATE = "gate"  # the load stream held until the host releases it, after the replay ran
    JITTER = "jitter"  # seeded random per-layer delays, new ones every replay
    CHUNKED = "chunked"  # each layer's copy split into chunks with gaps: layers land partly
    SWEEP = "sweep"  # the same scenario at each of several delays: detection vs delay
    PRESSURE = "pressure"  # contention from outside the scenario: GEMMs and pinned copies on the device


class Hazard(NamedEnum):
    RAW = "raw"  # read-after-write: a read before the copy lands (stale read)
    WAW = "waw"  # write-after-write: a late Mamba-state copy clobbers the state prefill wrote
    WAR = "war"  # write-after-read: the next batch's load-back overwrites slots a replay still reads
    # The other direction (the write-back) and host buffers; `Scenario.transfer` names the variant.
    STORE = "store_before_compute"  # a D2H backup copy reads slots before the forward wrote them
    REUSE = "reuse_before_backup"  # the next batch writes slots whose D2H backup has not finished
    STAGING = "staging_overwrite"  # a pinned staging buffer refilled while its H2D copy is pending
    # The next forward overwrites slots whose D2H backup has not finished (sgl-project/sglang#38300)
    FORWARD_OVER_BACKUP = "forward_over_backup"
    # The next batch's load-back into pages the forward still writes (sgl-project/sglang#36738)
    RELOAD = "reload_before_write"
    # A deferred Mamba copy-on-write reads a whole slot while it is loaded layer by layer (#36743)
    COW = "mamba_cow"
    # The load into freshly allocated blocks lands before the compute stream's zeroing of them (vllm#50696)
    ZEROING = "load_before_zeroing"


class Pace(NamedEnum):
    """When a replay starts on the device, relative to the one before it."""

    QUEUED = "queued"  # the host runs ahead: a replay's load and forward start together, as
    # soon as the previous replay is done (a busy GPU, as an engine under load sees it)
    IDLE = "idle"  # the device is quiet when the host starts each replay's load, so the load
    # gets a head start of the host's own enqueue time (a lightly loaded engine)


class DelayWhere(NamedEnum):
    EACH = "each"  # before every layer's copy
    FIRST = "first"  # before layer 0's copy only


class CopyDirection(NamedEnum):
    """Which way the pressure fault's pinned copies go (each direction on a stream of its own)."""

    H2D = "h2d"  # host to device: the load-back's own direction, its PCIe lanes and copy engine
    D2H = "d2h"  # device to host: a write-back's
    BOTH = "both"


class PressureProcess(NamedEnum):
    """Where the pressure fault's contention runs."""

    SEPARATE = "separate"  # another process, as another tenant or worker on the GPU: time-sliced contexts
    SAME = "same"  # threads of the harness's own process: its streams share the context with the replay


class Expect(NamedEnum):
    RACE = "race"
    CLEAN = "clean"
    # Every load op landed (the host waited for it), and slots it should have restored still do not
    # hold their host data: a missing or misplaced restore (an engine's load chain), which no ordering
    # fixes. Seen before any replay, in ground truth; no replay runs.
    WRONG = "wrong"


class Evidence(NamedEnum):
    """What can show a race: the data a replay read or wrote, the happens-before analysis of the op
    list, or the check of the captured graph's own nodes and edges."""

    DATA = "data"  # a replay read stale data, or left a wrong post-prefill state or output
    ANALYSIS = "analysis"  # the analyser found an unordered copy/access pair in the op list
    GRAPH = "graph"  # the graph check found a node of a captured graph not ordered after a load (no replay needed)


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
    # A sparse-attention index beside each attention layer's KV (the QSA indexer of Qwen4-Exp models):
    # one compressed index key a run of `indexer` KV slots (the compress ratio; compressed slot =
    # KV slot // indexer), read before the layer's KV. 0: none.
    indexer: int = 0

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

    def index_rows(self, slots: range) -> range:
        """The compressed index slots of a run of KV slots (whole groups of `indexer`)."""
        return range(slots.start // self.indexer, slots.stop // self.indexer)

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
class Pressure:
    """The pressure fault's intensity (`harness.faults.contention` runs it).

    bf16 GEMMs of `gemm` x `gemm` matrices issued back to back on each of `gemm_streams`
    streams, and pinned copies of `copy_mib` MiB in `copy`'s direction(s), each direction back
    to back on a stream of its own; 0 turns either off (not both).
    """

    gemm: int = 8192
    gemm_streams: int = 1
    copy_mib: int = 256
    copy: CopyDirection = CopyDirection.BOTH
    process: PressureProcess = PressureProcess.SEPARATE

    def load_text(self) -> str:
        """The work alone: "GEMM 8192 on 1 stream, 256 MiB both copies"."""
        parts = []
        if self.gemm:
            streams = "stream" if self.gemm_streams == 1 else "streams"
            parts.append(f"GEMM {self.gemm} on {self.gemm_streams} {streams}")
        if self.copy_mib:
            parts.append(f"{self.copy_mib} MiB {self.copy.value} copies")
        return ", ".join(parts)

    def describe(self) -> str:
        return f"{self.load_text()}, {self.process.value} process"


# How each fault kind reads in words: its strategy's `describe`, filled in by `harness.faults.registry`
# as it registers each strategy (the records import no layer above their own; `import harness`
# registers the built-in faults).
FAULT_TEXT: dict[str, Callable[[Fault], str]] = {}


@dataclass(frozen=True)
class Fault:
    """What the injector does to the load stream: the fault's name (`kind`) and its settings. What
    each kind does with them is its strategy's (`harness.faults`); a kind uses the fields it needs.

    us: the delay (delay, each sweep point), the largest random delay (jitter) or
    the gap before each chunk after a layer's first (chunked).
    """

    kind: str = FaultKind.NONE  # a name in harness.faults.registry.FAULTS
    us: float = 0.0
    where: DelayWhere = DelayWhere.EACH  # delay, jitter, sweep: before every layer or layer 0 only
    chunks: int = 1  # chunked: copies per layer
    seed: int = 0  # jitter: the random delays are a function of (seed, replay, layer)
    points: tuple[float, ...] = ()  # sweep: the delays, in microseconds
    hold_us: float = 2000.0  # gate: how long the host holds it when the replay cannot finish
    pressure: Pressure | None = None  # pressure: the contention's intensity (None for other kinds)

    def describe(self) -> str:
        """The fault in words, as its strategy says it ("delay 1000us each"); its name alone for a
        kind no strategy has registered."""
        text = FAULT_TEXT.get(self.kind)
        return text(self) if text is not None else str(self.kind)


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
    fence: str = "none"  # a built-in fence name or a plugin "package.module:callable"
    accessor: str = "per_layer"  # the pool accessors' wait policy (name or plugin)
    schedule: str = "layerwise"  # the load-back schedule (name or plugin)
    hazard: Hazard = Hazard.RAW
    pace: Pace = Pace.QUEUED
    engine: str | None = None  # "sglang": the engine's own code (and its fences "engine_*")
    # (version range, expectation) as the file wrote them; `expect` is the one the installed
    # release of `engine` falls in (see harness.records.releases). None: `expect` as given.
    expect_by_release: tuple[tuple[str, str], ...] | None = None
    # The write-back / staging path for the hazards that use one (harness.protocol.writeback):
    # "engine" or a variant with one defect; None: the engine's.
    transfer: str | None = None
    # With engine = "vllm" and a hazard that backs up: the vLLM connector whose offloading worker
    # stores (`harness.engines.vllm.WRITEBACK_CONNECTORS`); None: OffloadingConnector's.
    connector: str | None = None
    fault: Fault = field(default_factory=Fault)
    # For expect = race: the evidence the race must show (None: any). "data" is for a
    # scenario meant to show the data going wrong, not only the missing ordering.
    evidence: Evidence | None = None
    replays: int = 100
    seed: int = 0
    poison: float = float("nan")
    tolerance: Tolerance = field(default_factory=Tolerance)
    # The device kinds it runs on ("cuda", "sim"); None: every one. Serving shapes are for GPUs:
    # on another device the scenario is skipped, and the run says so.
    devices: tuple[str, ...] | None = None
    # Tensor parallelism (`harness.run.tp`): ranks, one process each, the model's heads and MLP columns
    # split across them and an all-reduce after each block. `fault_ranks`: the ranks the fault runs on
    # (None: every rank); `fence_ranks`: the ranks that run the fence (None: every rank; the others
    # run none).
    tp: int = 1
    fault_ranks: tuple[int, ...] | None = None
    fence_ranks: tuple[int, ...] | None = None
    source: str = "<inline>"  # the file it came from, for messages

    def runs_on(self, device: str) -> bool:
        """Whether this scenario runs on a device of this kind ("cuda" or "sim")."""
        return self.devices is None or device in self.devices

    def skip_reason(self, device: str) -> str | None:
        """Why it does not run on `device`, or None when it does."""
        if self.runs_on(device):
            return None
        return f"runs only on {' / '.join(self.devices or ())} (devices in {self.shown_source}), not on {device}"

    @property
    def shown_source(self) -> str:
        """`source` as a message shows it (`shown_path`)."""
        return shown_path(self.source)

    def describe(self) -> str:
        extra = "".join(
            f" {key}={value}"
            for key, value, default in (
                ("accessor", self.accessor, "per_layer"),
                ("schedule", self.schedule, "layerwise"),
                ("hazard", self.hazard.value, "raw"),
                ("engine", self.engine, None),
                ("transfer", self.transfer, None),
                ("connector", self.connector, None),
                ("tp", self.tp, 1),
                ("fault_ranks", _ranks_text(self.fault_ranks), None),
                ("fence_ranks", _ranks_text(self.fence_ranks), None),
            )
            if value != default
        )
        return (
            f"{self.model.kind}[{self.model.layers}] {self.backend}+{self.fence}"
            f"{extra} fault={self.fault.describe()}"
        )

    def with_overrides(self, **changes) -> Scenario:
        return replace(self, **changes)


def _ranks_text(ranks: tuple[int, ...] | None) -> str | None:
    return None if ranks is None else ",".join(map(str, ranks))


def kv_slots_needed(shape: ModelShape, batch: tuple[Request, ...]) -> int:
    """KV slots a batch needs: whole pages per request, plus page 0 (padding, never used)."""
    page = shape.page_size
    return page + sum(math.ceil((r.prefix + r.new) / page) * page for r in batch)


_INSTALL_DIRS = ("site-packages", "dist-packages")


def shown_path(source: str, cwd: Path | None = None) -> str:
    """A scenario file's path as a message or a committed report shows it: relative to the working
    directory when it lies under it; a file of an installed package (the bundled sets of a wheel)
    from the package's name on (`harness/scenarios/natural.toml`); any other path as given. A skip
    reason or a report then names no folder of the machine that made it."""
    path = Path(source)
    if not path.is_absolute():
        return source
    try:
        return path.resolve().relative_to(Path(cwd or Path.cwd()).resolve()).as_posix()
    except ValueError:
        pass
    parts = path.parts
    installed = [i for i, part in enumerate(parts) if part in _INSTALL_DIRS]
    return "/".join(parts[installed[-1] + 1:]) if installed else source
