"""The JAX environment protocol (gymnax 1.0) and the specs the engine reads from an env.

An env steps one instance; the engine vmaps it over `num_envs`. `step` auto-resets: when
`terminated | truncated`, the returned observation is the first of a new episode and
`info["final_observation"]` is the last observation of the finished one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import jax
import jax.numpy as jnp


@dataclass(frozen=True)
class ActionSpec:
    """Discrete (`num_actions` set) or continuous (`low`/`high` set) actions of one env."""

    shape: tuple[int, ...]
    dtype: Any
    num_actions: int | None = None
    low: float | tuple[float, ...] | None = None
    high: float | tuple[float, ...] | None = None

    @property
    def discrete(self) -> bool:
        return self.num_actions is not None

    def clip(self, action: jax.Array) -> jax.Array:
        """What the env receives: continuous actions clipped to [low, high]."""
        if self.discrete:
            return action
        low = jnp.asarray(self.low, jnp.float32).reshape(self.shape)
        high = jnp.asarray(self.high, jnp.float32).reshape(self.shape)
        return jnp.clip(action, low, high)


@dataclass(frozen=True)
class EnvSpec:
    """Shapes and dtypes of one env instance, read from the env itself."""

    env_id: str
    obs_shape: tuple[int, ...]
    obs_dtype: Any
    action: ActionSpec
    max_episode_steps: int


class Env(Protocol):
    """gymnax 1.0: `reset(key, params)`, `step(key, state, action, params)` (6-tuple)."""

    def reset(self, key: jax.Array, params: Any) -> tuple[jax.Array, Any]: ...

    def step(
        self, key: jax.Array, state: Any, action: jax.Array, params: Any
    ) -> tuple[jax.Array, Any, jax.Array, jax.Array, jax.Array, dict[str, Any]]: ...

    def spec(self, params: Any) -> EnvSpec: ...
