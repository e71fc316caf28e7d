"""SAC for continuous actions: twin Q, automatic entropy tuning, tanh-squashed Gaussian policy.

One gradient step (`_step`), read top to bottom (Haarnoja et al. 2018, v2):
    a' ~ pi(s'),  y = r + gamma * (1 - terminated) * (min_i Q_target_i(s', a') - alpha log pi(a'|s'))
    critic: mean_i mean(w * (Q_i(s, a) - y)^2)              truncated steps bootstrap
    actor:  mean(alpha log pi(a~|s) - min_i Q_i(s, a~))     a~ ~ pi(s), reparameterised
    alpha:  mean(-log_alpha * (log pi(a~|s) + target_entropy))   when `autotune`
    Q_target <- tau * Q + (1 - tau) * Q_target
Actions live in [-1, 1] for the networks and are scaled affinely to the env's [low, high];
random uniform actions until `learning_starts` transitions are stored.
See `off_policy` for the buffer, sampling and the asynchronous schedule.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from jaxrl_engine.algos.networks import MLP, one_key_at_a_time
from jaxrl_engine.algos.off_policy import OffPolicy, ReplayBatch, Schedule, action_bounds
from jaxrl_engine.buffers import replay
from jaxrl_engine.envs.protocol import EnvSpec

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


class Critic(nn.Module):
    """Q(s, a): obs [batch, *obs_shape], action [batch, action_dim] -> f32[batch]."""

    hidden_sizes: tuple[int, ...]
    activation: str

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array) -> jax.Array:
        x = jnp.concatenate([obs.reshape((obs.shape[0], -1)), action], -1)
        return MLP(self.hidden_sizes, 1, self.activation)(x)[:, 0]


class SACState(struct.PyTreeNode):
    params: dict[str, Any]  # {"actor", "critic" (two stacked Q-networks), "log_alpha"}
    target_critic: Any
    opt_state: dict[str, Any]  # {"actor", "critic", "alpha"}
    acting: Any  # the actor rollout acts with (refreshed every `sync_every` epochs)
    schedule: Schedule
    priorities: jax.Array | None  # f32[capacity_per_env, num_envs] when prioritised


def squashed_gaussian(
    mean: jax.Array, log_std: jax.Array, key: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """(action in (-1, 1) [batch, d], log-prob [batch]) of tanh(N(mean, exp(log_std)))."""
    u = mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape)
    log_prob = -0.5 * ((u - mean) * jnp.exp(-log_std)) ** 2 - log_std - 0.5 * jnp.log(2 * jnp.pi)
    # log(1 - tanh(u)^2) = 2 * (log 2 - u - softplus(-2u)), stable for large |u|.
    log_prob = log_prob - 2.0 * (jnp.log(2.0) - u - jax.nn.softplus(-2.0 * u))
    return jnp.tanh(u), log_prob.sum(-1)


class SAC(OffPolicy):
    name = "sac"

    def __init__(self, cfg: Any, spec: EnvSpec, num_envs: int, num_epochs: int):
        if spec.action.discrete:
            raise ValueError(
                f"algo.name=sac needs continuous actions; env {spec.env_id!r} has discrete ones "
                "(use algo.name=dqn or ppo)"
            )
        super().__init__(cfg, spec, num_envs, num_epochs)
        self.action_dim = int(np.prod(spec.action.shape))
        low, high = action_bounds(spec)
        self.center, self.half_range = (high + low) / 2.0, (high - low) / 2.0
        hidden = tuple(cfg.hidden_sizes)
        self.actor = MLP(hidden, 2 * self.action_dim, cfg.activation)
        self.critic = Critic(hidden, cfg.activation)
        self.target_entropy = (
            cfg.target_entropy if cfg.target_entropy is not None else -float(self.action_dim)
        )
        self.optimizers = {
            "actor": optax.adam(cfg.actor_lr),
            "critic": optax.adam(cfg.critic_lr),
            "alpha": optax.adam(cfg.alpha_lr),
        }

    def init(self, key: jax.Array) -> SACState:
        k_actor, k_critic = jax.random.split(key)
        obs = jnp.zeros((1, *self.spec.obs_shape), jnp.float32)
        action = jnp.zeros((1, self.action_dim), jnp.float32)
        actor = self.actor.init(k_actor, obs)
        # The twin critics: two inits, one per key, never one batched QR (see one_key_at_a_time).
        critic = jax.vmap(one_key_at_a_time(lambda k: self.critic.init(k, obs, action)))(
            jax.random.split(k_critic, 2)
        )
        params = {
            "actor": actor,
            "critic": critic,
            "log_alpha": jnp.asarray(np.log(self.cfg.init_alpha), jnp.float32),
        }
        opt_state = {
            "actor": self.optimizers["actor"].init(actor),
            "critic": self.optimizers["critic"].init(critic),
            "alpha": self.optimizers["alpha"].init(params["log_alpha"]),
        }
        return SACState(
            params=params,
            target_critic=critic,
            opt_state=opt_state,
            acting=actor,
            schedule=Schedule.zeros(),
            priorities=self.init_priorities(),
        )

    def acting_params(self, train_state: SACState) -> dict[str, Any]:
        return {"actor": train_state.acting, "random": ~self.learning(train_state)}

    def _policy(self, actor: Any, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        out = self.actor.apply(actor, obs.astype(jnp.float32))
        mean, log_std = jnp.split(out, 2, -1)  # type: ignore[arg-type]
        return mean, jnp.clip(log_std, LOG_STD_MIN, LOG_STD_MAX)

    def _q(self, critic: Any, obs: jax.Array, action: jax.Array) -> jax.Array:
        """Both Q-networks: f32[2, batch]; action in [-1, 1]."""
        q = jax.vmap(self.critic.apply, (0, None, None))(critic, obs.astype(jnp.float32), action)
        return q  # type: ignore[return-value]

    def to_env(self, action: jax.Array) -> jax.Array:
        """[-1, 1] -> [low, high], shaped [batch, *action_shape]."""
        scaled = action * self.half_range.ravel() + self.center.ravel()
        return scaled.reshape((action.shape[0], *self.spec.action.shape))

    def from_env(self, action: jax.Array) -> jax.Array:
        flat = action.reshape((action.shape[0], -1)).astype(jnp.float32)
        return (flat - self.center.ravel()) / self.half_range.ravel()

    def act(self, params, obs, key, deterministic):
        """obs: [num_envs, *obs_shape] -> (env-scaled action [num_envs, *action_shape], {})."""
        mean, log_std = self._policy(params["actor"], obs)
        if deterministic:
            return self.to_env(jnp.tanh(mean)), {}
        k_policy, k_random = jax.random.split(key)
        sampled, _ = squashed_gaussian(mean, log_std, k_policy)
        uniform = jax.random.uniform(k_random, sampled.shape, minval=-1.0, maxval=1.0)
        return self.to_env(jnp.where(params["random"], uniform, sampled)), {}

    def _step(self, carry, tr, weights, key):
        cfg = self.cfg
        params, target_critic, opt_state = carry
        k_next, k_new = jax.random.split(key)
        alpha = jnp.exp(params["log_alpha"])
        action = self.from_env(tr.action)

        mean, log_std = self._policy(params["actor"], tr.next_obs)
        next_action, next_log_prob = squashed_gaussian(mean, log_std, k_next)
        next_q = self._q(target_critic, tr.next_obs, next_action).min(0)
        not_done = 1.0 - tr.terminated.astype(jnp.float32)
        target = tr.reward + cfg.gamma * not_done * (next_q - alpha * next_log_prob)
        target = jax.lax.stop_gradient(target)

        def critic_loss(critic):
            q = self._q(critic, tr.obs, action)  # [2, batch]
            td = q - target
            return (weights * td**2).mean(-1).sum() * 0.5, (td.mean(0), q.mean())

        grads, (td, q_mean) = jax.grad(critic_loss, has_aux=True)(params["critic"])
        updates, critic_opt = self.optimizers["critic"].update(grads, opt_state["critic"])
        critic = optax.apply_updates(params["critic"], updates)

        def actor_loss(actor):
            mean, log_std = self._policy(actor, tr.obs)
            new_action, log_prob = squashed_gaussian(mean, log_std, k_new)
            q = self._q(critic, tr.obs, new_action).min(0)
            return (alpha * log_prob - q).mean(), log_prob

        (loss_actor, log_prob), grads = jax.value_and_grad(actor_loss, has_aux=True)(
            params["actor"]
        )
        updates, actor_opt = self.optimizers["actor"].update(grads, opt_state["actor"])
        actor = optax.apply_updates(params["actor"], updates)

        log_alpha, alpha_opt = params["log_alpha"], opt_state["alpha"]
        if cfg.autotune:
            entropy_gap = jax.lax.stop_gradient(log_prob + self.target_entropy).mean()
            grad = -entropy_gap  # d/d log_alpha of mean(-log_alpha * (log_prob + target))
            update, alpha_opt = self.optimizers["alpha"].update(grad, alpha_opt)
            log_alpha = optax.apply_updates(log_alpha, update)

        target_critic = optax.incremental_update(critic, target_critic, cfg.tau)
        metrics = {
            "train/critic_loss": (td**2).mean(),
            "train/actor_loss": loss_actor,
            "train/alpha": jnp.exp(log_alpha),
            "train/entropy": -log_prob.mean(),
            "train/q_mean": q_mean,
        }
        params = {"actor": actor, "critic": critic, "log_alpha": log_alpha}
        opt_state = {"actor": actor_opt, "critic": critic_opt, "alpha": alpha_opt}
        return (params, target_critic, opt_state), metrics, td

    def train(self, train_state: SACState, buffer: replay.ReplayBuffer, batch: ReplayBatch, key):
        s = train_state
        carry = (s.params, s.target_critic, s.opt_state)
        (params, target_critic, opt_state), metrics, priorities = self.gradient_steps(
            s, buffer, batch, key, self._step, carry
        )
        steps = jnp.where(self.learning(s), self.grad_steps, 0)
        schedule = s.schedule.replace(
            updates=s.schedule.updates + 1, grad_steps=s.schedule.grad_steps + steps
        )
        new_state = s.replace(
            params=params,
            target_critic=target_critic,
            opt_state=opt_state,
            acting=self.refresh_acting(s, s.acting, params["actor"]),
            schedule=schedule,
            priorities=priorities,
        )
        return new_state, metrics
