"""What an algorithm supplies to the engine: networks, `act`, `update_dataset` and `train`.

The engine supplies the rest (rollout loop, env batching, buffers' place in the state, hooks,
evaluation, sync, driver). Every method is pure and jittable; shapes are fixed at build time.
"""

from __future__ import annotations

from typing import Any, Protocol

import jax

from jaxrl_engine.core.state import Metrics
from jaxrl_engine.envs.protocol import EnvSpec


class Algorithm(Protocol):
    name: str
    spec: EnvSpec

    def init(self, key: jax.Array) -> Any:
        """Learner state: params, optimizer state, step count, normalisers."""

    def acting_params(self, train_state: Any) -> Any:
        """What `sync_weights` copies into `EngineState.eval_params`."""

    def act(
        self, params: Any, obs: jax.Array, key: jax.Array, deterministic: bool
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """obs: [num_envs, *obs_shape] -> (action [num_envs, *action_shape], extras per env)."""

    def init_buffer(self, trajectory: Any) -> Any:
        """An empty buffer for trajectories shaped like `trajectory` ([num_steps, num_envs, ...])."""

    def complete_trajectory(self, params: Any, trajectory: Any) -> Any:
        """Called at the end of rollout with the acting params (e.g. PPO adds bootstrap values)."""

    def add_to_buffer(self, buffer: Any, trajectory: Any) -> Any:
        """The buffer after one rollout's trajectory is written."""

    def update_dataset(
        self, train_state: Any, buffer: Any, key: jax.Array
    ) -> tuple[Any, Any, Metrics]:
        """buffer -> training batch (GAE for on-policy, sampling for off-policy)."""

    def train(
        self, train_state: Any, buffer: Any, batch: Any, key: jax.Array
    ) -> tuple[Any, Metrics]:
        """Gradient steps as `lax.scan`; returns the new learner state."""

    def grad_steps_per_epoch(self) -> int:
        """Gradient steps one `train` call makes (for counters)."""
