"""PPO (clipped objective, GAE, value loss, entropy bonus) for discrete and continuous actions.

Reads like PureJaxRL's: `update_dataset` turns the rollout into advantages and returns; `train`
is `lax.scan` over update epochs of `lax.scan` over minibatches. Truncated steps bootstrap from
the value of the final observation; terminated steps do not bootstrap.

`ppo(network, spec, ...)` returns the `Algorithm` bundle; numeric hyperparameters are the
traced `PPOHParams`, shape-changing ones are the factory's arguments; `PPOConfig`, the config
section that builds it, lives in `algos.configs` (no JAX) and is re-exported here.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from jaxrl_engine.algos.base import adam, check_head, check_values, learning_rate
from jaxrl_engine.algos.configs import PPOConfig as PPOConfig  # re-exported (no JAX)
from jaxrl_engine.algos.configs import TorchPolicyConfig as TorchPolicyConfig
from jaxrl_engine.algos.configs import minibatch_size
from jaxrl_engine.algos.networks import (
    categorical_entropy,
    categorical_log_prob,
    gaussian_entropy,
    gaussian_log_prob,
)
from jaxrl_engine.algos.normalize import RunningMeanStd
from jaxrl_engine.buffers.rollout import Transition, permutation
from jaxrl_engine.core.protocols import Algorithm, EnvSpec
from jaxrl_engine.core.warm_up import ShapeMismatchError

# The critic's values V(obs) are computed after the rollout, in one batched pass with
# V(next_obs), not per step inside the rollout loop, where every op costs a dispatch per step
# on CPU (same values; `benchmarks/ppo_throughput.py` switches it off in an ablation row).
VALUES_AFTER_ROLLOUT = True


class PPOState(struct.PyTreeNode):
    params: Any
    opt_state: Any
    obs_norm: RunningMeanStd
    return_norm: RunningMeanStd  # running variance of the discounted return (reward scaling)
    return_acc: jax.Array  # f32[num_envs]: discounted return so far, per env


class PPOBatch(struct.PyTreeNode):
    advantages: jax.Array  # f32[num_steps, num_envs]
    returns: jax.Array  # f32[num_steps, num_envs]
    obs_norm: RunningMeanStd  # the statistics the rollout acted with


def gae(
    reward: jax.Array,
    value: jax.Array,
    next_value: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    gamma: jax.Array | float,
    gae_lambda: jax.Array | float,
) -> tuple[jax.Array, jax.Array]:
    """Generalised advantage estimation over `[num_steps, num_envs]`.

    next_value is V(final observation of the step): it is used unless the step terminated,
    so a truncated step bootstraps and a terminated one does not. The recursion is cut at
    every episode end (terminated or truncated). Returns (advantages, value targets).
    """
    delta = reward + gamma * next_value * (1.0 - terminated) - value
    keep = gamma * gae_lambda * (1.0 - jnp.logical_or(terminated, truncated))

    def backward(carry, x):
        d, k = x
        carry = d + k * carry
        return carry, carry

    _, adv = jax.lax.scan(backward, jnp.zeros_like(delta[0]), (delta, keep), reverse=True)
    return adv, adv + value


class PPOHParams(struct.PyTreeNode):
    """PPO's numeric hyperparameters: pytree leaves, traced (vmap sweeps them)."""

    lr: jax.Array | float = 5e-4
    gamma: jax.Array | float = 0.99
    gae_lambda: jax.Array | float = 0.95
    clip_eps: jax.Array | float = 0.2
    ent_coef: jax.Array | float = 0.01
    vf_coef: jax.Array | float = 0.5
    max_grad_norm: jax.Array | float = 0.5


def normalize(obs_norm: RunningMeanStd, obs: jax.Array, enabled: bool) -> jax.Array:
    """Observations as the networks see them (f32; normalised when `enabled`)."""
    obs = obs.astype(jnp.float32)
    return obs_norm.normalize(obs) if enabled else obs


