"""A side-stream H2D copy and a captured CUDA graph that reads its target: plain PyTorch.

    python -m harness.examples.h2d_graph_race [--fence none|wait_stream|event|in_graph] [--replays N]

Each replay: poison the device tensor, copy the pinned source into it on a side stream,
replay a graph that doubles it. With no fence the replay reads the poison (stale); a wait
of the replay stream on the side stream or on the copy's event before replay, or a wait on
an external event captured inside the graph, orders the read after the copy. Prints
{"stale": k, "replays": n}. `harness.sanitizer` reports the race; PyTorch's
`torch.cuda._sanitizer` cannot see into the replay and stays silent.
"""

from __future__ import annotations

import argparse
import json

import torch

FENCES = ("none", "wait_stream", "event", "in_graph")


def run(fence: str = "none", replays: int = 50, numel: int = 32 << 20,
        span: tuple[torch.cuda.Event, torch.cuda.Event] | None = None) -> int:
    """Replays that read stale data (128 MiB copied per replay by default: about 2 ms at 55 GB/s).
    `span`, two timing events: recorded before the first replay and after the last (for a cost)."""
    side = torch.cuda.Stream()
    host = torch.ones(numel, pin_memory=True)
    dev = torch.zeros(numel, device="cuda")
    out = torch.empty_like(dev)
    copied = torch.cuda.Event(external=True)  # external: a wait on it can be captured
    copied.record(side)  # CUDA creates an event at its first record
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        if fence == "in_graph":
            copied.wait()  # a wait node on an event recorded outside the graph
        torch.mul(dev, 2, out=out)
    torch.cuda.synchronize()
    stale = 0
    if span:
        span[0].record()
    for _ in range(replays):
        dev.fill_(float("nan"))  # poison: a read that beats the copy is loud
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            dev.copy_(host, non_blocking=True)
            copied.record()
        if fence == "wait_stream":
            torch.cuda.current_stream().wait_stream(side)
        elif fence == "event":
            torch.cuda.current_stream().wait_event(copied)
        graph.replay()
        torch.cuda.synchronize()
        stale += bool(out.isnan().any())
    if span:
        span[1].record()
    return stale


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fence", choices=FENCES, default="none")
    p.add_argument("--replays", type=int, default=50)
    args = p.parse_args(argv)
    print(json.dumps({"fence": args.fence, "stale": run(args.fence, args.replays), "replays": args.replays}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
