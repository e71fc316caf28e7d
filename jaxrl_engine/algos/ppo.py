"""PPO (clipped objective, GAE, value loss, entropy bonus) for discrete and continuous actions.

Reads like PureJaxRL's: `update_dataset` turns the rollout into advantages and returns; `train`
is `lax.scan` over update epochs of `lax.scan` over minibatches. Truncated steps bootstrap from
the value of the final observation; terminated steps do not bootstrap.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from jaxrl_engine.algos.networks import (
    ActorCritic,
    categorical_entropy,
    categorical_log_prob,
    gaussian_entropy,
    gaussian_log_prob,
)
from jaxrl_engine.algos.normalize import RunningMeanStd
from jaxrl_engine.buffers.rollout import Transition
from jaxrl_engine.envs.protocol import EnvSpec


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
    gamma: float,
    gae_lambda: float,
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


class PPO:
    name = "ppo"

    def __init__(
        self, cfg: Any, spec: EnvSpec, num_envs: int, num_epochs: int, network: Any = None
    ):
        """network: an injected actor-critic (`init(key, obs)`, `apply(params, obs)`); default
        the flax `ActorCritic`, or a torch module when `cfg.torch_policy` is set."""
        self.cfg, self.spec, self.num_envs = cfg, spec, num_envs
        self.discrete = spec.action.discrete
        action_dim = spec.action.num_actions or int(np.prod(spec.action.shape))
        torch_cfg = getattr(cfg, "torch_policy", None)
        if network is None and torch_cfg is not None:
            from jaxrl_engine.interop.torch_policy import build_torch_policy

            network = build_torch_policy(torch_cfg, spec, cfg.hidden_sizes, cfg.activation)
        if network is None:
            network = ActorCritic(
                action_dim=int(action_dim),
                discrete=self.discrete,
                hidden_sizes=tuple(cfg.hidden_sizes),
                activation=cfg.activation,
            )
        self.network = network
        batch = cfg.num_steps * num_envs
        if batch % cfg.num_minibatches:
            raise ValueError(
                f"algo.num_minibatches={cfg.num_minibatches} must divide "
                f"algo.num_steps * env.num_envs = {batch}"
            )
        self.minibatch_size = batch // cfg.num_minibatches
        total_grad_steps = max(1, num_epochs * self.grad_steps_per_epoch())
        lr = optax.linear_schedule(cfg.lr, 0.0, total_grad_steps) if cfg.anneal_lr else cfg.lr
        self.optimizer = optax.chain(
            optax.clip_by_global_norm(cfg.max_grad_norm), optax.adam(lr, eps=1e-5)
        )
        self.torch_learner = None  # train in torch, act in JAX (algo.torch_policy.learner=torch)
        if torch_cfg is not None and torch_cfg.learner == "torch":
            from jaxrl_engine.interop.torch_learner import TorchPPOLearner

            self.torch_learner = TorchPPOLearner(self, total_grad_steps)

    def grad_steps_per_epoch(self) -> int:
        return self.cfg.update_epochs * self.cfg.num_minibatches

    def init(self, key: jax.Array) -> PPOState:
        obs = jnp.zeros((1, *self.spec.obs_shape), jnp.float32)
        params = self.network.init(key, obs)
        return PPOState(
            params=params,
            opt_state=self.optimizer.init(params),
            obs_norm=RunningMeanStd.create(self.spec.obs_shape),
            return_norm=RunningMeanStd.create(()),
            return_acc=jnp.zeros((self.num_envs,), jnp.float32),
        )

    def acting_params(self, train_state: PPOState) -> dict[str, Any]:
        net = train_state.params
        if hasattr(self.network, "acting_params"):  # e.g. a bf16 acting copy
            net = self.network.acting_params(net)
        return {"net": net, "obs_norm": train_state.obs_norm}

    def _normalize(self, obs_norm: RunningMeanStd, obs: jax.Array) -> jax.Array:
        obs = obs.astype(jnp.float32)
        return obs_norm.normalize(obs) if self.cfg.normalize_obs else obs

    def _dist(self, params: Any, obs: jax.Array) -> tuple[jax.Array, Any, jax.Array]:
        """(logits or mean, log_std or None, value) for a batch of normalised observations."""
        return self.network.apply(params, obs)  # type: ignore[return-value]

    def act(self, params, obs, key, deterministic):
        """obs: [num_envs, *obs_shape] -> action, extras {log_prob, value} ([num_envs])."""
        head, log_std, value = self._dist(params["net"], self._normalize(params["obs_norm"], obs))
        if self.discrete:
            action = (
                jnp.argmax(head, -1) if deterministic else jax.random.categorical(key, head)
            ).astype(jnp.int32)
            log_prob = categorical_log_prob(head, action)
        else:
            noise = jax.random.normal(key, head.shape)
            action = head if deterministic else head + jnp.exp(log_std) * noise
            log_prob = gaussian_log_prob(head, log_std, action)
            action = action.reshape((obs.shape[0], *self.spec.action.shape))
        return action, {"log_prob": log_prob, "value": value}

    def init_buffer(self, trajectory: Transition) -> Transition:
        return jax.tree.map(jnp.zeros_like, trajectory)

    def add_to_buffer(self, buffer: Transition, trajectory: Transition) -> Transition:
        return trajectory

    def complete_trajectory(self, params, trajectory: Transition) -> Transition:
        """Adds V(next_obs) (the bootstrap values), computed with the acting params."""
        T, N = trajectory.reward.shape
        flat_next = trajectory.next_obs.reshape((T * N, *self.spec.obs_shape))
        _, _, next_value = self._dist(params["net"], self._normalize(params["obs_norm"], flat_next))
        extras = {**trajectory.extras, "next_value": next_value.reshape((T, N))}
        return trajectory._replace(extras=extras)

    def update_dataset(self, train_state: PPOState, buffer: Transition, key):
        """GAE over the rollout; advances the observation and return normalisers."""
        cfg = self.cfg
        reward = buffer.reward.astype(jnp.float32)
        done = jnp.logical_or(buffer.terminated, buffer.truncated)
        return_norm, return_acc = train_state.return_norm, train_state.return_acc
        if cfg.normalize_reward:

            def discounted(acc, x):
                r, d = x
                acc = acc * cfg.gamma + r
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
            cfg.gamma,
            cfg.gae_lambda,
        )
        obs_norm = (
            train_state.obs_norm.update(buffer.obs) if cfg.normalize_obs else train_state.obs_norm
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

    def _loss(self, params, obs_norm, mb):
        cfg = self.cfg
        obs, action, old_log_prob, old_value, adv, target = mb
        head, log_std, value = self._dist(params, self._normalize(obs_norm, obs))
        if self.discrete:
            log_prob, entropy = categorical_log_prob(head, action), categorical_entropy(head)
        else:
            action = action.reshape(head.shape)
            log_prob = gaussian_log_prob(head, log_std, action)
            entropy = gaussian_entropy(log_std, head.shape[:1])
        value_clipped = old_value + jnp.clip(value - old_value, -cfg.clip_eps, cfg.clip_eps)
        value_loss = 0.5 * jnp.maximum((value - target) ** 2, (value_clipped - target) ** 2).mean()
        ratio = jnp.exp(log_prob - old_log_prob)
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        policy_loss = -jnp.minimum(
            ratio * adv, jnp.clip(ratio, 1.0 - cfg.clip_eps, 1.0 + cfg.clip_eps) * adv
        ).mean()
        entropy = entropy.mean()
        loss = policy_loss + cfg.vf_coef * value_loss - cfg.ent_coef * entropy
        approx_kl = ((ratio - 1.0) - jnp.log(ratio)).mean()
        clip_frac = (jnp.abs(ratio - 1.0) > cfg.clip_eps).mean()
        return loss, {
            "train/loss": loss,
            "train/policy_loss": policy_loss,
            "train/value_loss": value_loss,
            "train/entropy": entropy,
            "train/approx_kl": approx_kl,
            "train/clip_fraction": clip_frac,
        }

    def train(self, train_state: PPOState, buffer: Transition, batch: PPOBatch, key):
        if self.torch_learner is not None:
            return self.torch_learner.train(train_state, buffer, batch, key)
        cfg = self.cfg
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
        grad_fn = jax.grad(self._loss, has_aux=True)

        names: list[str] = []  # the metrics' order in the stacked vector (set when traced)

        def minibatch_step(carry, mb):
            params, opt_state = carry
            grads, metrics = grad_fn(params, batch.obs_norm, mb)
            updates, opt_state = self.optimizer.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            metrics["train/grad_norm"] = optax.tree.norm(grads)
            names[:] = sorted(metrics)
            # One stacked vector, not one scan output per metric: on CPU every output of the
            # loop body is an update per step.
            return (params, opt_state), jnp.stack([metrics[k] for k in names])

        def update_epoch(carry, epoch_key):
            perm = jax.random.permutation(epoch_key, T * N)
            minibatches = jax.tree.map(
                lambda x: x[perm].reshape((cfg.num_minibatches, self.minibatch_size, *x.shape[1:])),
                flat,
            )
            return jax.lax.scan(minibatch_step, carry, minibatches)

        (params, opt_state), metrics = jax.lax.scan(
            update_epoch,
            (train_state.params, train_state.opt_state),
            jax.random.split(key, cfg.update_epochs),
        )
        means = metrics.reshape((-1, len(names))).mean(axis=0)
        metrics = {name: means[i] for i, name in enumerate(names)}
        return train_state.replace(params=params, opt_state=opt_state), metrics
