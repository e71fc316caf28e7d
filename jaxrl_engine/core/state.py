"""The engine state: one pytree holding everything that changes during training."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

Metrics = dict[str, jax.Array]


class EnvCarry(struct.PyTreeNode):
    """Batched env state and the last observation (leading axis `num_envs`)."""

    state: Any
    obs: jax.Array  # [num_envs, *obs_shape]
    done: jax.Array  # bool[num_envs]: the last step ended an episode


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


Phase = Callable[[EngineState], tuple[EngineState, Metrics]]
