"""DQN for discrete actions: double DQN targets, a target network (hard or Polyak), epsilon-greedy.

One gradient step (`_step`), read top to bottom:
    a* = argmax_a Q_online(s', a)                (double DQN; `double: false` uses Q_target)
    y  = r + gamma * (1 - terminated) * Q_target(s', a*)     truncated steps bootstrap
    loss = mean(w * huber(Q_online(s, a) - y))   w: importance weights (1 unless prioritised)
and every `target_update_interval` gradient steps target <- tau * online + (1 - tau) * target
(tau = 1: a hard copy). Acting: epsilon-greedy, epsilon 1 until `learning_starts` transitions are
stored, then linear from `epsilon_start` to `epsilon_end` over `exploration_fraction` of the run.
See `off_policy` for the buffer, sampling and the asynchronous schedule.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from jaxrl_engine.algos.networks import MLP
from jaxrl_engine.algos.off_policy import OffPolicy, ReplayBatch, Schedule
from jaxrl_engine.buffers import replay
from jaxrl_engine.envs.protocol import EnvSpec


class DQNState(struct.PyTreeNode):
    params: Any  # online Q-network
    target_params: Any
    opt_state: Any
    acting: Any  # the Q-network rollout acts with (refreshed every `sync_every` epochs)
    schedule: Schedule
    priorities: jax.Array | None  # f32[capacity_per_env, num_envs] when prioritised


class DQN(OffPolicy):
    name = "dqn"

    def __init__(self, cfg: Any, spec: EnvSpec, num_envs: int, num_epochs: int):
        if not spec.action.discrete:
            raise ValueError(
                f"algo.name=dqn needs discrete actions; env {spec.env_id!r} has continuous ones "
                "(use algo.name=sac)"
            )
        super().__init__(cfg, spec, num_envs, num_epochs)
        self.num_actions = int(spec.action.num_actions or 0)
        self.network = MLP(tuple(cfg.hidden_sizes), self.num_actions, cfg.activation)
        total_grad_steps = max(1, num_epochs * self.grad_steps)
        lr = optax.linear_schedule(cfg.lr, 0.0, total_grad_steps) if cfg.anneal_lr else cfg.lr
        self.optimizer = optax.chain(
            optax.clip_by_global_norm(cfg.max_grad_norm), optax.adam(lr, eps=cfg.adam_eps)
        )
        self.exploration_steps = max(
            1.0, cfg.exploration_fraction * num_epochs * num_envs * cfg.num_steps
        )

    def init(self, key: jax.Array) -> DQNState:
        params = self.network.init(key, jnp.zeros((1, *self.spec.obs_shape), jnp.float32))
        return DQNState(
            params=params,
            target_params=params,
            opt_state=self.optimizer.init(params),
            acting=params,
            schedule=Schedule.zeros(),
            priorities=self.init_priorities(),
        )

    def epsilon(self, env_steps: jax.Array) -> jax.Array:
        cfg = self.cfg
        frac = jnp.clip(env_steps / self.exploration_steps, 0.0, 1.0)
        eps = cfg.epsilon_start + frac * (cfg.epsilon_end - cfg.epsilon_start)
        return jnp.where(env_steps < cfg.learning_starts, 1.0, eps).astype(jnp.float32)

    def acting_params(self, train_state: DQNState) -> dict[str, Any]:
        return {"q": train_state.acting, "epsilon": self.epsilon(train_state.schedule.env_steps)}

    def q_values(self, params: Any, obs: jax.Array) -> jax.Array:
        """obs: [batch, *obs_shape] -> f32[batch, num_actions]."""
        return self.network.apply(params, obs.astype(jnp.float32))  # type: ignore[return-value]

    def act(self, params, obs, key, deterministic):
        """obs: [num_envs, *obs_shape] -> (i32[num_envs] actions, {}); greedy when deterministic."""
        greedy = jnp.argmax(self.q_values(params["q"], obs), -1).astype(jnp.int32)
        if deterministic:
            return greedy, {}
        k_explore, k_action = jax.random.split(key)
        n = obs.shape[0]
        random_action = jax.random.randint(k_action, (n,), 0, self.num_actions, jnp.int32)
        explore = jax.random.uniform(k_explore, (n,)) < params["epsilon"]
        return jnp.where(explore, random_action, greedy), {}

    def _loss(self, params, target_params, tr, weights):
        cfg = self.cfg
        q = self.q_values(params, tr.obs)
        q_taken = jnp.take_along_axis(q, tr.action[:, None].astype(jnp.int32), -1)[:, 0]
        next_target = self.q_values(target_params, tr.next_obs)
        chooser = self.q_values(params, tr.next_obs) if cfg.double else next_target
        next_action = jnp.argmax(chooser, -1)
        next_q = jnp.take_along_axis(next_target, next_action[:, None], -1)[:, 0]
        target = tr.reward + cfg.gamma * (1.0 - tr.terminated.astype(jnp.float32)) * next_q
        td = q_taken - jax.lax.stop_gradient(target)
        loss = (weights * optax.huber_loss(td, delta=cfg.huber_delta)).mean()
        return loss, (td, q_taken.mean())

    def train(self, train_state: DQNState, buffer: replay.ReplayBuffer, batch: ReplayBatch, key):
        cfg = self.cfg
        grad_fn = jax.grad(self._loss, has_aux=True)

        def step(carry, tr, weights, _key):
            params, target, opt_state, n = carry
            grads, (td, q_mean) = grad_fn(params, target, tr, weights)
            updates, opt_state = self.optimizer.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            n = n + 1
            due = n % cfg.target_update_interval == 0
            target = jax.tree.map(
                lambda t, p: jnp.where(due, cfg.tau * p + (1.0 - cfg.tau) * t, t), target, params
            )
            metrics = {
                "train/loss": optax.huber_loss(td, delta=cfg.huber_delta).mean(),
                "train/q_mean": q_mean,
                "train/td_abs": jnp.abs(td).mean(),
                "train/grad_norm": optax.tree.norm(grads),
            }
            return (params, target, opt_state, n), metrics, td

        s = train_state
        carry = (s.params, s.target_params, s.opt_state, s.schedule.grad_steps)
        (params, target, opt_state, n), metrics, priorities = self.gradient_steps(
            s, buffer, batch, key, step, carry
        )
        metrics["train/epsilon"] = self.epsilon(s.schedule.env_steps)
        schedule = s.schedule.replace(updates=s.schedule.updates + 1, grad_steps=n)
        new_state = s.replace(
            params=params,
            target_params=target,
            opt_state=opt_state,
            acting=self.refresh_acting(s, s.acting, params),
            schedule=schedule,
            priorities=priorities,
        )
        return new_state, metrics
