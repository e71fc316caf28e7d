"""What DQN and SAC share: the replay buffer, sampling, warm-up and the asynchronous schedule.

The phases, for an off-policy algorithm:
- rollout acts with `EngineState.eval_params` (random actions until `learning_starts`
  transitions are stored) and `add_to_buffer` writes the trajectory into the replay buffer;
- update_dataset samples `[grad_steps, batch_size]` buffer indices (uniform, or prioritised
  with importance weights) for the whole epoch's gradient steps;
- train runs those gradient steps as one `lax.scan`, and is a no-op until the buffer holds
  `learning_starts` transitions;
- sync_weights copies `acting_params(train_state)`.

`Replay` (a frozen dataclass of static sizes whose methods are pure functions) supplies these
to DQN, SAC and TD3; `OffPolicyConfig`, the config section they share, lives in `algos.configs`
(no JAX) and is re-exported here.

The asynchronous schedule is configuration, not a second engine:
- `train_ratio`: gradient steps per env step; an epoch of `num_steps * num_envs` env steps
  makes `train_ratio * num_steps * num_envs` gradient steps.
- `sync_every = k`: the acting weights are a snapshot of the learner's, refreshed every k
  epochs (and after the last epoch), so rollout acts with weights up to k - 1 epochs behind the
  learner: RLightning's bounded staleness. The snapshot lives in the algorithm's train state;
  exploration schedules (epsilon, random warm-up) are not lagged.

What overlaps, honestly: the engine's epoch is one jitted computation, and its data flow is
rollout -> add -> sample -> train, so train always waits for the rollout of its epoch; on one
device nothing of rollout runs side by side with train inside that computation. The actor-learner
split (`jaxrl_engine.distributed.split.run_split`) runs acting and learning as two compiled
functions on two devices with one epoch of staleness, so that neither waits for the other's
current call (in `engine.run`: `env.actor_device`); `benchmarks/offpolicy_split.py` measures what
that gains (on a CPU the two "devices" share the same cores; see benchmarks/RESULTS.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

# The config classes live in algos.configs (no JAX); re-exported here.
from jaxrl_engine.algos.configs import ContinuousOffPolicyConfig as ContinuousOffPolicyConfig
from jaxrl_engine.algos.configs import OffPolicyConfig as OffPolicyConfig
from jaxrl_engine.algos.configs import grad_steps_per_epoch as grad_steps_per_epoch
from jaxrl_engine.algos.configs import run_grad_steps
from jaxrl_engine.buffers import replay
from jaxrl_engine.buffers.rollout import Transition
from jaxrl_engine.core.protocols import Algorithm, EnvSpec, Explore, Metrics


class ReplayBatch(struct.PyTreeNode):
    """What update_dataset prepares: indices into the buffer for every gradient step."""

    rows: jax.Array  # i32[grad_steps, batch_size]
    envs: jax.Array  # i32[grad_steps, batch_size]
    weights: jax.Array  # f32[grad_steps, batch_size]: importance weights (ones if uniform)


class Schedule(struct.PyTreeNode):
    """The algorithm-side counters of the off-policy schedule (in the train state)."""

    env_steps: jax.Array  # i32[]: transitions added so far, over all envs (from the buffer)
    updates: jax.Array  # i32[]: train calls (epochs) so far
    grad_steps: jax.Array  # i32[]: gradient steps actually taken (none during warm-up)

    @classmethod
    def zeros(cls) -> Schedule:
        z = jnp.zeros((), jnp.int32)
        return cls(env_steps=z, updates=z, grad_steps=z)


@dataclass(frozen=True)
class Replay:
    """Buffer, sampling, warm-up gate and acting snapshot (`sync_every`) of an off-policy
    algorithm; static sizes here, numeric ones (`priority_*`) read from the traced hparams."""

    num_envs: int
    num_steps: int  # rollout steps per env per epoch
    num_epochs: int
    capacity_per_env: int
    grad_steps: int
    batch_size: int
    learning_starts: int
    sync_every: int
    mode: replay.Mode = "circular"
    prioritized: bool = False

    @property
    def run_grad_steps(self) -> int:
        """The gradient steps the whole run takes (none before `learning_starts`)."""
        per_epoch = self.num_steps * self.num_envs
        return run_grad_steps(self.num_epochs, per_epoch, self.learning_starts, self.grad_steps)

    # ------------------------------------------------------------- buffer
    def init_buffer(self, trajectory: Transition) -> replay.ReplayBuffer:
        item = jax.tree.map(lambda x: x[0], trajectory._replace(extras={}))
        return replay.init(item, self.capacity_per_env, self.mode)

    def complete_trajectory(self, params: Any, trajectory: Transition) -> Transition:
        return trajectory

    def add_to_buffer(self, buffer: replay.ReplayBuffer, trajectory: Transition):
        return replay.add(buffer, trajectory._replace(extras={}))

    def init_priorities(self) -> jax.Array | None:
        """f32[capacity_per_env, num_envs] when prioritised (learner-owned, in the train state)."""
        if not self.prioritized:
            return None
        return jnp.ones((self.capacity_per_env, self.num_envs), jnp.float32)

    def update_dataset(self, train_state: Any, buffer: replay.ReplayBuffer, key: jax.Array, hp):
        """Samples indices for every gradient step of the epoch; new rows get the max priority.

        Prioritised: all `grad_steps` draws use the priorities as they are at the start of the
        epoch (priorities the epoch's own steps write apply from the next epoch on).
        """
        shape = (self.grad_steps, self.batch_size)
        schedule = train_state.schedule
        if self.prioritized:
            # Rows written since the last epoch get the largest priority seen (Schaul et al.).
            priorities = train_state.priorities
            cap = self.capacity_per_env
            age = (buffer.position - 1 - jnp.arange(cap)) % cap  # 0: the newest row
            added = buffer.count * self.num_envs - schedule.env_steps
            fresh = (age < added // self.num_envs)[:, None]
            priorities = jnp.where(fresh, priorities.max(), priorities)
            beta = self.priority_beta(buffer.count * self.num_envs, hp)
            rows, envs, weights = replay.sample_prioritized(
                buffer, priorities, key, shape, hp.priority_alpha, beta
            )
            train_state = train_state.replace(priorities=priorities)
        else:
            rows, envs = replay.sample_uniform(buffer, key, shape)
            weights = jnp.ones(shape, jnp.float32)
        schedule = schedule.replace(env_steps=buffer.count * self.num_envs)
        train_state = train_state.replace(schedule=schedule)
        metrics: Metrics = {"update_dataset/buffer_size": buffer.size()}
        if self.prioritized:
            metrics["update_dataset/priority_beta"] = beta
        if self.mode == "fixed":  # (a circular buffer overwrites its oldest rows instead)
            metrics["update_dataset/buffer_overflowed"] = buffer.overflowed.astype(jnp.int32)
        return train_state, ReplayBatch(rows=rows, envs=envs, weights=weights), metrics

    # ---------------------------------------------------------- schedule
    def priority_beta(self, env_steps: jax.Array, hp: Any) -> jax.Array:
        """f32[]: the importance-weight exponent, linear from `priority_beta` at env step 0
        to `priority_beta_end` at the run's last env step (Schaul et al. 2016 anneal to 1)."""
        total = float(max(1, self.num_epochs * self.num_steps * self.num_envs))
        frac = jnp.clip(env_steps / total, 0.0, 1.0)
        beta = hp.priority_beta + frac * (hp.priority_beta_end - hp.priority_beta)
        return jnp.asarray(beta, jnp.float32)

    def learning(self, train_state: Any) -> jax.Array:
        """bool[]: the buffer holds `learning_starts` transitions (warm-up is over)."""
        return train_state.schedule.env_steps >= self.learning_starts

    def refresh_acting(self, train_state: Any, acting: Any, learner: Any) -> Any:
        """The acting snapshot after a train call: the learner's every `sync_every` epochs."""
        updates = train_state.schedule.updates + 1
        due = (updates % self.sync_every == 0) | (updates >= self.num_epochs)
        return jax.tree.map(lambda new, old: jnp.where(due, new, old), learner, acting)

    def gradient_steps(
        self,
        train_state: Any,
        buffer: replay.ReplayBuffer,
        batch: ReplayBatch,
        key: jax.Array,
        hp: Any,
        step_fn: Callable[..., Any],
        carry: Any,
    ) -> tuple[Any, Metrics, jax.Array | None]:
        """`lax.scan` of `step_fn(carry, transitions, weights, key) -> (carry, metrics, td)`
        over the epoch's gradient steps, skipped entirely during warm-up (`lax.cond`).

        Returns (carry, metrics averaged over the steps, priorities or None).
        """
        priorities = getattr(train_state, "priorities", None)

        def one_step(c, x):
            carry, prio = c
            rows, envs, weights, k = x
            carry, metrics, td = step_fn(carry, replay.gather(buffer, rows, envs), weights, k)
            if prio is not None:
                prio = prio.at[rows, envs].set(jnp.abs(td) + hp.priority_eps)
            return (carry, prio), metrics

        def run(c):
            keys = jax.random.split(key, self.grad_steps)
            c, metrics = jax.lax.scan(one_step, c, (batch.rows, batch.envs, batch.weights, keys))
            return c, {k: v.mean() for k, v in metrics.items()}

        def skip(c):  # no gradient step, so no loss: NaN (logged as null), not 0
            shapes = jax.eval_shape(run, c)[1]
            return c, jax.tree.map(
                lambda s: jnp.full(
                    s.shape, jnp.nan if jnp.issubdtype(s.dtype, jnp.inexact) else 0, s.dtype
                ),
                shapes,
            )

        (carry, priorities), metrics = jax.lax.cond(
            self.learning(train_state), run, skip, (carry, priorities)
        )
        # (nan_guard checks the others only when this is 1: `core.nan_guard.working_key`)
        metrics["train/learning"] = self.learning(train_state).astype(jnp.float32)
        return carry, metrics, priorities

    def count_update(self, train_state: Any, grad_steps: jax.Array | None = None) -> Schedule:
        """The schedule after a train call: one more update, and `grad_steps` gradient steps
        (default: the epoch's, when learning)."""
        s = train_state.schedule
        if grad_steps is None:
            grad_steps = s.grad_steps + jnp.where(self.learning(train_state), self.grad_steps, 0)
        return s.replace(updates=s.updates + 1, grad_steps=grad_steps)

    def algorithm(
        self,
        name: str,
        hparams: Any,
        init: Callable[..., Any],
        acting_params: Callable[..., Any],
        act: Callable[..., Any],
        train: Callable[..., Any],
        static: dict[str, Any],
        explore: Explore | None = None,
    ) -> Algorithm:
        """The `Algorithm` bundle of an off-policy algorithm: its own init, acting and train,
        and this replay's buffer, sampling and schedule."""
        return Algorithm(
            name=name,
            hparams=hparams,
            init=init,
            acting_params=acting_params,
            act=act,
            init_buffer=self.init_buffer,
            complete_trajectory=self.complete_trajectory,
            add_to_buffer=self.add_to_buffer,
            update_dataset=self.update_dataset,
            train=train,
            grad_steps_per_epoch=self.grad_steps,
            on_policy=False,
            static=static,
            explore=explore,
        )


def action_bounds(spec: EnvSpec) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) of a continuous action space, f32[*action_shape]; finite (SAC and TD3
    scale their [-1, 1] actions into them)."""
    shape = spec.action.shape
    low = np.asarray(spec.action.low, np.float64).reshape(shape)
    high = np.asarray(spec.action.high, np.float64).reshape(shape)
    with np.errstate(over="ignore", invalid="ignore"):  # (inf is what is checked for)
        low32, high32 = low.astype(np.float32), high.astype(np.float32)
        span = high32 - low32
    if not (np.isfinite(low32).all() and np.isfinite(high32).all() and np.isfinite(span).all()):
        raise ValueError(
            f"env {spec.env_id!r}: action bounds low={tuple(low.ravel().tolist())}, "
            f"high={tuple(high.ravel().tolist())} are not finite in float32: SAC and TD3 scale their "
            "actions into the env's bounds; give the env finite bounds (or train it with PPO, "
            "whose Gaussian needs none)"
        )
    return low32, high32
