"""The one replay loop: every front end that replays (run, repro, mutants, fences, bench,
soak, the pytest plugin) runs these steps, and ground truth runs them with the host
waiting in between.

One replay, on the forward stream:

1. the hazard prepares the slots the load op writes (poison, or resident data), and
   the probe arena is poisoned;
2. the load op starts (`start_loading`: the start event here, the schedule on the
   load stream, with the fault's delays or the gate), then the hazard's work while the load
   lands (a deferred copy-on-write);
3. the fence runs (it may enqueue waits, block the host, or pick another runner);
4. the forward (a graph replay, graph segments, or eager steps);
5. the hazard's work after the forward (write-after-read: the next batch's load;
   the write-back hazards: the write-back, and the next batch's reuse or refill);
6. the gate opens (once the forward has run, or after `hold_us` when a correct fence
   keeps it waiting);
7. the harness's observation: the forward stream first waits for every stream the
   harness made (`Device.join`: the whole device's work so far, so a copy that no event
   covers cannot hide), then collects the post-prefill state and compares the arena with
   ground truth into this replay's row of a batch, all on the device.

Replays are checked in batches: the host enqueues replay after replay while the device
runs them (as an engine's scheduler runs ahead of a busy GPU), and synchronises once per
batch to read every row (the batch's group counts, and its unit masks as bits when a replay
was stale); each verdict is still its own replay's, built while the next batch runs. So a replay's load op and
forward start together on the device, once the previous replay's observation is done
(`pace = "queued"`, the default). With `pace = "idle"` every replay starts on a quiet device,
and the load gets a head start of the host's own enqueue time; a gate needs the host once
per replay too; so does a hazard that prepares host memory (a write-back's host copy, a staging
buffer), which the host must not rewrite while the previous replay still reads it. Those run one
replay per batch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.devices.base import Device, Event, Gate, Graph, Stream
from harness.faults.plan import FaultPlan
from harness.faults.registry import fault_strategy
from harness.model.runners import EagerRunner, Runner
from harness.protocol.accessors import per_layer
from harness.protocol.fences import FenceContext
from harness.protocol.hazards import Racing
from harness.protocol.schedules import LoadOp, layerwise
from harness.records.errors import (
    GateTimeout,
    GateUnavailable,
    NotRestored,
    PluginError,
    ReplayTimeout,
)
from harness.records.scenario import Fault, Pace
from harness.run.oracle import Oracle, ReplayVerdict
from harness.run.testbed import Testbed


class Marks:
    """Timing markers one replay leaves on the forward stream (read them once it has finished).

    A marker taken again is recorded again (`Device.mark`'s `reuse`): a replay loop that keeps
    one `Marks` per batch row allocates nothing per replay."""

    def __init__(self) -> None:
        self.begin: Any = None  # before the harness poisons
        self.start: Any = None  # before the load op starts
        self.launch: Any = None  # where the forward could start: after the fence
        self.end: Any = None  # after the forward
        self.joined: Any = None  # after the forward stream joined every stream: load + replay done
        self.looked: Any = None  # after the harness's look (collect and compare)

    def take(self, dev: Device, stream: Stream, at: str) -> None:
        setattr(self, at, dev.mark(stream, getattr(self, at)))


class _Unmarked(Marks):
    def take(self, dev: Device, stream: Stream, at: str) -> None:
        pass


UNMARKED = _Unmarked()  # a replay that is not timed


def armed(tb: Testbed, timeout_s: float) -> tuple[Oracle, Runner]:
    """What every replay loop starts from: the testbed's ground truth, then the accessor's waits,
    the fence's set-up and the runner (its graph captured), with the device quiet."""
    oracle = ground_truth(tb, timeout_s)
    tb.set_waits(tb.accessor)
    tb.setup_fence()
    runner = tb.runner(tb.scenario.backend)
    tb.dev.synchronize(timeout_s)
    return oracle, runner


def ground_truth(tb: Testbed, timeout_s: float) -> Oracle:
    """The replay's steps with every load landed (host-synced) before the eager forward.

    Always the engine's own load op and accessor waits: the truth must not depend on
    the variant under test. Where an engine's load chain ran that load op, the slots it should
    have restored are checked against their host data first: slots it left otherwise make the
    scenario `wrong` (NotRestored), since a reference that reads them is no truth.
    """
    dev = tb.dev
    tb.set_waits(per_layer)
    arena = tb.model.probes.arena
    truth = torch.empty_like(arena)
    plan = FaultPlan(Fault())
    with dev.stream(tb.forward):
        tb.hazard.prepare(tb.bed)
        # The preparation lands before the load starts: an engine's load may not be ordered after the
        # forward stream (vLLM before #50696 is not), and a truth that raced it would be no truth.
        dev.synchronize(timeout_s)
        op = tb.start_load(plan, schedule=layerwise)
        dev.synchronize(timeout_s)
        unrestored = tb.unrestored()
        if unrestored:
            raise NotRestored(unrestored)
        tb.hazard.before_forward(tb.bed, op, truth=True)
        EagerRunner(dev, tb.model, tb.counter).run()
        tb.hazard.after_forward(tb.bed, plan, tb.other_load(layerwise), truth=True)
        dev.synchronize(timeout_s)
        tb.model.collect_final_state()
        dev.launch(lambda: truth.copy_(arena), what="ground truth")
    dev.synchronize(timeout_s)
    tb.counter.set_consumer(-1)
    return Oracle(tb.model.probes.layout, truth, tb.scenario.tolerance)


def open_gate(tb: Testbed, timeout_s: float) -> tuple[Gate | None, Fault, str | None]:
    """The gate a gate fault needs, or the long delay that stands in for it, and which."""
    fault = tb.scenario.fault
    strategy = fault_strategy(fault)
    if not strategy.gates:
        return None, fault, None
    try:
        # The watchdog fires well inside the replay timeout, so a stuck gate is
        # reported as itself and not as a hung replay.
        gate = tb.dev.gate(timeout_s / 2)
    except GateUnavailable as e:
        stand_in = strategy.stand_in(fault)
        return None, stand_in, f"{stand_in.describe()} (gate fallback: {e})"
    return gate, fault, f"gate ({gate.mode})"


class _Gating:
    """What a gate fault does around one replay: it holds the load stream, or (write-after-read)
    the forward; the harness opens it once the racing side has landed, or after `hold_us` when a
    correct fence keeps that from happening."""

    def __init__(self, tb: Testbed, gate: Gate):
        self.tb, self.gate = tb, gate
        self.on_forward = tb.hazard.holds_forward
        self.on_hazard = tb.hazard.holds_own
        self.on_compute = tb.hazard.holds_compute
        self.hold_s = tb.scenario.fault.hold_us * 1e-6

    @property
    def on_load(self) -> Gate | None:
        """The gate a load op's schedule holds (`LoadOp.hold`), or None."""
        return None if self.on_forward or self.on_hazard or self.on_compute else self.gate

    @property
    def for_hazard(self) -> Gate | None:
        """The gate a hazard holds on a stream of its own (the write-back's), or None."""
        return self.gate if self.on_hazard else None

    def before_prepare(self) -> None:
        if self.on_compute:
            self.gate.hold()

    def before_forward(self) -> None:
        if self.on_forward:
            self.gate.hold()

    def after_forward(self) -> None:
        self.tb.ran.record()

    def open(self, op: LoadOp | None, racing: Racing | None) -> None:
        # Held where the harness knows (a schedule that holds it unseen is the watchdog's). Held before
        # the preparation, it is the load op that must land first.
        if self.on_forward or self.on_hazard or self.on_compute or (op is not None and op.held):
            self.tb.dev.host_wait(self._must_run_first(op, racing), self.hold_s)
            self.gate.release()

    def _must_run_first(self, op: LoadOp | None, racing: Racing | None) -> Event:
        """What a correct fence lets run before the held side: the hazard's racing work, else the load
        op (held before the preparation), else the forward."""
        if racing is not None:
            return racing.finish_event
        if self.on_compute and op is not None:
            return op.finish_event
        return self.tb.ran

    def release(self) -> None:
        self.gate.release()

    def check(self, i: int) -> None:
        if self.gate.timed_out:
            raise GateTimeout(
                f"gate-timeout in replay {i}: a gate was never opened; "
                f"its watchdog opened it after {self.gate.timeout_s:g}s"
            )


class _NoGate(_Gating):
    def __init__(self) -> None:
        self.on_forward = self.on_hazard = False

    @property
    def on_load(self) -> Gate | None:
        return None

    def before_prepare(self) -> None:
        pass

    def before_forward(self) -> None:
        pass

    def after_forward(self) -> None:
        pass

    def open(self, op: LoadOp | None, racing: Racing | None) -> None:
        pass

    def release(self) -> None:
        pass

    def check(self, i: int) -> None:
        pass


class _Observer:
    """The harness's own look at a replay: poison the probes first; at the end, once the forward
    stream has joined every stream (every copy enqueued so far has landed before it looks),
    collect and compare on the device into the replay's row of the batch.

    Both halves are the same device work every replay, so each is captured once into a graph
    where it can be (the hazard's preparation is device work alone; no host copy to collect): a
    replay then costs the host two graph launches, not a kernel launch per segment, and the
    device no gaps between them. The row a look writes is a cursor on the device that the look
    advances, so one graph serves every row; the host counts the rows it enqueued and checks the
    cursor against them at every read, so each verdict stays its own replay's. A look is only the
    comparison into its row (`Oracle.comparer`); the group counts and the bits the host reads are
    made once a batch (`finish`). While the device records (the traced replay) the same work runs
    uncaptured, so its op list and timeline show every kernel."""

    # Device memory for a batch's unit masks: a batch is as many replays as fit, at most MAX_BATCH.
    MASK_BYTES = 64 << 20
    MAX_BATCH = 64

    def __init__(self, tb: Testbed, oracle: Oracle, batch: int):
        self.tb, self.oracle = tb, oracle
        self.batch = max(1, min(batch, self.MAX_BATCH, self.MASK_BYTES // oracle.mask_width))
        device = oracle.truth.device
        # Made on the forward stream, where the poisoning and the look use them: made on the
        # default stream, nothing would order the look's warm-up (on a side stream) after them.
        with tb.dev.stream(tb.forward):
            self._buffers(tb, oracle, device)
        self.poison_graph: Graph | None = None
        self.look_graph: Graph | None = None

    def _buffers(self, tb: Testbed, oracle: Oracle, device: torch.device) -> None:
        # A batch's unit masks, a row a replay; the look writes its replay's row through the cursor.
        self.masks = torch.zeros((self.batch, oracle.mask_width), dtype=torch.bool, device=device)
        # The cursor and, after a batch, its group counts: one buffer, so one copy to the host.
        self.header = torch.zeros(1 + oracle.counts_size(self.batch), dtype=torch.long, device=device)
        self.cursor = self.header[:1]  # the row the next look writes
        self.bits = torch.zeros((self.batch, oracle.mask_width // 8), dtype=torch.uint8, device=device)
        self.rows = 0  # looks enqueued since the last read: the host's count of the cursor
        # This replay's unit mask, before the look copies it into its row.
        self._mask = torch.zeros(oracle.mask_width, dtype=torch.bool, device=device)
        self._compare = oracle.comparer(tb.model.probes.arena, self._mask)
        self._count = oracle.counter(self.masks, self.header[1:], self.bits)
        # The probe arena's poison: a NaN in each unit's first element, a unit's row being written
        # whole (one copy) or not at all, so an unwritten unit differs from ground truth as a wholly
        # poisoned one would, for a pass over a few elements a unit instead of the arena (a gigabyte
        # at serving shapes). A poison that is a number could equal some unit's first element of
        # ground truth: then the whole arena.
        starts = tb.model.probes.layout.unit_starts()
        self._firsts = (torch.cat([torch.arange(r.start, r.stop, r.step, device=device) for r in starts])
                        if math.isnan(tb.scenario.poison) else None)

    def capture(self) -> None:
        """Capture the poisoning and the look, where they can be (nothing may be pending)."""
        tb, dev = self.tb, self.tb.dev
        with dev.stream(tb.forward), dev.harness_work():
            if tb.hazard.prepares_on_device:
                self.poison_graph = dev.capture(self._poison)
            if tb.model.backup is None:
                # Warmed up here, once, so that the cursor never runs past the batch's rows.
                self._look()
                self._restart()
                self.look_graph = dev.capture(self._look, warmup=0)
        self._restart()

    def _poison(self) -> None:
        tb = self.tb
        tb.hazard.prepare(tb.bed)
        arena, value, firsts = tb.model.probes.arena, tb.scenario.poison, self._firsts
        if firsts is None:
            tb.dev.launch(lambda: arena.fill_(value), what="poison probes")
        else:
            tb.dev.launch(lambda: arena.index_fill_(0, firsts, value), what="poison probes")

    def _look(self) -> None:
        self.tb.model.collect_final_state()
        self.tb.dev.launch(self._compare_into_row, what="compare")

    def _compare_into_row(self) -> None:
        self._compare()
        self.masks.index_copy_(0, self.cursor, self._mask[None])
        self.cursor.add_(1)

    def _restart(self) -> None:
        """The next look writes row 0 (enqueued on the forward stream, before any look of the
        next batch)."""
        self.rows = 0
        tb = self.tb
        with tb.dev.stream(tb.forward), tb.dev.harness_work():
            tb.dev.launch(self.cursor.zero_, what="first row")

    def before(self) -> None:
        dev = self.tb.dev
        with dev.harness_work():
            if self.poison_graph is not None and not dev.recording:
                self.poison_graph.replay()
            else:
                self._poison()

    def after(self, row: int, marks: Marks = UNMARKED) -> None:
        if row != self.rows:
            raise RuntimeError(f"replay enqueued for row {row} of a batch whose next row is {self.rows}")
        self.rows += 1
        tb, dev = self.tb, self.tb.dev
        with dev.stream(tb.forward), dev.harness_work():
            dev.join(tb.forward)
            marks.take(dev, tb.forward, "joined")
            if self.look_graph is not None and not dev.recording:
                self.look_graph.replay()
            else:
                self._look()
            marks.take(dev, tb.forward, "looked")

    def finish(self, rows: int) -> None:
        """Once a batch's looks are enqueued: its group counts and its masks' bits, on the device
        (one pass over the batch's masks, not a reduction a replay)."""
        tb, dev = self.tb, self.tb.dev
        with dev.stream(tb.forward), dev.harness_work():
            dev.launch(lambda: self._count(rows), what="count")

    def read(self, rows: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The first `rows` rows (group counts, and the unit masks' bits when a replay was stale), on
        the host; after `finish` and a synchronize. The next batch starts at row 0."""
        # Both reads on the forward stream, where `_restart` then zeroes the cursor (a view of the
        # header) and the next batch's count writes the bits: PyTorch's CUDA sanitizer takes a
        # blocking copy's synchronisation before the copy itself, so a read on another stream followed
        # by those writes is a race to it, though the host waited for the read. On one stream, it and
        # `harness.sanitizer` see the same order.
        with self.tb.dev.stream(self.tb.forward):
            header = self.header.to("cpu", copy=True)
            written = int(header[0])
            if not rows == self.rows == written:
                raise RuntimeError(f"a batch of {rows} replays enqueued {self.rows} looks that wrote {written} "
                                   "rows: its verdicts would not be each replay's own")
            counts = self.oracle.counts_of(header[1:], self.batch, rows)
            # A copy, also where the device's memory is the host's (the simulator): a verdict keeps its
            # bits for `slots`, and the next batch writes these rows again.
            bits = self.bits[:rows].to("cpu", copy=True) if counts.any() else None
        self._restart()
        return counts, bits

class _Unobserved(_Observer):
    """Timing only (the benchmark): nothing is prepared, poisoned or compared."""

    def __init__(self, tb: Testbed):
        self.tb = tb
        self.batch = 1

    def capture(self) -> None:
        pass

    def before(self) -> None:
        pass

    def after(self, row: int, marks: Marks = UNMARKED) -> None:
        pass

    def finish(self, rows: int) -> None:
        pass


@dataclass
class ReplayTimes:
    """Where checked replays' device time went, summed over replays (device ms; virtual on the
    simulator): the harness's poisoning, the load op and the replay (from the load op's start to
    the forward stream's join with every stream), the harness's look, and the device idle
    between one replay's look and the next one's poisoning (a host that fell behind, a batch's
    host synchronisation)."""

    replays: int = 0
    poison_ms: float = 0.0
    load_replay_ms: float = 0.0
    look_ms: float = 0.0
    idle_ms: float = 0.0
    load_replay_each_ms: list[float] = field(default_factory=list)

    @property
    def harness_ms(self) -> float:
        return self.poison_ms + self.look_ms


class Stopwatch:
    """Marks every checked replay (`Replayer.replays(..., stopwatch=)`): one `Marks` a replay, its
    events made and recorded once beforehand (`ready`), recorded again as the replay runs, and all
    read after the run (`read`): reading them is the benchmark's measuring, not the harness's
    checking, so it stays out of the replay loop and of its wall time (a few hundred event reads a
    batch were most of the device's idle time between batches)."""

    def __init__(self) -> None:
        self.rows: list[Marks] = []  # a replay's marks, in order
        self.times = ReplayTimes()
        self._taken = 0  # marks handed out to replays
        self._read = 0  # marks read into `times`
        self._last_looked: float | None = None

    def ready(self, dev: Device, stream: Stream, replays: int) -> None:
        """Make the next `replays` replays' markers now (each recorded once on `stream`), so that the
        replay loop records existing events and makes none."""
        with dev.stream(stream):
            while len(self.rows) < self._taken + replays:
                m = Marks()
                for at in ("begin", "start", "launch", "end", "joined", "looked"):
                    m.take(dev, stream, at)
                self.rows.append(m)
        dev.synchronize()

    def marks(self) -> Marks:
        """The next replay's marks."""
        if self._taken == len(self.rows):
            self.rows.append(Marks())
        self._taken += 1
        return self.rows[self._taken - 1]

    def read(self, dev: Device) -> ReplayTimes:
        """Every replay marked since the last read, into `times` (after a synchronize)."""
        t = self.times
        for m in self.rows[self._read:self._taken]:
            begin, start, joined, looked = (dev.marker_us(x) for x in (m.begin, m.start, m.joined, m.looked))
            if begin is None or start is None or joined is None or looked is None:
                continue  # a device with no timing markers
            if self._last_looked is not None:
                t.idle_ms += max(0.0, begin - self._last_looked) / 1e3
            t.replays += 1
            t.poison_ms += (start - begin) / 1e3
            t.load_replay_ms += (joined - start) / 1e3
            t.load_replay_each_ms.append((joined - start) / 1e3)
            t.look_ms += (looked - joined) / 1e3
            self._last_looked = looked
        self._read = self._taken
        return t


@dataclass(frozen=True)
class _Batch:
    """A batch's rows read to the host: its replays' group counts and, if any was stale, their bits."""

    rows: int
    counts: torch.Tensor
    bits: torch.Tensor | None


class Replayer:
    """One scenario's replay loop on a built testbed: everything per replay, nothing more.

    The steps are the same for every scenario; what differs is in the strategies the testbed
    resolved (hazard, fence, schedule), the gate, and whether the replay is observed.
    Without an oracle it only times (the benchmark).
    """

    def __init__(self, tb: Testbed, runner: Runner, timeout_s: float, gate: Gate | None = None,
                 oracle: Oracle | None = None, batch: int = _Observer.MAX_BATCH):
        self.tb, self.runner, self.timeout_s = tb, runner, timeout_s
        self.gating = _Gating(tb, gate) if gate is not None else _NoGate()
        # A gate is opened by the host after each replay's forward, an idle pace starts each
        # replay on a quiet device, and a hazard whose preparation the host writes (a write-back's
        # host copy, poisoned; a staging buffer, refilled) must not write it while the previous
        # replay's copies and look still use it: one replay per batch.
        if gate is not None or tb.scenario.pace is Pace.IDLE or not tb.hazard.prepares_on_device:
            batch = 1
        self.observer = _Observer(tb, oracle, batch) if oracle is not None else _Unobserved(tb)
        self.observer.capture()
        self.oracle = oracle
        self.other_load = tb.other_load()

    def __call__(self, i: int, fault: Fault) -> ReplayVerdict:
        """One observed replay (index i; -1 is the traced one) and its verdict."""
        return next(self.replays([i], fault))

    def replays(self, indices: Iterable[int], fault: Fault, stopwatch: Stopwatch | None = None
                ) -> Iterator[ReplayVerdict]:
        """Observed replays, in order, a verdict each; enqueued a batch at a time, read with one
        host synchronisation per batch. A `stopwatch` marks each one's device time (read it after).

        With batches of several replays, a batch's verdicts are handed out once the next batch's
        first replay is enqueued: the device runs it while the host builds them and the caller
        takes them, where it would otherwise idle. Each verdict is still built from its own
        replay's row of its own batch, and every verdict is handed out before this returns."""
        assert self.oracle is not None
        overlap = self.observer.batch > 1
        pending: list[int] = []
        read: _Batch | None = None  # the last batch read, its verdicts not handed out yet
        try:
            for i in indices:
                row = len(pending)
                self.enqueue(i, fault, stopwatch.marks() if stopwatch else UNMARKED, row=row)
                pending.append(i)
                if read is not None:
                    done, read = read, None
                    yield from self._verdicts(done)
                if len(pending) == self.observer.batch:
                    read, pending = self._read(pending), []
                    if not overlap:
                        done, read = read, None
                        yield from self._verdicts(done)
            if read is not None:
                done, read = read, None
                yield from self._verdicts(done)
            if pending:
                done, pending = self._read(pending), []
                yield from self._verdicts(done)
        except GeneratorExit:
            # The caller stopped early, with a batch enqueued and not read: read it (its verdicts
            # are nobody's), so that the next call's first replay writes row 0.
            if pending:
                self._read(pending)
            raise

    def _read(self, pending: list[int]) -> _Batch:
        """A batch's counts and bits on the host, once every replay of it has run."""
        self.observer.finish(len(pending))
        self.tb.dev.synchronize(self.timeout_s)  # bounded: a hung replay is an error, not a hang
        self.gating.check(pending[0])  # a gated batch is that one replay
        counts, bits = self.observer.read(len(pending))
        return _Batch(len(pending), counts, bits)

    def _verdicts(self, batch: _Batch) -> Iterator[ReplayVerdict]:
        assert self.oracle is not None
        counts = batch.counts.tolist()  # one call for the batch, not one a replay
        for row in range(batch.rows):
            yield self.oracle.verdict(counts[row], None if batch.bits is None else batch.bits[row])

    def run(self, i: int, fault: Fault, marks: Marks = UNMARKED, *, load: bool = True) -> None:
        """One replay, synchronized (the benchmark; `load=False`: the forward with no load
        pending, its compute bound)."""
        self.enqueue(i, fault, marks, load=load)
        self.tb.dev.synchronize(self.timeout_s)
        self.gating.check(i)

    def enqueue(self, i: int, fault: Fault, marks: Marks = UNMARKED, *, load: bool = True, row: int = 0) -> None:
        """One replay, from the slots' preparation to its observation, enqueued."""
        tb, dev, gating = self.tb, self.tb.dev, self.gating
        plan = FaultPlan(fault, i)
        with dev.stream(tb.forward):
            marks.take(dev, tb.forward, "begin")
            gating.before_prepare()
            self.observer.before()
            marks.take(dev, tb.forward, "start")
            op = tb.start_load(plan, gate=gating.on_load) if load else None
            tb.hazard.before_forward(tb.bed, op)
            runner = self._fenced(i, op)
            tb.drain_load()  # a loader thread's enqueue (schedule async_enqueue): after the fence's waits
            marks.take(dev, tb.forward, "launch")
            gating.before_forward()
            runner.run()
            marks.take(dev, tb.forward, "end")
            gating.after_forward()
            racing = tb.hazard.after_forward(tb.bed, plan, self.other_load, gating.for_hazard)
            tb.drain_load()
        gating.open(op, racing)
        self.observer.after(row, marks)
        tb.counter.set_consumer(-1)  # the batch has run: the load's slots are the scheduler's again

    def _fenced(self, i: int, op: LoadOp | None) -> Runner:
        tb = self.tb
        ctx = FenceContext(tb.dev, tb.forward, tb.load, tb.counter, op, self.runner, i, self._host_wait)
        chosen = tb.fence(ctx)
        if chosen is None:
            return self.runner
        if not callable(getattr(chosen, "run", None)):
            raise PluginError(f"fence {tb.scenario.fence!r} returned {type(chosen).__name__}; "
                              "a fence returns None or a runner (FenceSetup.runner(backend))")
        return chosen

    def _host_wait(self, event: Event) -> None:
        """A fence that blocks the host: open the gate first (nothing else could), then wait."""
        self.gating.release()
        if not self.tb.dev.host_wait(event, self.timeout_s):
            raise ReplayTimeout(f"a fence's host wait did not finish within {self.timeout_s:g}s")
