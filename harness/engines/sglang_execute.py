"""The installed SGLang's own `PrefillCudaGraphRunner.execute`, replaying the harness's graph.

`execute` is called unbound on an instance of the engine's own class made without
`__init__` (`object.__new__`), so every `self.method` it reaches is that release's
code: the hidden-state check, the replay session, the shape key, the body replay and
its eager tail, the output trim, and whatever the release does between loading the
batch and replaying (0.5.23 waits there; 0.5.20-0.5.22 do not). The adapter never
names what a release does there.

Stand-ins, only for what needs a server, each the smallest that the code path reads:

- `load_batch` returns the static batch (the engine's own `ForwardBatch`, built from the
  harness's layout) and notes that it was called; where the release's own `load_batch`
  returns (batch, read end), the read end is the engine's default for an attention
  backend that was not audited (`AttentionBackend.shared_read_ends`).
- the backend is the engine's own `FullCudaGraphBackend` (also made without `__init__`)
  holding one graph under the engine's own shape key: the harness's captured graph.
- `model_runner`: the engine's pool (whose `layer_transfer_counter` is the engine's
  counter), no speculative decoding, one pipeline rank, no attention backend, and a model
  whose forward is the body replay (the engine swaps `layer_model.forward` for its replay
  closure) with the body's output as its logits.
- the runner's configuration: the full backend, no chunked-prefix variants, no context
  parallelism, no multimodal or draft inputs (what `__init__` sets for such a server).
- the runtime configuration a release reads (its `model_context`) is published once
  through the engine's own test helper `published_topology`, where the release has one.

Guards against a false clean, checked on every call (an error of the scenario when broken):
one replay of the harness's graph, `load_batch` called; and, from the trace of the traced
replay, no host synchronisation between the load's start and the graph replay.
"""

from __future__ import annotations

import atexit
import contextlib
import inspect
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from harness.engines import sglang as eng
from harness.records.errors import EngineContractBroken
from harness.records.scenario import Backend
from harness.records.trace import HostSync, HostWait, Record, Replay

_published: contextlib.ExitStack | None = None


def publish_runtime_config(engine: eng.Sglang) -> None:
    """Publish a test topology once per process, through the engine's own helper (if it has one)."""
    global _published
    if _published is not None:
        return
    stack = contextlib.ExitStack()
    try:
        helpers = __import__(eng.TEST_UTILS, fromlist=["published_topology"])
        helper = getattr(helpers, "published_topology", None)
    except ImportError:
        helper = None  # a release with no test helpers reads no runtime configuration here
    if helper is not None:
        stack.enter_context(helper())
        atexit.register(stack.close)
    _published = stack


class _CountingGraph:
    """The harness's graph, as the engine's backend holds it: counts its replays."""

    def __init__(self, graph: Any):
        self.graph = graph
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        self.graph.replay()


class _LayerModel:
    """The engine swaps `forward` for its replay closure while `execute` runs."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise EngineContractBroken("the engine ran the body eagerly instead of replaying it")


@dataclass
class _Model:
    """The model's outer forward: the body (replayed by the engine) and its output as logits."""

    layer_model: _LayerModel
    logits_output: type
    shared_experts_config: Any = None

    def forward(self, input_ids: Any, positions: Any, forward_batch: Any, **kwargs: Any) -> Any:
        hidden = self.layer_model.forward(input_ids, positions, forward_batch)
        return self.logits_output(next_token_logits=hidden)


