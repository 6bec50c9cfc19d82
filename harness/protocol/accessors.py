"""Accessor wait policies: what a pool accessor does before it hands out a layer's buffer.

A policy is a callable `policy(counter, layer_id: int, pool: str) -> None`, called
by the KV accessors (`pool == "kv"`), the sparse-attention index's accessor (`pool ==
"index"`) and the hybrid pool's Mamba accessor (`pool == "mamba"`) each time the forward
asks for a layer's buffer, on the host, with the forward stream current: eagerly, and once while a graph is captured (a
replay runs no Python, so no policy runs inside one; a wait on an external event
made during capture becomes a wait node of the graph). `counter` is the
`LoadCounter` of pending loads. A policy may be a class, made once per scenario with no
arguments, whose instances are called so. The engine's policy, `per_layer`, enqueues a
wait on that layer's load event through `counter.wait_until(layer_id)`, which does
nothing when no load is pending.
"""

from __future__ import annotations

from collections.abc import Callable

from harness.protocol.counter import LoadCounter

AccessorPolicy = Callable[[LoadCounter, int, str], None]


def per_layer(counter: LoadCounter, layer_id: int, pool: str) -> None:
    """The engine's accessors: wait on the layer's load event."""
    counter.wait_until(layer_id)


def no_waits(counter: LoadCounter, layer_id: int, pool: str) -> None:
    """Accessors that never wait (a control: eager then races as a full graph does)."""


def kv_only(counter: LoadCounter, layer_id: int, pool: str) -> None:
    """Mutant: the KV accessors wait but the Mamba accessor does not."""
    if pool == "kv":
        counter.wait_until(layer_id)


def no_index_wait(counter: LoadCounter, layer_id: int, pool: str) -> None:
    """Mutant: every accessor waits but the sparse-attention index's, which the indexer reads
    before the layer's KV (SGLang's QSA pool before the wait sgl-project/sglang#39893 added)."""
    if pool != "index":
        counter.wait_until(layer_id)


ACCESSORS: dict[str, AccessorPolicy] = {
    "per_layer": per_layer,
    "none": no_waits,
    "kv_only": kv_only,
    "no_index_wait": no_index_wait,
}
