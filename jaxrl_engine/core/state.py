"""The engine state: one pytree holding everything that changes during training."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from jaxrl_engine.core.protocols import Metrics


class EnvCarry(struct.PyTreeNode):
    """Batched env state and the last observation (leading axis `num_envs`)."""

    state: Any
    obs: jax.Array  # [num_envs, *obs_shape]
    done: jax.Array  # bool[num_envs]: the last step ended an episode
    explore: Any = None  # the algorithm's `Explore` state per env (None: it has none)


class Counters(struct.PyTreeNode):
    epoch: jax.Array  # int32[]
    env_steps: jax.Array  # int32[]
    grad_steps: jax.Array  # int32[]

    @classmethod
    def zeros(cls) -> Counters:
        z = jnp.zeros((), jnp.int32)
        return cls(epoch=z, env_steps=z, grad_steps=z)


class EpisodeStats(struct.PyTreeNode):
    """Running episode accumulators, fixed size (no growing histories)."""

    current_return: jax.Array  # f32[num_envs]
    current_length: jax.Array  # i32[num_envs]
    last_return: jax.Array  # f32[]: mean return of the episodes completed in the last rollout
    last_length: jax.Array  # f32[]
    episodes: jax.Array  # i32[]: episodes completed since init

    @classmethod
    def zeros(cls, num_envs: int) -> EpisodeStats:
        return cls(
            current_return=jnp.zeros((num_envs,), jnp.float32),
            current_length=jnp.zeros((num_envs,), jnp.int32),
            last_return=jnp.full((), jnp.nan, jnp.float32),
            last_length=jnp.full((), jnp.nan, jnp.float32),
            episodes=jnp.zeros((), jnp.int32),
        )


class EngineState(struct.PyTreeNode):
    """Everything that changes; static configuration lives on the `Engine`.

    train: the algorithm's learner state (params, optimizer state, step count, normalisers).
    eval_params / eval_version: what rollout and evaluate act with; `sync_weights` refreshes them.
    env: batched env state and last observation. buffer: rollout or replay storage.
    batch: what `update_dataset` prepared for `train`. rng: PRNG key. counters, stats.
    hparams: the algorithm's numeric hyperparameters (traced: `vmap` sweeps them).
    """

    train: Any
    eval_params: Any
    eval_version: jax.Array
    env: EnvCarry
    buffer: Any
    batch: Any
    rng: jax.Array
    counters: Counters
    stats: EpisodeStats
    hparams: Any


Phase = Callable[[EngineState], tuple[EngineState, Metrics]]


def get_path(tree: Any, path: str) -> Any:
    """`get_path(state, "train.opt_state")`: attribute (or dict key) access by dotted path."""
    for part in path.split("."):
        tree = tree[part] if isinstance(tree, dict) else getattr(tree, part)
    return tree


def set_path(tree: Any, path: str, value: Any) -> Any:
    """A copy of `tree` with the leaf at the dotted `path` replaced (dataclass `.replace`)."""
    head, _, rest = path.partition(".")
    child = tree[head] if isinstance(tree, dict) else getattr(tree, head)
    new = set_path(child, rest, value) if rest else value
    if isinstance(tree, dict):
        return {**tree, head: new}
    return tree.replace(**{head: new})


def hparams_arrays(hparams: Any) -> Any:
    """`hparams` with every leaf a (not weakly typed) array: Python floats become f32[], so
    the state's signature is the same whether the values came from a config or a sweep."""
    return jax.tree.map(lambda x: jnp.asarray(x, jnp.asarray(x).dtype), hparams)
