"""A tensor-parallel rank's process group: the collective the model's all-reduces run through.

One process per rank (`harness.run.tp`), each with its own device. A rank joins the group once
(`join_group`), and from then on `current_group()` is its group, as torch.distributed's default
group is process-wide: the testbed builds the rank's share of the model when there is one.

- On CUDA the backend is NCCL: `RankGroup.all_reduce` enqueues NCCL's all-reduce on the current
  stream, and a capture takes it into the graph like any other kernel.
- On the simulator the backend is gloo: `RankGroup.exchange` runs when the simulator starts the
  collective on this rank, at that rank's virtual time. It swaps each rank's data and its arrival
  time in one all-gather, sums the data in rank order (the same order on every rank, so every rank
  gets the same bits, replay after replay), and returns when the collective ends: after the last
  rank has arrived, as NCCL's ring cannot finish before its slowest member. One rank's late load
  delays every rank.

torch.distributed is imported only when a group is joined: the package loads no torch for it.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from harness.records.errors import HarnessError

# The simulator's cost of an all-reduce on top of waiting for the last rank: a fixed latency, and the
# ring's 2(n-1)/n of the bytes at an NVLink-like bandwidth.
ALL_REDUCE_LATENCY_US = 8.0
ALL_REDUCE_GBPS = 300.0


@dataclass
class RankGroup:
    """This process's rank in a group of `world` ranks."""

    rank: int
    world: int
    backend: str  # "gloo" (the simulator) or "nccl" (CUDA)
    timeout_s: float
    collectives: int = 0  # run so far on this rank (a rank's progress, for a report of a stuck one)
    broken: str | None = None  # why a collective failed (a peer gone, the timeout): later ones do not wait

    def cost_us(self, nbytes: int) -> float:
        """The simulator's time of an all-reduce of `nbytes` once every rank has arrived."""
        ring = 2 * (self.world - 1) / self.world * nbytes
        return ALL_REDUCE_LATENCY_US + ring / (ALL_REDUCE_GBPS * 1e3)

    def all_reduce(self, tensor: Any) -> None:
        """Sum `tensor` over the ranks in place, enqueued on the current stream (NCCL on CUDA)."""
        import torch.distributed as dist

        self.collectives += 1
        dist.all_reduce(tensor)

    def exchange(self, tensor: Any, arrival_us: float) -> float:
        """The simulator's all-reduce, run at this rank's arrival: `tensor` becomes the sum of every
        rank's (in rank order, in float64, then cast back), and the return is the virtual time at
        which the collective ends here: the last rank's arrival plus its cost."""
        import torch
        import torch.distributed as dist

        if self.broken is not None:
            # The group failed: the scenario is over, and the work it left queued (run as the scenario
            # ends) must not wait a timeout more for each of its collectives.
            return arrival_us
        self.collectives += 1
        head = torch.tensor([arrival_us, self.collectives], dtype=torch.float64)
        payload = torch.cat([head, tensor.detach().reshape(-1).double()])
        gathered = [torch.empty_like(payload) for _ in range(self.world)]
        try:
            dist.all_gather(gathered, payload)
        except Exception as e:
            self.broken = str(e) or type(e).__name__
            raise
        counts = [int(g[1]) for g in gathered]
        if len(set(counts)) > 1:
            # The ranks ran different work (a fence on some ranks that captures a runner of its own):
            # their collectives no longer pair up, and a sum of unrelated tensors is no result.
            at = ", ".join(f"rank {r} at all-reduce {n}" for r, n in enumerate(counts))
            self.broken = f"the ranks' collectives are out of step ({at}): the ranks ran different work"
            raise HarnessError(self.broken)
        total = gathered[0][2:].clone()
        for other in gathered[1:]:
            total += other[2:]
        tensor.copy_(total.view(tensor.shape))
        last = max(float(g[0]) for g in gathered)
        return last + self.cost_us(tensor.numel() * tensor.element_size())


_GROUP: RankGroup | None = None


def current_group() -> RankGroup | None:
    """This process's rank group, or None outside a tensor-parallel rank."""
    return _GROUP


def join_group(rank: int, world: int, init_method: str, *, cuda: bool, timeout_s: float) -> RankGroup:
    """Join the group (NCCL on CUDA, gloo on the simulator), with a timeout on every collective, so a
    rank whose peer never arrives fails instead of hanging."""
    global _GROUP
    import torch.distributed as dist

    backend = "nccl" if cuda else "gloo"
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    _GROUP = RankGroup(rank, world, backend, timeout_s)
    return _GROUP


def leave_group() -> None:
    global _GROUP
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    _GROUP = None
