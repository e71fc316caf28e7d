"""SAC for continuous actions: twin Q, automatic entropy tuning, tanh-squashed Gaussian policy.

One gradient step (`step` in `sac`), read top to bottom (Haarnoja et al. 2018, v2):
    a' ~ pi(s'),  y = r + gamma * (1 - terminated) * (min_i Q_target_i(s', a') - alpha log pi(a'|s'))
    critic: mean_i mean(w * (Q_i(s, a) - y)^2)              truncated steps bootstrap
    actor:  mean(alpha log pi(a~|s) - min_i Q_i(s, a~))     a~ ~ pi(s), reparameterised
    alpha:  mean(-log_alpha * (log pi(a~|s) + target_entropy))   when `autotune`
    Q_target <- tau * Q + (1 - tau) * Q_target
Actions live in [-1, 1] for the networks and are scaled affinely to the env's [low, high];
random uniform actions for the first `learning_starts` env steps.
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

from jaxrl_engine.algos.base import adam, check_head, check_values
from jaxrl_engine.algos.configs import SACConfig as SACConfig  # re-exported (no JAX)
from jaxrl_engine.algos.networks import MLP
from jaxrl_engine.algos.off_policy import (
    Replay,
    ReplayBatch,
    Schedule,
    action_bounds,
)
from jaxrl_engine.buffers import replay as replay_buffer
from jaxrl_engine.core.batching import one_key_at_a_time
from jaxrl_engine.core.protocols import Algorithm, EnvSpec

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


class SACHParams(struct.PyTreeNode):
    """SAC's numeric hyperparameters: pytree leaves, traced (vmap sweeps them)."""

    actor_lr: jax.Array | float = 3e-4
    critic_lr: jax.Array | float = 3e-4
    alpha_lr: jax.Array | float = 3e-4
    gamma: jax.Array | float = 0.99
    tau: jax.Array | float = 0.005
    init_alpha: jax.Array | float = 1.0
    target_entropy: jax.Array | float = -1.0
    priority_alpha: jax.Array | float = 0.6
    priority_beta: jax.Array | float = 0.4
    priority_beta_end: jax.Array | float = 1.0
    priority_eps: jax.Array | float = 1e-6


class ActionScale(struct.PyTreeNode):
    """The affine map between the networks' [-1, 1] and the env's [low, high] (static)."""

    center: Any = struct.field(pytree_node=False)
    half_range: Any = struct.field(pytree_node=False)

    @classmethod
    def of(cls, spec: EnvSpec) -> ActionScale:
        low, high = action_bounds(spec)
        return cls(center=(high + low) / 2.0, half_range=(high - low) / 2.0)

    def to_env(self, action: jax.Array, shape: tuple[int, ...]) -> jax.Array:
        """[-1, 1] -> [low, high], shaped [batch, *shape]."""
        scaled = action * self.half_range.reshape(1, -1) + self.center.reshape(1, -1)
        return scaled.reshape((action.shape[0], *shape))

    def from_env(self, action: jax.Array) -> jax.Array:
        flat = action.reshape((action.shape[0], -1)).astype(jnp.float32)
        return (flat - self.center.reshape(1, -1)) / self.half_range.reshape(1, -1)


def twin_critic_init(critic: nn.Module, key: jax.Array, obs: jax.Array, action: jax.Array):
    """Two critics' params stacked on a leading axis: two inits, one per key, never one
    batched QR (see `one_key_at_a_time`)."""
    init = one_key_at_a_time(lambda k, o, a: critic.init(k, o, a))
    return jax.vmap(init, (0, None, None))(jax.random.split(key, 2), obs, action)


def twin_q(critic: nn.Module, params: Any, obs: jax.Array, action: jax.Array) -> jax.Array:
    """Both Q-networks: f32[2, batch]; action in [-1, 1]."""
    q = jax.vmap(critic.apply, (0, None, None))(params, obs.astype(jnp.float32), action)
    check_values("critic's Q-value", q[0], obs.shape[0], phase="train")
    return q  # type: ignore[return-value]


