"""`make_train(cfg)`: the whole training as one pure function of a PRNG key."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_engine.core.engine import Engine, build
from jaxrl_engine.core.state import EngineState, Metrics
from jaxrl_engine.io.config import Config


def make_train(
    cfg: Config, **build_kwargs: Any
) -> Callable[[jax.Array], tuple[EngineState, Metrics]]:
    """`train(key) -> (state, metrics)`: `lax.scan` over epochs, evaluating every
    `eval.interval` epochs and at the end; `jax.jit(jax.vmap(train))(keys)` trains many seeds.

    metrics: per-epoch metrics stacked over `num_epochs`, and `evaluate/*` stacked over the
    evaluations (every `eval.interval` epochs, plus one after the last if it was not one).
    """
    engine: Engine = build(cfg, **build_kwargs)
    interval = cfg.eval.interval
    blocks, rest = divmod(engine.num_epochs, interval)
    evaluate = engine.pure_phases["evaluate"]

    def epochs(state: EngineState, length: int) -> tuple[EngineState, Metrics]:
        return jax.lax.scan(lambda s, _: engine.pure_epoch(s), state, None, length=length)

    def block(state: EngineState, _: None):
        state, metrics = epochs(state, interval)
        state, eval_metrics = evaluate(state)
        return state, (metrics, eval_metrics)

    def train(key: jax.Array) -> tuple[EngineState, Metrics]:
        state = engine.init_pure(key)
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