@dataclass
class EngineExecution:
    """One scenario's engine runner around its captured full graph."""

    engine: eng.Sglang
    dev: Any
    graph: _CountingGraph
    runner: Any  # an instance of the engine's PrefillCudaGraphRunner, made without __init__
    static_batch: Any
    batch: Any
    load_batches: int = 0
    extras: dict = field(default_factory=dict)

    @classmethod
    def build(cls, engine: eng.Sglang, dev: Any, graph: Any, model: Any, pool: Any) -> EngineExecution:
        """`model`: the harness's stack (its layout and output buffer); `pool`: what the engine's
        `model_runner.token_to_kv_pool` is (its `layer_transfer_counter`)."""
        m = engine.modules
        runner_mod, batch_mod = m[eng.RUNNER], m[eng.BATCH]
        publish_runtime_config(engine)
        device_module = eng.DeviceModule(dev)
        cls_runner = engine.runner_cls
        runner = object.__new__(cls_runner)
        layer_model = _LayerModel()
        _configure(runner, runner_mod, batch_mod, layer_model)
        runner.device_module = device_module
        runner.model_runner = SimpleNamespace(
            model=_Model(layer_model, runner_mod.LogitsProcessorOutput),
            token_to_kv_pool=pool,
            spec_algorithm=m[eng.SPEC].SpeculativeAlgorithm.NONE,
            pp_group=SimpleNamespace(is_first_rank=True, is_last_rank=True),
            attn_backend=None,
        )
        static_batch = _forward_batch(batch_mod, model)
        counting = _CountingGraph(graph)
        backend = object.__new__(m[eng.BACKEND].FullCudaGraphBackend)
        key = runner._shape_key(len(static_batch.input_ids), static_batch)  # the engine's own key
        backend._graphs = {key: counting}
        backend._outputs = {key: model.probes.out}  # the body's output: what the graph writes last
        backend._device_module = device_module
        runner.backend = backend
        ex = cls(engine, dev, counting, runner, static_batch, _forward_batch(batch_mod, model))
        runner.load_batch = ex._load_batch
        return ex

    # ---- the stand-in for what needs a server -----------------------------------------
    def _load_batch(self, forward_batch: Any, **kwargs: Any) -> Any:
        """The static batch, as the engine's own load_batch leaves it (padding and buffers
        are the graph's, already in place)."""
        self.load_batches += 1
        self.runner.raw_num_tokens = len(forward_batch.input_ids)
        self.runner.raw_bs = forward_batch.batch_size
        if _returns_pair(type(self.runner).load_batch):
            attention = self.engine.modules[eng.ATTENTION].AttentionBackend
            ends = attention.shared_read_ends(None, self.engine.modules[eng.BATCH].ForwardMode.EXTEND)
            return self.static_batch, ends
        return self.static_batch

    # ---- one call ---------------------------------------------------------------------
    def execute(self, waits: bool = True) -> Any:
        """The engine's execute, once; raises EngineContractBroken if a guard is broken."""
        replays, loads = self.graph.replays, self.load_batches
        with _without_waits(self.runner.model_runner.token_to_kv_pool, waits):
            out = type(self.runner).execute(self.runner, self.batch)
        if self.load_batches != loads + 1:
            raise EngineContractBroken(f"execute called load_batch {self.load_batches - loads} times, not once")
        if self.graph.replays != replays + 1:
            raise EngineContractBroken(
                f"execute replayed the harness's graph {self.graph.replays - replays} times, not once"
            )
        return out


def _configure(runner: Any, runner_mod: Any, batch_mod: Any, layer_model: Any) -> None:
    """What `__init__` sets for a full-backend server with every optional feature off."""
    settings = {
        "prefill_backend_name": runner_mod.Backend.FULL,
        "_is_full_backend": True,
        "capture_hidden_mode": batch_mod.CaptureHiddenMode.NULL,
        "_capture_chunked_prefix": False,
        "enable_cp_bcg_capture": False,
        "_input_embeds_arg_idx": None,
        "is_dsv41_model": False,
        "_use_draft_input_embeds": False,
        "_qwen_bcg_hc_sidechannel": False,
        "layer_model": layer_model,
        "buffer_registry": SimpleNamespace(has_slot=lambda name: False),
        # what the piecewise forward context reads: no attention, MoE or quantised layers
        "attention_layers": [],
        "moe_layers": [],
        "moe_fusions": [],
        "dsa_indexers": [],
        "mha_companion_layers": [],
        "quant_config": None,
    }
    for name, value in settings.items():
        setattr(runner, name, value)


def _forward_batch(batch_mod: Any, model: Any) -> Any:
    """The engine's own ForwardBatch for the harness's batch: one extend of every request."""
    import torch  # here: the command line imports this module and must start without torch

    layout = model.layout
    reqs = layout.requests
    seq = [len(r.prefix) + len(r.new) for r in reqs]
    positions = torch.cat([torch.arange(len(r.prefix), len(r.prefix) + len(r.new)) for r in reqs])
    return batch_mod.ForwardBatch(
        forward_mode=batch_mod.ForwardMode.EXTEND,
        batch_size=len(reqs),
        input_ids=torch.zeros(layout.total_new, dtype=torch.long),
        req_pool_indices=torch.arange(len(reqs)),
        seq_lens=torch.tensor(seq),
        out_cache_loc=model.new_slots.cpu(),
        seq_lens_sum=sum(seq),
        positions=positions,
        capture_hidden_mode=batch_mod.CaptureHiddenMode.NULL,
    )