def sac(
    actor: nn.Module,
    critic: nn.Module,
    spec: EnvSpec,
    replay: Replay,
    *,
    autotune: bool = True,
    hparams: SACHParams | None = None,
) -> Algorithm:
    """SAC with `actor` (obs -> [batch, 2 * action_dim]: mean and log-std) and `critic`
    ((obs, action) -> [batch]), twin critics from two inits of `critic`."""
    if spec.action.discrete:
        raise ValueError(
            f"algo.name=sac needs continuous actions; env {spec.env_id!r} has discrete ones "
            "(use algo.name=dqn or ppo)"
        )
    action_dim = int(np.prod(spec.action.shape))
    scale = ActionScale.of(spec)

    def optimizers(hp: SACHParams) -> dict[str, optax.GradientTransformation]:
        return {
            "actor": adam(hp.actor_lr),
            "critic": adam(hp.critic_lr),
            "alpha": adam(hp.alpha_lr),
        }

    def init(key: jax.Array, hp: SACHParams) -> SACState:
        k_actor, k_critic = jax.random.split(key)
        obs = jnp.zeros((1, *spec.obs_shape), jnp.float32)
        action = jnp.zeros((1, action_dim), jnp.float32)
        actor_params = actor.init(k_actor, obs)
        critic_params = twin_critic_init(critic, k_critic, obs, action)
        params = {
            "actor": actor_params,
            "critic": critic_params,
            "log_alpha": jnp.log(jnp.asarray(hp.init_alpha, jnp.float32)),
        }
        tx = optimizers(hp)
        opt_state = {
            "actor": tx["actor"].init(actor_params),
            "critic": tx["critic"].init(critic_params),
            "alpha": tx["alpha"].init(params["log_alpha"]),
        }
        return SACState(
            params=params,
            target_critic=critic_params,
            opt_state=opt_state,
            acting=actor_params,
            schedule=Schedule.zeros(),
            priorities=replay.init_priorities(),
        )

    def acting_params(train_state: SACState, hp: SACHParams) -> dict[str, Any]:
        return {"actor": train_state.acting, "random": ~replay.learning(train_state)}

    def policy(actor_params: Any, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        out = actor.apply(actor_params, obs.astype(jnp.float32))
        check_head("SAC", "actor output (mean and log-std)", out, spec, per_action=2)
        mean, log_std = jnp.split(out, 2, -1)  # type: ignore[arg-type]
        return mean, jnp.clip(log_std, LOG_STD_MIN, LOG_STD_MAX)

    def act(params, obs, key, deterministic):
        """obs: [num_envs, *obs_shape] -> (env-scaled action [num_envs, *action_shape], {})."""
        mean, log_std = policy(params["actor"], obs)
        if deterministic:
            return scale.to_env(jnp.tanh(mean), spec.action.shape), {}
        k_policy, k_random = jax.random.split(key)
        sampled, _ = squashed_gaussian(mean, log_std, k_policy)
        uniform = jax.random.uniform(k_random, sampled.shape, minval=-1.0, maxval=1.0)
        return scale.to_env(jnp.where(params["random"], uniform, sampled), spec.action.shape), {}

    def train(
        train_state: SACState,
        buffer: replay_buffer.ReplayBuffer,
        batch: ReplayBatch,
        key: jax.Array,
        hp: SACHParams,
    ):
        tx = optimizers(hp)

        def step(carry, tr, weights, key):
            params, target_critic, opt_state = carry
            k_next, k_new = jax.random.split(key)
            alpha = jnp.exp(params["log_alpha"])
            action = scale.from_env(tr.action)

            mean, log_std = policy(params["actor"], tr.next_obs)
            next_action, next_log_prob = squashed_gaussian(mean, log_std, k_next)
            next_q = twin_q(critic, target_critic, tr.next_obs, next_action).min(0)
            not_done = 1.0 - tr.terminated.astype(jnp.float32)
            target = tr.reward + hp.gamma * not_done * (next_q - alpha * next_log_prob)
            target = jax.lax.stop_gradient(target)

            def critic_loss(critic_params):
                q = twin_q(critic, critic_params, tr.obs, action)  # [2, batch]
                td = q - target[None]  # [2, batch]
                return (weights[None] * td**2).mean(-1).sum() * 0.5, (td.mean(0), q.mean())

            (loss_critic, (td, q_mean)), grads = jax.value_and_grad(critic_loss, has_aux=True)(
                params["critic"]
            )
            updates, critic_opt = tx["critic"].update(grads, opt_state["critic"])
            critic_params = optax.apply_updates(params["critic"], updates)

            def actor_loss(actor_params):
                mean, log_std = policy(actor_params, tr.obs)
                new_action, log_prob = squashed_gaussian(mean, log_std, k_new)
                q = twin_q(critic, critic_params, tr.obs, new_action).min(0)
                return (alpha * log_prob - q).mean(), log_prob

            (loss_actor, log_prob), grads = jax.value_and_grad(actor_loss, has_aux=True)(
                params["actor"]
            )
            updates, actor_opt = tx["actor"].update(grads, opt_state["actor"])
            actor_params = optax.apply_updates(params["actor"], updates)

            log_alpha, alpha_opt = params["log_alpha"], opt_state["alpha"]
            if autotune:
                entropy_gap = jax.lax.stop_gradient(log_prob + hp.target_entropy).mean()
                grad = -entropy_gap  # d/d log_alpha of mean(-log_alpha * (log_prob + target))
                update, alpha_opt = tx["alpha"].update(grad, alpha_opt)
                log_alpha = optax.apply_updates(log_alpha, update)

            target_critic = optax.incremental_update(critic_params, target_critic, hp.tau)
            metrics = {
                "train/critic_loss": loss_critic,  # (the loss the critics descend)
                "train/actor_loss": loss_actor,
                "train/alpha": jnp.exp(log_alpha),
                "train/entropy": -log_prob.mean(),
                "train/q_mean": q_mean,
            }
            params = {"actor": actor_params, "critic": critic_params, "log_alpha": log_alpha}
            opt_state = {"actor": actor_opt, "critic": critic_opt, "alpha": alpha_opt}
            return (params, target_critic, opt_state), metrics, td

        s = train_state
        carry = (s.params, s.target_critic, s.opt_state)
        (params, target_critic, opt_state), metrics, priorities = replay.gradient_steps(
            s, buffer, batch, key, hp, step, carry
        )
        new_state = s.replace(
            params=params,
            target_critic=target_critic,
            opt_state=opt_state,
            acting=replay.refresh_acting(s, s.acting, params["actor"]),
            schedule=replay.count_update(s),
            priorities=priorities,
        )
        return new_state, metrics

    return replay.algorithm(
        "sac",
        hparams if hparams is not None else SACHParams(target_entropy=-float(action_dim)),
        init=init,
        acting_params=acting_params,
        act=act,
        train=train,
        static={"actor": actor, "critic": critic},
    )
