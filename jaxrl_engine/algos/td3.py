"""TD3 for continuous actions: twin critics, target policy smoothing, delayed actor updates.

One gradient step (`step` in `td3`), read top to bottom (Fujimoto et al. 2018):
    eps ~ clip(N(0, policy_noise), -noise_clip, noise_clip)
    a'  = clip(pi_target(s') + eps, -1, 1)                          target policy smoothing
    y   = r + gamma * (1 - terminated) * min_i Q_target_i(s', a')   truncated steps bootstrap
    critic: mean_i mean(w * (Q_i(s, a) - y)^2)      w: importance weights (1 unless prioritised)
and every `policy_delay` gradient steps (counted over the whole run) also
    actor:  mean(-Q_1(s, pi(s)))                    deterministic policy gradient through Q_1
    pi_target <- tau * pi + (1 - tau) * pi_target,  Q_target_i <- tau * Q_i + (1 - tau) * Q_target_i
(a `lax.cond` inside the epoch's one `lax.scan`; the actor's Adam state advances only then).
The actor is deterministic: tanh of the network's output, in [-1, 1], scaled affinely to the
env's [low, high]. Acting adds N(0, exploration_noise) in [-1, 1] units and clips; uniform random
actions for the first `learning_starts` env steps; `deterministic=True` is the plain actor.
With `noise="ou"` rollout's noise is instead an Ornstein-Uhlenbeck process per env, in SB3's
discretisation (`OrnsteinUhlenbeckActionNoise`: x <- x - ou_theta * ou_dt * x + exploration_noise
* sqrt(ou_dt) * N(0, 1), reset to 0 at each episode's start), carried in the rollout as the
algorithm's `Explore` state: temporally correlated exploration, which sparse-reward tasks such as
MountainCarContinuous need (uncorrelated noise averages out to no motion).
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

from jaxrl_engine.algos.base import adam, check_head
from jaxrl_engine.algos.configs import TD3Config as TD3Config  # re-exported (no JAX)
from jaxrl_engine.algos.off_policy import Replay, ReplayBatch, Schedule
from jaxrl_engine.algos.sac import ActionScale, twin_critic_init, twin_q
from jaxrl_engine.buffers import replay as replay_buffer
from jaxrl_engine.core.protocols import Algorithm, EnvSpec, Explore


class TD3State(struct.PyTreeNode):
    params: dict[str, Any]  # {"actor", "critic" (two stacked Q-networks)}
    target_actor: Any
    target_critic: Any
    opt_state: dict[str, Any]  # {"actor", "critic"}
    acting: Any  # the actor rollout acts with (refreshed every `sync_every` epochs)
    schedule: Schedule
    priorities: jax.Array | None  # f32[capacity_per_env, num_envs] when prioritised


class TD3HParams(struct.PyTreeNode):
    """TD3's numeric hyperparameters: pytree leaves, traced (vmap sweeps them). The noise
    scales are in the networks' [-1, 1] action units."""

    actor_lr: jax.Array | float = 1e-3
    critic_lr: jax.Array | float = 1e-3
    gamma: jax.Array | float = 0.99
    tau: jax.Array | float = 0.005
    exploration_noise: jax.Array | float = 0.1
    policy_noise: jax.Array | float = 0.2
    noise_clip: jax.Array | float = 0.5
    ou_theta: jax.Array | float = 0.15
    ou_dt: jax.Array | float = 1e-2
    priority_alpha: jax.Array | float = 0.6
    priority_beta: jax.Array | float = 0.4
    priority_beta_end: jax.Array | float = 1.0
    priority_eps: jax.Array | float = 1e-6