def _returns_pair(load_batch: Any) -> bool:
    """Whether the release's own load_batch returns (batch, read end): read from its signature."""
    ret = inspect.signature(load_batch).return_annotation
    return str(ret).replace("typing.", "").lower().startswith("tuple")


@contextlib.contextmanager
def _without_waits(pool: Any, waits: bool):
    """With waits=False, the engine counter's wait_until does nothing for the block."""
    counter = getattr(pool, "layer_transfer_counter", None)
    if waits or counter is None:
        yield
        return
    counter.wait_until = lambda threshold: None
    try:
        yield
    finally:
        del counter.wait_until  # the class's own method again


def check_no_host_sync(trace: Any, start_event: Any) -> None:
    """No host synchronisation between the load op's start record and the graph replay.

    A host that waited for the load before replaying would make any release look clean.
    """
    ops = trace.ops
    start = next((i for i, op in enumerate(ops) if isinstance(op, Record) and op.event == start_event.id), None)
    if start is None:
        return  # the load started before tracing began: nothing to read
    for op in ops[start + 1:]:
        if isinstance(op, Replay):
            return
        if isinstance(op, (HostSync, HostWait)):
            raise EngineContractBroken(
                f"the host synchronised ({type(op).__name__}) between the load's start and the replay: "
                "a clean result would prove nothing"
            )
    raise EngineContractBroken("no graph replay followed the load's start in the traced replay")


class EngineRun:
    """The runner a fence hands the replay loop: `run()` is one call of the engine's execute."""

    def __init__(self, execution: EngineExecution, op: Any, waits: bool):
        self.execution, self.op, self.waits = execution, op, waits
        self.backend = Backend.FULL

    def run(self) -> None:
        ex = self.execution
        ex.execute(self.waits)
        trace = ex.dev.current_trace
        if trace is not None and self.op is not None:
            check_no_host_sync(trace, self.op.start_event)


class EngineExecuteFence:
    """A fence whose runner is the engine's execute around the scenario's full graph.

    It adds no wait of its own: whatever ordering the replay gets is the release's.
    """

    def __init__(self, engine: eng.Sglang, *, waits: bool = True):
        self.engine, self.waits = engine, waits
        self.execution: EngineExecution | None = None

    def __call__(self, ctx: Any) -> EngineRun:
        graph = getattr(ctx.runner, "graph", None)
        if graph is None:
            raise EngineContractBroken(
                f"the engine's execute replays one full graph; backend {ctx.runner.backend} has none"
            )
        if self.execution is None or self.execution.graph.graph is not graph:
            pool = _pool_of(ctx)
            self.execution = EngineExecution.build(self.engine, ctx.dev, graph, ctx.runner.model, pool)
        return EngineRun(self.execution, ctx.op, self.waits)


def _pool_of(ctx: Any) -> Any:
    """The engine pool the runner's model_runner holds: the model's own when it reads the
    engine's pools, else the smallest pool that carries the counter."""
    engine_pool = getattr(ctx.runner.model.pool, "engine_kv_pool", None)
    return engine_pool if engine_pool is not None else SimpleNamespace(layer_transfer_counter=ctx.counter)


def _strategy(waits: bool, description: str):
    """A fence that is a fresh object per scenario (the harness calls `make()` once each)."""

    def make() -> EngineExecuteFence:
        return EngineExecuteFence(eng.load(), waits=waits)

    make.makes_strategy = True  # type: ignore[attr-defined]
    make.__doc__ = description  # what `fence-harness list fences` says of it
    return make


FENCES = {
    "engine_execute": _strategy(True, "The installed SGLang release's own PrefillCudaGraphRunner.execute around "
                                      "the harness's graph replay (engine = \"sglang\")."),
    # Whatever a release waits on before replay, removed, without naming it (teeth).
    "engine_execute_nowait": _strategy(False, "Mutant: the release's own execute with every wait the engine's "
                                              "counter would enqueue during it dropped."),
}
