"""vLLM's scheduler steps around a KV connector that is not the harness's (vLLM's own
`OffloadingConnector`, a user's): what a real engine gives the connector, and when it runs the
forward that reads what the connector loads.

What the engine gives it, as vLLM's engine core and model runner do:

- the model's KV cache configuration, vLLM's `KVCacheConfig`: one full-attention group
  (`FullAttentionSpec`: the harness's KV heads, head size, dtype, a block of one slot) of the
  harness's attention layers, one `KVCacheTensor` a layer; vLLM's factory hands it to both roles
  (`ensure_kv_transfer_initialized(vllm_config, kv_cache_config)` for the worker,
  `KVConnectorFactory.create_connector(vllm_config, SCHEDULER, kv_cache_config)` for the scheduler);
- the KV caches, registered with the worker's connector in the layers' backend's shape, and the
  layers in the config's forward context (`harness.engines.vllm_pools`), and the compiled copy,
  streams and events of vLLM's offloading handlers (`harness.engines.vllm_handlers`), while the
  connector's calls run;
- vLLM's `Request`s (prompt token ids, block hashes by vLLM's own `get_request_block_hasher` over
  its `sha256`), their blocks (`KVCacheBlocks` of `KVCacheBlock`s: the layout's slots, a block a
  slot) and each step's `SchedulerOutput`; each step the model runner's order:
  `bind_connector_metadata(build_connector_meta(output))`, `start_load_kv` inside vLLM's own
  `set_forward_context`, the forward, `wait_for_save`, `get_finished(finished_req_ids)`,
  `clear_connector_metadata`, and the scheduler's `update_connector_output`.

Set-up (`offload_prefixes`): each request's cached prefix was computed and offloaded by an earlier
request with the same prefix: the harness puts the host pool's data in the prefix slots (the
earlier forward, finished), then that request is scheduled whole and finishes, through the
connector's own store path, until its worker reports the store finished.

Each load op (`load`): for every request of the batch (its prompt: the prefix, then the new
tokens), `get_num_new_matched_tokens(request, 0)` (the connector's prefix hit, and whether it loads
asynchronously), `update_state_after_alloc` with the prefix slots as the request's blocks, then
the step: the connector's metadata, `start_load_kv`, on the scheduling (forward) stream.

When the request's forward runs is vLLM's scheduler's decision, from the connector's answer:
a synchronous load is in the load's own step (the forward right after `start_load_kv`); an
asynchronous one (`load_kv_async`) keeps the request waiting (`WAITING_FOR_REMOTE_KVS`) until the
worker's `get_finished` reports it loaded, in a later step (`before_forward`: the host polls the
worker, step by step). `same_step` is the teeth: the forward in the load's own step whatever the
connector answered, so that only the connector's own hooks can order it.

A request is retired (`retire`, before the next load op, and at the end): the worker reports its
load finished, the scheduler hears it (`update_connector_output`) and the request finishes
(`request_finished`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.devices.base import Device, Event, Gate, dtype_of
from harness.engines.engine import construct
from harness.engines.vllm_handlers import HandlerDevice
from harness.faults.plan import FaultPlan
from harness.protocol.counter import LoadCounter
from harness.protocol.layout import Layout, RequestSlots
from harness.protocol.loadback import plan_copies
from harness.protocol.pools import HostPool
from harness.protocol.schedules import LayerListener, LoadOp
from harness.records.errors import EngineContractBroken

FACTORY = "vllm.distributed.kv_transfer.kv_connector.factory"
BASE = "vllm.distributed.kv_transfer.kv_connector.v1.base"
KV_CACHE = "vllm.v1.kv_cache_interface"
REQUEST = "vllm.v1.request"
BLOCKS = "vllm.v1.core.kv_cache_utils"
MANAGER = "vllm.v1.core.kv_cache_manager"
OUTPUT = "vllm.v1.core.sched.output"
OUTPUTS = "vllm.v1.outputs"
HASHING = "vllm.utils.hashing"
SAMPLING = "vllm.sampling_params"
NEEDED = {
    FACTORY: ("KVConnectorFactory.create_connector",),
    BASE: ("KVConnectorRole.SCHEDULER",),
    KV_CACHE: ("FullAttentionSpec", "KVCacheTensor", "KVCacheGroupSpec", "KVCacheConfig"),
    REQUEST: ("Request",),
    BLOCKS: ("get_request_block_hasher", "init_none_hash", "KVCacheBlock"),
    MANAGER: ("KVCacheBlocks",),
    OUTPUT: ("SchedulerOutput.make_empty", "NewRequestData.from_request"),
    OUTPUTS: ("KVConnectorOutput",),
    HASHING: ("sha256",),
    SAMPLING: ("SamplingParams",),
}
# A request's token ids: request j's prefix and new tokens, distinct from every other request's.
TOKENS_PER_REQUEST = 1_000_000


def kv_cache_config(engine: Any, layout: Layout, names: dict[int, str], block_size: int) -> Any:
    """vLLM's `KVCacheConfig` of the harness's model: one full-attention group, a tensor a layer."""
    kv = engine.module(KV_CACHE)
    s = layout.shape
    spec = kv.FullAttentionSpec(block_size=block_size, num_kv_heads=s.kv_heads, head_size=s.head_dim,
                                dtype=dtype_of(s.dtype))
    blocks = layout.kv_slots // block_size
    layers = [names[lid] for lid in s.attention_layers]
    return kv.KVCacheConfig(num_blocks=blocks,
                            kv_cache_tensors=[kv.KVCacheTensor(size=spec.page_size_bytes * blocks, shared_by=[n])
                                              for n in layers],
                            kv_cache_groups=[kv.KVCacheGroupSpec(layers, spec)])


@dataclass
class Pending:
    """The requests of the last load op, until retired."""

    requests: list[Any]
    blocks: list[list[int]]
    asynchronous: bool
    op: LoadOp
    loaded: set[str] = field(default_factory=set)  # the worker's get_finished has reported them
    in_step: bool = True  # the load's own step has not yet ended (wait_for_save, get_finished)


@dataclass
class Decisions:
    """What the connector answered and what the scheduler did, over a scenario (connector-check's report)."""

    asynchronous: list[bool] = field(default_factory=list)  # per request: the connector's load_kv_async
    polls: int = 0  # worker get_finished calls before a forward that waited for its load
    forwards_after_report: int = 0  # forwards run once the worker had reported their requests loaded
    forwards_in_step: int = 0  # forwards run in their load's own step


class VllmScheduler:
    """The scheduler's side of one scenario's connector (see the module's text)."""

    def __init__(self, engine: Any, dev: Device, layout: Layout, names: dict[int, str], config: Any,
                 kv_config: Any, worker: Any, handlers: HandlerDevice, counter: LoadCounter,
                 forward_context: Callable[[], Any], timeout_s: float = 30.0):
        self.engine, self.dev, self.layout = engine, dev, layout
        self.modules = m = {name: engine.module(name) for name in NEEDED}  # imported and checked by the loader
        self.worker, self.handlers, self.counter = worker, handlers, counter
        self.forward_context, self.timeout_s = forward_context, timeout_s
        self.connector = m[FACTORY].KVConnectorFactory.create_connector(
            config=config, role=m[BASE].KVConnectorRole.SCHEDULER, kv_cache_config=kv_config)
        self.block_size = int(config.cache_config.block_size)
        hash_fn = m[HASHING].sha256
        m[BLOCKS].init_none_hash(hash_fn)
        self.hasher = m[BLOCKS].get_request_block_hasher(self.block_size, hash_fn)
        self.loaded = [r for r in layout.requests if len(r.prefix)]
        self.same_step = False  # the teeth: the forward in the load's own step, whatever the connector said
        self.pending: Pending | None = None
        self.decisions = Decisions()
        self._ids = 0

    # ---- vLLM's objects ------------------------------------------------------------------
    def _request(self, j: int, r: RequestSlots, whole: bool) -> Any:
        """Request j: its prefix's token ids, and (`whole`) its new tokens' after them."""
        n = len(r.prefix) + (len(r.new) if whole else 0)
        self._ids += 1
        m = self.modules
        return construct(m[REQUEST].Request, request_id=f"harness-{self._ids}",
                         prompt_token_ids=[1 + j * TOKENS_PER_REQUEST + t for t in range(n)],
                         sampling_params=m[SAMPLING].SamplingParams(max_tokens=1), pooling_params=None,
                         eos_token_id=None, block_hasher=self.hasher)

    def _blocks(self, slots: range) -> tuple[Any, list[int]]:
        """The request's blocks: a block a slot (vLLM's `KVCacheBlocks`, and their ids)."""
        ids = list(range(slots.start // self.block_size, slots.stop // self.block_size))
        return self.modules[MANAGER].KVCacheBlocks(([self.modules[BLOCKS].KVCacheBlock(i) for i in ids],)), ids

    def _output(self, scheduled: Sequence[tuple[Any, list[int], int]] = (), finished: set[str] | None = None) -> Any:
        """A step's `SchedulerOutput`: the requests scheduled for the first time (request, block
        ids, tokens scheduled) and the requests finished since the last step."""
        m = self.modules
        out = m[OUTPUT].SchedulerOutput.make_empty()
        out.scheduled_new_reqs = [m[OUTPUT].NewRequestData.from_request(req, (ids,)) for req, ids, _ in scheduled]
        out.num_scheduled_tokens = {req.request_id: n for req, _, n in scheduled}
        out.total_num_scheduled_tokens = sum(n for _, _, n in scheduled)
        out.finished_req_ids = set(finished or ())
        return out

    # ---- one step, as the model runner runs it -------------------------------------------
    def _begin_step(self, output: Any) -> None:
        meta = self.connector.build_connector_meta(output)
        with self.handlers.patched(), self.forward_context():
            self.worker.bind_connector_metadata(meta)
            self.worker.start_load_kv(self.engine.module("vllm.forward_context").get_forward_context())

    def _end_step(self, finished: Collection[str] = ()) -> tuple[set[str], set[str]]:
        with self.handlers.patched():
            self.worker.wait_for_save()
            sending, recving = self.worker.get_finished(set(finished))
            self.worker.clear_connector_metadata()
        out = self.modules[OUTPUTS].KVConnectorOutput(finished_sending=set(sending or ()),
                                                       finished_recving=set(recving or ()))
        self.connector.update_connector_output(out)
        return set(sending or ()), set(recving or ())

    def _step(self, output: Any) -> tuple[set[str], set[str]]:
        self._begin_step(output)
        return self._end_step(output.finished_req_ids)

    # ---- set-up: the prefixes offloaded by earlier requests ------------------------------
    def offload_prefixes(self, host: HostPool, pools: Any) -> None:
        """Each loaded request's prefix, computed by an earlier request and stored by the connector."""
        dev = self.dev
        for layer in plan_copies(self.layout, host, pools):  # the earlier forward's writes, finished
            for chunk in layer:
                for c in chunk:
                    dev.copy_async(c.dst, c.src, c.region)
        dev.synchronize(self.timeout_s)
        earlier = []
        for j, r in enumerate(self.layout.requests):
            if not len(r.prefix):
                continue
            req = self._request(j, r, whole=False)
            blocks, ids = self._blocks(r.prefix)
            self.connector.get_num_new_matched_tokens(req, 0)  # nothing offloaded yet
            self.connector.update_state_after_alloc(req, blocks, 0)
            earlier.append((req, ids, len(r.prefix)))
        self.handlers.begin_load(None)
        self._step(self._output(earlier))  # the earlier requests' prefill: their blocks are stored from here on
        done = {req.request_id for req, _, _ in earlier}
        for req, ids, _ in earlier:
            self.connector.request_finished(req, ids)
        stored: set[str] = set()
        deadline = time.monotonic() + self.timeout_s
        while not done <= stored:
            sending, _ = self._step(self._output(finished=done - stored))
            stored |= sending
            dev.synchronize(self.timeout_s)
            if time.monotonic() > deadline:
                raise EngineContractBroken(f"the connector's worker never reported the prefixes' stores finished "
                                           f"({len(done - stored)} of {len(done)} requests)")

    # ---- a load op ---------------------------------------------------------------------------
    def load(self, fault: FaultPlan, gate: Gate | None, listeners: Sequence[LayerListener], stream: Any) -> LoadOp:
        """The batch's requests, their prefixes loaded by the connector: one load op."""
        self.retire()
        requests, blocks, answers, scheduled = [], [], [], []
        for j, r in enumerate(self.layout.requests):
            if not len(r.prefix):
                continue
            req = self._request(j, r, whole=True)
            hit, asynchronous = self.connector.get_num_new_matched_tokens(req, 0)
            if hit != len(r.prefix):
                raise EngineContractBroken(f"the connector's scheduler found {hit} of request {j}'s "
                                           f"{len(r.prefix)} offloaded prefix tokens")
            cache_blocks, ids = self._blocks(r.prefix)
            self.connector.update_state_after_alloc(req, cache_blocks, hit)
            requests.append(req)
            blocks.append(ids)
            answers.append(bool(asynchronous))
            if not asynchronous:  # scheduled in this step: its new tokens computed by this step's forward
                scheduled.append((req, ids, len(r.new)))
        if len(set(answers)) > 1:
            raise EngineContractBroken("the connector loads some of one batch's requests asynchronously and some not")
        self.decisions.asynchronous += answers
        op = LoadOp(self.dev, stream, None, [], fault, -1, self.layout, gate, listeners)
        op.index = self.counter.update_producer()
        op.attach_events(self.counter.events[op.index])
        op.start_event.record()  # on the scheduling stream, as the harness's own load op records it
        self.handlers.begin_load(op)
        loads = self.handlers.loads
        self._begin_step(self._output(scheduled))
        if self.handlers.loads == loads:
            raise EngineContractBroken("the connector's start_load_kv loaded nothing of the batch's offloaded prefixes")
        self.pending = Pending(requests, blocks, answers[0] if answers else False, op)
        if self.pending.asynchronous:  # the load's own step runs no forward for these requests
            self._end_pending_step()
        return op

    def _end_pending_step(self) -> None:
        p = self.pending
        assert p is not None
        if p.in_step:
            p.in_step = False
            p.loaded |= self._end_step()[1]
            self.handlers.begin_load(None)

    def before_forward(self, host_wait: Callable[[Event], None]) -> None:
        """The scheduler runs the batch's forward: at once for a synchronous load (or `same_step`),
        else once the worker's `get_finished` has reported every request of it loaded, the host
        polling step by step (and waiting meanwhile for the load's copies, which opens a gate)."""
        p = self.pending
        if p is None:
            return
        if not p.asynchronous or self.same_step:
            self.decisions.forwards_in_step += 1
            return
        self._poll(p, host_wait)
        self.decisions.forwards_after_report += 1

    def _poll(self, p: Pending, host_wait: Callable[[Event], None]) -> None:
        ids = {r.request_id for r in p.requests}
        deadline = time.monotonic() + self.timeout_s
        waited = False
        while not ids <= p.loaded:
            self.decisions.polls += 1
            p.loaded |= self._step(self._output())[1]
            if ids <= p.loaded:
                break
            if not waited:  # the engine runs other steps meanwhile; here the host waits for the copies
                host_wait(p.op.finish_event)
                waited = True
            elif time.monotonic() > deadline:
                raise EngineContractBroken(f"the connector's worker never reported {len(ids - p.loaded)} of "
                                           f"{len(ids)} requests loaded after their copies landed")

    def retire(self) -> None:
        """The last load op's requests finish: their loads reported, then `request_finished`."""
        p = self.pending
        if p is None:
            return
        self._end_pending_step()
        self._poll(p, self._host_wait)
        for req, ids in zip(p.requests, p.blocks, strict=True):
            self.connector.request_finished(req, ids)
        self.pending = None

    def _host_wait(self, event: Event) -> None:
        if not self.dev.host_wait(event, self.timeout_s):
            raise EngineContractBroken(f"the connector's load did not land within {self.timeout_s:g}s")