def td3(
    actor: nn.Module,
    critic: nn.Module,
    spec: EnvSpec,
    replay: Replay,
    *,
    policy_delay: int = 2,
    noise: str = "gaussian",
    hparams: TD3HParams | None = None,
) -> Algorithm:
    """TD3 with `actor` (obs -> [batch, action_dim], squashed by tanh here) and `critic`
    ((obs, action) -> [batch]), twin critics from two inits of `critic`; the actor and the
    targets update every `policy_delay` gradient steps; rollout's acting noise `noise`:
    "gaussian" (independent per step) or "ou" (Ornstein-Uhlenbeck, per env)."""
    if spec.action.discrete:
        raise ValueError(
            f"algo.name=td3 needs continuous actions; env {spec.env_id!r} has discrete ones "
            "(use algo.name=dqn or ppo)"
        )
    if policy_delay < 1:
        raise ValueError(f"algo.policy_delay={policy_delay} must be >= 1")
    if noise not in ("gaussian", "ou"):
        raise ValueError(f"algo.noise={noise!r} must be 'gaussian' or 'ou'")
    action_dim = int(np.prod(spec.action.shape))
    scale = ActionScale.of(spec)

    def optimizers(hp: TD3HParams) -> dict[str, optax.GradientTransformation]:
        return {"actor": adam(hp.actor_lr), "critic": adam(hp.critic_lr)}

    def policy(actor_params: Any, obs: jax.Array) -> jax.Array:
        """obs [batch, *obs_shape] -> deterministic action in [-1, 1], f32[batch, action_dim]."""
        out = actor.apply(actor_params, obs.astype(jnp.float32))
        check_head("TD3", "actor output", out, spec)
        return jnp.tanh(out)  # type: ignore[arg-type]

    def init(key: jax.Array, hp: TD3HParams) -> TD3State:
        k_actor, k_critic = jax.random.split(key)
        obs = jnp.zeros((1, *spec.obs_shape), jnp.float32)
        action = jnp.zeros((1, action_dim), jnp.float32)
        actor_params = actor.init(k_actor, obs)
        critic_params = twin_critic_init(critic, k_critic, obs, action)
        tx = optimizers(hp)
        return TD3State(
            params={"actor": actor_params, "critic": critic_params},
            target_actor=actor_params,
            target_critic=critic_params,
            opt_state={
                "actor": tx["actor"].init(actor_params),
                "critic": tx["critic"].init(critic_params),
            },
            acting=actor_params,
            schedule=Schedule.zeros(),
            priorities=replay.init_priorities(),
        )

    def acting_params(train_state: TD3State, hp: TD3HParams) -> dict[str, Any]:
        return {
            "actor": train_state.acting,
            "random": ~replay.learning(train_state),
            "noise": jnp.asarray(hp.exploration_noise, jnp.float32),
            "ou_theta": jnp.asarray(hp.ou_theta, jnp.float32),
            "ou_dt": jnp.asarray(hp.ou_dt, jnp.float32),
        }

    def act(params, obs, key, deterministic):
        """obs: [num_envs, *obs_shape] -> (env-scaled action [num_envs, *action_shape], {})."""
        mean = policy(params["actor"], obs)
        if deterministic:
            return scale.to_env(mean, spec.action.shape), {}
        k_noise, k_random = jax.random.split(key)
        noisy = mean + params["noise"] * jax.random.normal(k_noise, mean.shape)
        return explored(params, noisy, k_random), {}

    def explored(params, noisy: jax.Array, key: jax.Array) -> jax.Array:
        """The noisy action clipped to [-1, 1], or uniform ones before learning starts; env-scaled."""
        uniform = jax.random.uniform(key, noisy.shape, minval=-1.0, maxval=1.0)
        action = jnp.where(params["random"], uniform, jnp.clip(noisy, -1.0, 1.0))
        return scale.to_env(action, spec.action.shape)

    def ou_init(key: jax.Array, num_envs: int) -> jax.Array:
        return jnp.zeros((num_envs, action_dim), jnp.float32)

    def ou_act(params, x, obs, first, key):
        """One Ornstein-Uhlenbeck step per env (x: f32[num_envs, action_dim], 0 at `first`)."""
        k_noise, k_random = jax.random.split(key)
        x = jnp.where(first[:, None], 0.0, x)
        theta, dt = params["ou_theta"], params["ou_dt"]
        x = (
            x
            - theta * dt * x
            + params["noise"] * jnp.sqrt(dt) * jax.random.normal(k_noise, x.shape)
        )
        return explored(params, policy(params["actor"], obs) + x, k_random), {}, x

    def train(
        train_state: TD3State,
        buffer: replay_buffer.ReplayBuffer,
        batch: ReplayBatch,
        key: jax.Array,
        hp: TD3HParams,
    ):
        tx = optimizers(hp)

        def step(carry, tr, weights, key):
            params, target_actor, target_critic, opt_state, n = carry
            action = scale.from_env(tr.action)

            next_action = policy(target_actor, tr.next_obs)
            noise = hp.policy_noise * jax.random.normal(key, next_action.shape)
            noise = jnp.clip(noise, -hp.noise_clip, hp.noise_clip)
            next_action = jnp.clip(next_action + noise, -1.0, 1.0)
            next_q = twin_q(critic, target_critic, tr.next_obs, next_action).min(0)
            not_done = 1.0 - tr.terminated.astype(jnp.float32)
            target = jax.lax.stop_gradient(tr.reward + hp.gamma * not_done * next_q)

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
                q = twin_q(critic, critic_params, tr.obs, policy(actor_params, tr.obs))
                return -q[0].mean()  # Q_1 only, as in the paper

            n = n + 1

            def delayed(_):
                loss, grads = jax.value_and_grad(actor_loss)(params["actor"])
                updates, actor_opt = tx["actor"].update(grads, opt_state["actor"])
                actor_params = optax.apply_updates(params["actor"], updates)
                polyak = lambda new, old: optax.incremental_update(new, old, hp.tau)  # noqa: E731
                return (
                    actor_params,
                    actor_opt,
                    polyak(actor_params, target_actor),
                    polyak(critic_params, target_critic),
                    loss,
                )

            def hold(_):
                loss = actor_loss(params["actor"])  # reported, not followed
                return params["actor"], opt_state["actor"], target_actor, target_critic, loss

            actor_params, actor_opt, target_actor, target_critic, loss_actor = jax.lax.cond(
                n % policy_delay == 0, delayed, hold, None
            )
            metrics = {
                "train/critic_loss": loss_critic,  # (the loss the critics descend)
                "train/actor_loss": loss_actor,
                "train/q_mean": q_mean,
            }
            params = {"actor": actor_params, "critic": critic_params}
            opt_state = {"actor": actor_opt, "critic": critic_opt}
            return (params, target_actor, target_critic, opt_state, n), metrics, td

        s = train_state
        carry = (s.params, s.target_actor, s.target_critic, s.opt_state, s.schedule.grad_steps)
        (params, target_actor, target_critic, opt_state, n), metrics, priorities = (
            replay.gradient_steps(s, buffer, batch, key, hp, step, carry)
        )
        new_state = s.replace(
            params=params,
            target_actor=target_actor,
            target_critic=target_critic,
            opt_state=opt_state,
            acting=replay.refresh_acting(s, s.acting, params["actor"]),
            schedule=replay.count_update(s, n),
            priorities=priorities,
        )
        return new_state, metrics

    return replay.algorithm(
        "td3",
        hparams if hparams is not None else TD3HParams(),
        init=init,
        acting_params=acting_params,
        act=act,
        train=train,
        static={"actor": actor, "critic": critic, "policy_delay": policy_delay},
        explore=Explore(ou_init, ou_act) if noise == "ou" else None,
    )
