"""`make_train(engine)`: the whole training as one pure function of a key and hyperparameters."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_engine.core.engine import Engine
from jaxrl_engine.core.state import EngineState, Metrics


def make_train(engine: Engine) -> Callable[..., tuple[EngineState, Metrics]]:
    """`train(key, hparams=None) -> (state, metrics)`: `lax.scan` over the engine's epochs,
    evaluating every `eval_interval` epochs and at the end. hparams: the algorithm's `HParams`
    (default: the engine's), traced, so `jax.jit(jax.vmap(train))(keys, stacked_hparams)`
    trains many seeds and hyperparameter settings in one program.

    metrics: per-epoch metrics stacked over `num_epochs`, and `evaluate/*` stacked over the
    evaluations (every `eval_interval` epochs, plus one after the last if it was not one).
    `train.engine` is the engine.
    """
    interval = engine.eval_interval
    num_epochs = engine.num_epochs
    blocks = -(-num_epochs // interval)  # the last one may be short: evaluated at its end
    evaluate = engine.pure_phases["evaluate"]

    def epoch_or_skip(state: EngineState, epoch: jax.Array) -> tuple[EngineState, Metrics]:
        # A short last block skips its missing epochs with a `lax.cond` on the scan's epoch
        # index (never batched, so a real branch under vmap too) rather than scanning the
        # remainder in a second loop: one copy of the epoch in the program, not two, which
        # is what XLA's compile time follows.
        if blocks * interval == num_epochs:
            return engine.pure_epoch(state)
        shapes = jax.eval_shape(engine.pure_epoch, state)[1]

        def skip(state: EngineState) -> tuple[EngineState, Metrics]:
            return state, {k: jnp.zeros(v.shape, v.dtype) for k, v in shapes.items()}

        return jax.lax.cond(epoch < num_epochs, engine.pure_epoch, skip, state)

    def block(state: EngineState, first: jax.Array):
        state, metrics = jax.lax.scan(epoch_or_skip, state, first + jnp.arange(interval))
        state, eval_metrics = evaluate(state)
        return state, (metrics, eval_metrics)

    def train(key: jax.Array, hparams: Any = None) -> tuple[EngineState, Metrics]:
        state = engine.init_pure(key, hparams)
        firsts = jnp.arange(blocks) * interval
        state, (epoch_metrics, eval_metrics) = jax.lax.scan(block, state, firsts)
        epoch_metrics = jax.tree.map(
            lambda x: x.reshape((-1, *x.shape[2:]))[:num_epochs], epoch_metrics
        )
        return state, {**epoch_metrics, **eval_metrics}

    train.engine = engine  # type: ignore[attr-defined]
    return train
