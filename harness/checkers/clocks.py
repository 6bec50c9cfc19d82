"""Happens-before between streams: one vector clock per stream.

The model is PyTorch's `torch/cuda/_sanitizer.py` (StreamSynchronizations). The
happens-before analyser (`harness.checkers.happens_before`) uses it to find unordered pairs
in an op list. (The simulator needs none: it runs the ops in virtual time, where
whatever is ordered is also later.)

- work on a stream is stamped with (stream, the stream's current epoch);
- record: the event keeps a copy of the stream's clock, then the stream ticks,
  so work enqueued after the record is not covered by it;
- wait: the stream's clock becomes the pointwise max with the event's clock
  (a wait on a never-recorded event does nothing, as CUDA completes it at once);
- host sync: every stream's clock becomes the max over all streams, then every
  stream ticks (work enqueued after the sync is after all work before it, and
  not covered by any earlier record); a stream first seen later starts there;
- host wait on one event: every stream's clock (and the floor new streams start
  from) takes the pointwise max with the event's clock.

The host's own clock is that floor: what it has seen complete (a synchronize, an
event waited on or polled done). Work the host does itself (a write to pinned memory)
is ordered after stream work only through it (`host_ordered`).
"""

from __future__ import annotations

from dataclasses import dataclass

StreamId = int
Clock = dict[StreamId, int]


@dataclass(frozen=True)
class Stamp:
    stream: StreamId
    epoch: int


class StreamClocks:
    def __init__(self) -> None:
        self._clocks: dict[StreamId, Clock] = {}
        self._floor: Clock = {}  # the clock at the last host sync

    def clock(self, sid: StreamId) -> Clock:
        c = self._clocks.get(sid)
        if c is None:
            c = self._clocks[sid] = dict(self._floor)
            c.setdefault(sid, 0)
        return c

    def stamp(self, sid: StreamId) -> Stamp:
        """The stamp of work enqueued on `sid` now."""
        return Stamp(sid, self.clock(sid)[sid])

    def _tick(self, sid: StreamId) -> None:
        c = self.clock(sid)
        c[sid] += 1

    def record(self, sid: StreamId) -> Clock:
        """An event recorded on `sid` now: the clock it carries."""
        snapshot = dict(self.clock(sid))
        self._tick(sid)
        return snapshot

    def wait(self, sid: StreamId, event_clock: Clock | None) -> None:
        """`sid` waits on an event; None: the event was never recorded."""
        if event_clock is None:
            return
        c = self.clock(sid)
        for s, e in event_clock.items():
            c[s] = max(c.get(s, e), e)

    def host_wait(self, event_clock: Clock | None) -> None:
        """The host waited for an event: everything it enqueues next, on any stream, is after it."""
        if event_clock is None:
            return
        floor = dict(self._floor)
        for s, e in event_clock.items():
            floor[s] = max(floor.get(s, e), e)
        self._floor = floor
        for sid in self._clocks:
            self.wait(sid, event_clock)

    def host_sync(self) -> None:
        merged = dict(self._floor)
        for c in self._clocks.values():
            for s, e in c.items():
                merged[s] = max(merged.get(s, e), e)
        self._floor = merged
        for sid in self._clocks:
            self._clocks[sid] = dict(merged)
            self._tick(sid)

    def ordered(self, sid: StreamId, stamp: Stamp) -> bool:
        """Is work stamped `stamp` ordered before work enqueued on `sid` now?"""
        return self.clock(sid).get(stamp.stream, -1) >= stamp.epoch

    def host_ordered(self, stamp: Stamp) -> bool:
        """Has the host seen work stamped `stamp` complete (so what it does now comes after)?"""
        return self._floor.get(stamp.stream, -1) >= stamp.epoch
