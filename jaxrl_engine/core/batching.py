"""Batching rules the engine needs under `jax.vmap` (seeds and hyperparameter sweeps)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp


def one_key_at_a_time(fn: Any) -> Any:
    """`fn(key, *args)`, evaluated member by member (`lax.map`) when vmapped, never as one
    batched call (args: e.g. the hyperparameters, which a sweep batches too).

    For parameter init. Orthogonal initialisers use a QR factorisation; vmapped over seeds it
    becomes jaxlib's batched LAPACK kernel, which on CPU (jaxlib 0.10.2) splits the batch over
    XLA's intra-op thread pool and blocks a pool thread waiting for the pieces. When as many
    such QRs run side by side as the pool has threads (the layers of a network are independent,
    and the pool has one thread per core), every thread waits on work that no thread is left to
    run: `jax.jit(jax.vmap(make_train(cfg)))` hung for good on this 2-core machine (both pool
    threads in `QrFactorization` -> `ParallelBatchMap` -> `BlockingCounter::Wait`). Unbatched,
    each QR runs inline. Nested vmaps recurse, so every level is mapped.
    """

    @jax.custom_batching.custom_vmap
    def call(key: jax.Array, *args: Any) -> Any:
        return fn(key, *args)

    @call.def_vmap
    def rule(axis_size: int, in_batched: Sequence[Any], *inputs: Any) -> tuple[Any, Any]:
        def batched(x: Any, is_batched: bool) -> Any:
            return x if is_batched else jnp.broadcast_to(x, (axis_size, *jnp.shape(x)))

        inputs = jax.tree.map(batched, inputs, tuple(in_batched))
        out = jax.lax.map(lambda xs: call(*xs), inputs)
        return out, jax.tree.map(lambda _: True, out)

    return call