def ppo(
    network: Any,
    spec: EnvSpec,
    *,
    num_envs: int,
    num_steps: int,
    num_epochs: int,
    update_epochs: int = 4,
    num_minibatches: int = 4,
    anneal_lr: bool = True,
    normalize_obs: bool = False,
    normalize_reward: bool = False,
    hparams: PPOHParams | None = None,
) -> Algorithm:
    """PPO over `network` (`init(key, obs)`, `apply(params, obs) -> (head, log_std, value)`).

    Static arguments fix shapes and the schedule: rollout `num_steps` x `num_envs`, passes
    (`update_epochs`) x `num_minibatches`, annealing over the run's `num_epochs`.
    """
    discrete = spec.action.discrete
    mb_size = minibatch_size(num_steps, num_envs, num_minibatches)
    grad_steps = update_epochs * num_minibatches
    anneal_steps = max(1, num_epochs * grad_steps) if anneal_lr else None

    def optimizer(hp: PPOHParams):
        return adam(hp.lr, max_grad_norm=hp.max_grad_norm, eps=1e-5, anneal_steps=anneal_steps)

    def dist(params: Any, obs: jax.Array) -> tuple[jax.Array, Any, jax.Array]:
        """(logits or mean, log_std or None, value) for a batch of normalised observations."""
        head, log_std, value = network.apply(params, obs)
        check_values("PPO network's value", value, obs.shape[0])
        return head, log_std, value

    def init(key: jax.Array, hp: PPOHParams) -> PPOState:
        params = network.init(key, jnp.zeros((1, *spec.obs_shape), jnp.float32))
        return PPOState(
            params=params,
            opt_state=optimizer(hp).init(params),
            obs_norm=RunningMeanStd.create(spec.obs_shape),
            return_norm=RunningMeanStd.create(()),
            return_acc=jnp.zeros((num_envs,), jnp.float32),
        )

    def acting_params(train_state: PPOState, hp: PPOHParams) -> dict[str, Any]:
        net = train_state.params
        if hasattr(network, "acting_params"):  # e.g. a bf16 acting copy
            net = network.acting_params(net)
        return {"net": net, "obs_norm": train_state.obs_norm}

    def act(params, obs, key, deterministic):
        """obs: [num_envs, *obs_shape] -> action, extras {log_prob} ([num_envs]); also
        {value} unless `VALUES_AFTER_ROLLOUT` (then unused here, XLA drops the critic)."""
        head, log_std, value = dist(
            params["net"], normalize(params["obs_norm"], obs, normalize_obs)
        )
        check_head("PPO", "policy head (logits)" if discrete else "policy mean", head, spec)
        if not discrete and log_std is None:
            raise ShapeMismatchError(
                f"phase 'rollout': the PPO network gives no log-std (a network built for "
                f"discrete actions?), but env '{spec.env_id}' has continuous actions"
            )
        if discrete:
            action = (
                jnp.argmax(head, -1) if deterministic else jax.random.categorical(key, head)
            ).astype(jnp.int32)
            log_prob = categorical_log_prob(head, action)
        else:
            noise = jax.random.normal(key, head.shape)
            std = jnp.broadcast_to(jnp.exp(log_std), head.shape)  # (no rank promotion)
            action = head if deterministic else head + std * noise
            log_prob = gaussian_log_prob(head, log_std, action)
            action = action.reshape((obs.shape[0], *spec.action.shape))
        if VALUES_AFTER_ROLLOUT:
            return action, {"log_prob": log_prob}
        return action, {"log_prob": log_prob, "value": value}

    def init_buffer(trajectory: Transition) -> Transition:
        return jax.tree.map(jnp.zeros_like, trajectory)

    def add_to_buffer(buffer: Transition, trajectory: Transition) -> Transition:
        return trajectory

    def complete_trajectory(params, trajectory: Transition) -> Transition:
        """Adds V(next_obs) (the bootstrap values) and, with `VALUES_AFTER_ROLLOUT`, V(obs),
        computed with the acting params in one batched pass."""
        T, N = trajectory.reward.shape
        with_obs = "value" not in trajectory.extras  # act left V(obs) to here
        seen = (trajectory.obs, trajectory.next_obs) if with_obs else (trajectory.next_obs,)
        flat = jnp.concatenate(seen).reshape((len(seen) * T * N, *spec.obs_shape))
        _, _, values = dist(params["net"], normalize(params["obs_norm"], flat, normalize_obs))
        values = values.reshape((len(seen), T, N))
        extras = {**trajectory.extras, "next_value": values[-1]}
        if with_obs:
            extras["value"] = values[0]
        return trajectory._replace(extras=extras)

    def update_dataset(train_state: PPOState, buffer: Transition, key, hp: PPOHParams):
        """GAE over the rollout; advances the observation and return normalisers."""
        reward = buffer.reward.astype(jnp.float32)
        done = jnp.logical_or(buffer.terminated, buffer.truncated)
        return_norm, return_acc = train_state.return_norm, train_state.return_acc
        if normalize_reward:

            def discounted(acc, x):
                r, d = x
                acc = acc * hp.gamma + r
                return jnp.where(d, 0.0, acc), acc

            return_acc, returns_seen = jax.lax.scan(discounted, return_acc, (reward, done))
            return_norm = return_norm.update(returns_seen)
            reward = reward / jnp.sqrt(return_norm.var + 1e-8)
        advantages, targets = gae(
            reward,
            buffer.extras["value"],
            buffer.extras["next_value"],
            buffer.terminated.astype(jnp.float32),
            buffer.truncated.astype(jnp.float32),
            hp.gamma,
            hp.gae_lambda,
        )
        obs_norm = (
            train_state.obs_norm.update(buffer.obs) if normalize_obs else train_state.obs_norm
        )
        # On-policy: the learner's statistics are the ones the rollout acted with.
        batch = PPOBatch(advantages=advantages, returns=targets, obs_norm=train_state.obs_norm)
        new_state = train_state.replace(
            obs_norm=obs_norm, return_norm=return_norm, return_acc=return_acc
        )
        metrics = {
            "update_dataset/advantage_mean": advantages.mean(),
            "update_dataset/return_target_mean": targets.mean(),
        }
        return new_state, batch, metrics

    def loss_fn(params, obs_norm, mb, hp: PPOHParams):
        obs, action, old_log_prob, old_value, adv, target = mb
        head, log_std, value = dist(params, normalize(obs_norm, obs, normalize_obs))
        if discrete:
            log_prob, entropy = categorical_log_prob(head, action), categorical_entropy(head)
        else:
            action = action.reshape(head.shape)
            log_prob = gaussian_log_prob(head, log_std, action)
            entropy = gaussian_entropy(log_std, head.shape[:1])
        value_clipped = old_value + jnp.clip(value - old_value, -hp.clip_eps, hp.clip_eps)
        value_loss = 0.5 * jnp.maximum((value - target) ** 2, (value_clipped - target) ** 2).mean()
        ratio = jnp.exp(log_prob - old_log_prob)
        if mb_size > 1:  # (one sample's normalised advantage is 0: SB3 skips it too)
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        policy_loss = -jnp.minimum(
            ratio * adv, jnp.clip(ratio, 1.0 - hp.clip_eps, 1.0 + hp.clip_eps) * adv
        ).mean()
        entropy = entropy.mean()
        loss = policy_loss + hp.vf_coef * value_loss - hp.ent_coef * entropy
        approx_kl = ((ratio - 1.0) - jnp.log(ratio)).mean()
        clip_frac = (jnp.abs(ratio - 1.0) > hp.clip_eps).mean()
        return loss, {
            "train/loss": loss,
            "train/policy_loss": policy_loss,
            "train/value_loss": value_loss,
            "train/entropy": entropy,
            "train/approx_kl": approx_kl,
            "train/clip_fraction": clip_frac,
        }

    def train(train_state: PPOState, buffer: Transition, batch: PPOBatch, key, hp: PPOHParams):
        T, N = buffer.reward.shape
        flat = jax.tree.map(
            lambda x: x.reshape((T * N, *x.shape[2:])),
            (
                buffer.obs,
                buffer.action,
                buffer.extras["log_prob"],
                buffer.extras["value"],
                batch.advantages,
                batch.returns,
            ),
        )
        grad_fn = jax.grad(loss_fn, has_aux=True)
        tx = optimizer(hp)
        names: list[str] = []  # the metrics' order in the stacked vector (set when traced)

        def minibatch_step(carry, mb):
            params, opt_state = carry
            grads, metrics = grad_fn(params, batch.obs_norm, mb, hp)
            updates, opt_state = tx.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            metrics["train/grad_norm"] = optax.tree.norm(grads)
            names[:] = sorted(metrics)
            # One stacked vector, not one scan output per metric: on CPU every output of the
            # loop body is an update per step.
            return (params, opt_state), jnp.stack([metrics[k] for k in names])

        # Every pass's shuffle at once, before the loop (see `permutation`).
        perms = jax.vmap(permutation, (0, None))(jax.random.split(key, update_epochs), T * N)

        def update_epoch(carry, perm):
            minibatches = jax.tree.map(
                lambda x: x[perm].reshape((num_minibatches, mb_size, *x.shape[1:])), flat
            )
            return jax.lax.scan(minibatch_step, carry, minibatches)

        (params, opt_state), metrics = jax.lax.scan(
            update_epoch, (train_state.params, train_state.opt_state), perms
        )
        means = metrics.reshape((-1, len(names))).mean(axis=0)
        metrics = {name: means[i] for i, name in enumerate(names)}
        metrics["train/lr"] = learning_rate(hp.lr, anneal_steps, opt_state)
        return train_state.replace(params=params, opt_state=opt_state), metrics

    return Algorithm(
        name="ppo",
        hparams=hparams if hparams is not None else PPOHParams(),
        init=init,
        acting_params=acting_params,
        act=act,
        init_buffer=init_buffer,
        complete_trajectory=complete_trajectory,
        add_to_buffer=add_to_buffer,
        update_dataset=update_dataset,
        train=train,
        grad_steps_per_epoch=grad_steps,
        on_policy=True,
        static={"network": network, "normalize_obs": normalize_obs, "dist": dist},
    )
