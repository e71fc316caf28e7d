"""DQN for discrete actions: double DQN targets, a target network (hard or Polyak), epsilon-greedy.

One gradient step (`step` in `train`), read top to bottom:
    a* = argmax_a Q_online(s', a)                (double DQN; `double: false` uses Q_target)
    y  = r + gamma * (1 - terminated) * Q_target(s', a*)     truncated steps bootstrap
    loss = mean(w * huber(Q_online(s, a) - y))   w: importance weights (1 unless prioritised)
and every `target_update_interval` gradient steps target <- tau * online + (1 - tau) * target
(tau = 1: a hard copy). Acting: epsilon-greedy, epsilon 1 for the first `learning_starts` env
steps, else the schedule of Stable-Baselines3 and CleanRL: linear from `epsilon_start` at env
step 0 to `epsilon_end` at `exploration_fraction` of the run's env steps (a warm-up longer than
that leaves epsilon at `epsilon_end` when learning starts).
See `off_policy` for the buffer, sampling and the asynchronous schedule.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from jaxrl_engine.algos.base import adam, check_head, learning_rate
from jaxrl_engine.algos.configs import DQNConfig as DQNConfig  # re-exported (no JAX)
from jaxrl_engine.algos.off_policy import Replay, ReplayBatch, Schedule
from jaxrl_engine.buffers import replay as replay_buffer
from jaxrl_engine.core.protocols import Algorithm, EnvSpec


class DQNState(struct.PyTreeNode):
    params: Any  # online Q-network
    target_params: Any
    opt_state: Any
    acting: Any  # the Q-network rollout acts with (refreshed every `sync_every` epochs)
    schedule: Schedule
    priorities: jax.Array | None  # f32[capacity_per_env, num_envs] when prioritised


class DQNHParams(struct.PyTreeNode):
    """DQN's numeric hyperparameters: pytree leaves, traced (vmap sweeps them)."""

    lr: jax.Array | float = 2.5e-4
    gamma: jax.Array | float = 0.99
    tau: jax.Array | float = 1.0
    huber_delta: jax.Array | float = 1.0
    max_grad_norm: jax.Array | float = 10.0
    adam_eps: jax.Array | float = 1e-8
    epsilon_start: jax.Array | float = 1.0
    epsilon_end: jax.Array | float = 0.05
    exploration_fraction: jax.Array | float = 0.5
    priority_alpha: jax.Array | float = 0.6
    priority_beta: jax.Array | float = 0.4
    priority_beta_end: jax.Array | float = 1.0
    priority_eps: jax.Array | float = 1e-6


def epsilon(
    env_steps: jax.Array, hp: DQNHParams, learning_starts: int, total_env_steps: int
) -> jax.Array:
    """1 for the first `learning_starts` env steps; else linear from `epsilon_start` at env
    step 0 to `epsilon_end` at `exploration_fraction` of the run's env steps."""
    exploration_steps = jnp.maximum(1.0, hp.exploration_fraction * total_env_steps)
    frac = jnp.clip(env_steps / exploration_steps, 0.0, 1.0)
    eps = hp.epsilon_start + frac * (hp.epsilon_end - hp.epsilon_start)
    return jnp.where(env_steps < learning_starts, 1.0, eps).astype(jnp.float32)


