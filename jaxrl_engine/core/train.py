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
    blocks, rest = divmod(engine.num_epochs, interval)
    evaluate = engine.pure_phases["evaluate"]

    def epochs(state: EngineState, length: int) -> tuple[EngineState, Metrics]:
        return jax.lax.scan(lambda s, _: engine.pure_epoch(s), state, None, length=length)

    def block(state: EngineState, _: None):
        state, metrics = epochs(state, interval)
        state, eval_metrics = evaluate(state)
        return state, (metrics, eval_metrics)

    def train(key: jax.Array, hparams: Any = None) -> tuple[EngineState, Metrics]:
        state = engine.init_pure(key, hparams)
        epoch_metrics, eval_metrics = [], []
        if blocks:
            state, (m, e) = jax.lax.scan(block, state, None, length=blocks)
            epoch_metrics.append(jax.tree.map(lambda x: x.reshape((-1, *x.shape[2:])), m))
            eval_metrics.append(e)
        if rest:
            state, m = epochs(state, rest)
            state, e = evaluate(state)
            epoch_metrics.append(m)
            eval_metrics.append(jax.tree.map(lambda x: x[None], e))
        metrics = {
            **jax.tree.map(lambda *x: jnp.concatenate(x), *epoch_metrics),
            **jax.tree.map(lambda *x: jnp.concatenate(x), *eval_metrics),
        }
        return state, metrics

    train.engine = engine  # type: ignore[attr-defined]
    return train