def dqn(
    network: Any,
    spec: EnvSpec,
    replay: Replay,
    *,
    num_steps: int,
    double: bool = True,
    target_update_interval: int = 500,
    anneal_lr: bool = False,
    hparams: DQNHParams | None = None,
) -> Algorithm:
    """DQN over a Q-network (`init(key, obs)`, `apply(params, obs) -> [batch, num_actions]`)."""
    if not spec.action.discrete:
        raise ValueError(
            f"algo.name=dqn needs discrete actions; env {spec.env_id!r} has continuous ones "
            "(use algo.name=sac or td3)"
        )
    num_actions = int(spec.action.num_actions or 0)
    total_env_steps = replay.num_epochs * replay.num_envs * num_steps
    # Over the gradient steps the run takes (the optimizer counts none before learning_starts)
    anneal_steps = max(1, replay.run_grad_steps) if anneal_lr else None

    def optimizer(hp: DQNHParams):
        return adam(
            hp.lr, max_grad_norm=hp.max_grad_norm, eps=hp.adam_eps, anneal_steps=anneal_steps
        )

    def q_values(params: Any, obs: jax.Array) -> jax.Array:
        """obs: [batch, *obs_shape] -> f32[batch, num_actions]."""
        q = network.apply(params, obs.astype(jnp.float32))
        check_head("DQN", "Q-value head", q, spec)
        return q  # type: ignore[no-any-return]

    def init(key: jax.Array, hp: DQNHParams) -> DQNState:
        params = network.init(key, jnp.zeros((1, *spec.obs_shape), jnp.float32))
        return DQNState(
            params=params,
            target_params=params,
            opt_state=optimizer(hp).init(params),
            acting=params,
            schedule=Schedule.zeros(),
            priorities=replay.init_priorities(),
        )

    def acting_params(train_state: DQNState, hp: DQNHParams) -> dict[str, Any]:
        eps = epsilon(train_state.schedule.env_steps, hp, replay.learning_starts, total_env_steps)
        return {"q": train_state.acting, "epsilon": eps}

    def act(params, obs, key, deterministic):
        """obs: [num_envs, *obs_shape] -> (i32[num_envs] actions, {}); greedy when deterministic."""
        greedy = jnp.argmax(q_values(params["q"], obs), -1).astype(jnp.int32)
        if deterministic:
            return greedy, {}
        k_explore, k_action = jax.random.split(key)
        n = obs.shape[0]
        random_action = jax.random.randint(k_action, (n,), 0, num_actions, jnp.int32)
        explore = jax.random.uniform(k_explore, (n,)) < params["epsilon"]
        return jnp.where(explore, random_action, greedy), {}

    def loss_fn(params, target_params, tr, weights, hp: DQNHParams):
        q = q_values(params, tr.obs)
        q_taken = jnp.take_along_axis(q, tr.action[:, None].astype(jnp.int32), -1)[:, 0]
        next_target = q_values(target_params, tr.next_obs)
        chooser = q_values(params, tr.next_obs) if double else next_target
        next_action = jnp.argmax(chooser, -1)
        next_q = jnp.take_along_axis(next_target, next_action[:, None], -1)[:, 0]
        target = tr.reward + hp.gamma * (1.0 - tr.terminated.astype(jnp.float32)) * next_q
        td = q_taken - jax.lax.stop_gradient(target)
        loss = (weights * optax.huber_loss(td, delta=hp.huber_delta)).mean()
        return loss, (td, q_taken.mean())

    def train(
        train_state: DQNState,
        buffer: replay_buffer.ReplayBuffer,
        batch: ReplayBatch,
        key: jax.Array,
        hp: DQNHParams,
    ):
        grad_fn = jax.grad(loss_fn, has_aux=True)
        tx = optimizer(hp)

        def step(carry, tr, weights, _key):
            params, target, opt_state, n = carry
            grads, (td, q_mean) = grad_fn(params, target, tr, weights, hp)
            updates, opt_state = tx.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            n = n + 1
            due = n % target_update_interval == 0
            target = jax.tree.map(
                lambda t, p: jnp.where(due, hp.tau * p + (1.0 - hp.tau) * t, t), target, params
            )
            metrics = {
                "train/loss": optax.huber_loss(td, delta=hp.huber_delta).mean(),
                "train/q_mean": q_mean,
                "train/td_abs": jnp.abs(td).mean(),
            }
            return (params, target, opt_state, n), metrics, td

        s = train_state
        carry = (s.params, s.target_params, s.opt_state, s.schedule.grad_steps)
        (params, target, opt_state, n), metrics, priorities = replay.gradient_steps(
            s, buffer, batch, key, hp, step, carry
        )
        # The epsilon this epoch's rollout acted with: that of the env steps before it
        # (`update_dataset` has counted the rollout's steps in the schedule since).
        before = s.schedule.env_steps - replay.num_steps * replay.num_envs
        metrics["train/epsilon"] = epsilon(
            jnp.maximum(before, 0), hp, replay.learning_starts, total_env_steps
        )
        metrics["train/lr"] = learning_rate(hp.lr, anneal_steps, opt_state)
        new_state = s.replace(
            params=params,
            target_params=target,
            opt_state=opt_state,
            acting=replay.refresh_acting(s, s.acting, params),
            schedule=replay.count_update(s, n),
            priorities=priorities,
        )
        return new_state, metrics

    return replay.algorithm(
        "dqn",
        hparams if hparams is not None else DQNHParams(),
        init=init,
        acting_params=acting_params,
        act=act,
        train=train,
        static={"network": network, "q_values": q_values},
    )
