"""Flax networks: MLP and CNN torsos and the PPO actor-critic heads (discrete and Gaussian)."""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_engine.algos.torso import ConvSpec

ACTIVATIONS = {"tanh": nn.tanh, "relu": nn.relu, "gelu": nn.gelu, "silu": nn.silu}


class MLP(nn.Module):
    """Dense layers with orthogonal init; the last layer has `out_dim` units and `out_scale`."""

    hidden_sizes: Sequence[int]
    out_dim: int
    activation: str = "tanh"
    out_scale: float = 1.0

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        act = ACTIVATIONS[self.activation]
        x = x.reshape((x.shape[0], -1))  # [batch, *obs_shape] -> [batch, features]
        for width in self.hidden_sizes:
            x = act(nn.Dense(width, kernel_init=nn.initializers.orthogonal(np.sqrt(2)))(x))
        return nn.Dense(self.out_dim, kernel_init=nn.initializers.orthogonal(self.out_scale))(x)


class CNN(nn.Module):
    """Conv layers (NHWC, orthogonal init) and then the `MLP` on the flattened features."""

    conv: ConvSpec
    hidden_sizes: Sequence[int]
    out_dim: int
    activation: str = "relu"
    out_scale: float = 1.0

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """x: [batch, H, W, C] ([batch, C, H, W] with layout "chw") -> [batch, out_dim]."""
        act = ACTIVATIONS[self.activation]
        if self.conv.layout == "chw":
            x = x.transpose((0, 2, 3, 1))
        for features, kernel, stride in zip(
            self.conv.channels, self.conv.kernels, self.conv.strides, strict=True
        ):
            conv = nn.Conv(
                features,
                (kernel, kernel),
                strides=(stride, stride),
                padding="VALID",
                kernel_init=nn.initializers.orthogonal(np.sqrt(2)),
            )
            x = act(conv(x))
        return MLP(self.hidden_sizes, self.out_dim, self.activation, self.out_scale)(x)


def torso_network(
    conv: ConvSpec | None,
    hidden_sizes: Sequence[int],
    out_dim: int,
    activation: str,
    out_scale: float = 1.0,
) -> nn.Module:
    """A `CNN` with these conv layers, or an `MLP` (on flattened observations) when None."""
    if conv is None:
        return MLP(tuple(hidden_sizes), out_dim, activation, out_scale)
    return CNN(conv, tuple(hidden_sizes), out_dim, activation, out_scale)


class ActorCritic(nn.Module):
    """Separate actor and critic networks (MLPs, or CNNs with `conv`). Discrete: logits;
    continuous: mean and state-free log-std."""

    action_dim: int
    discrete: bool
    hidden_sizes: Sequence[int] = (64, 64)
    activation: str = "tanh"
    conv: ConvSpec | None = None

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array | None, jax.Array]:
        """obs: f32[batch, *obs_shape] -> (logits or mean [batch, action_dim], log_std | None,
        value [batch])."""
        net = (self.conv, self.hidden_sizes)
        head = torso_network(*net, self.action_dim, self.activation, out_scale=0.01)(obs)
        value = torso_network(*net, 1, self.activation, out_scale=1.0)(obs)[..., 0]
        if self.discrete:
            return head, None, value
        log_std = self.param("log_std", nn.initializers.zeros, (self.action_dim,))
        return head, log_std, value


def categorical_log_prob(logits: jax.Array, action: jax.Array) -> jax.Array:
    logp = jax.nn.log_softmax(logits)
    return jnp.take_along_axis(logp, action[..., None].astype(jnp.int32), axis=-1)[..., 0]


def categorical_entropy(logits: jax.Array) -> jax.Array:
    logp = jax.nn.log_softmax(logits)
    return -(jnp.exp(logp) * logp).sum(-1)


def gaussian_log_prob(mean: jax.Array, log_std: jax.Array, action: jax.Array) -> jax.Array:
    z = (action - mean) * jnp.exp(-log_std)
    return (-0.5 * z**2 - log_std - 0.5 * jnp.log(2 * jnp.pi)).sum(-1)


def gaussian_entropy(log_std: jax.Array, batch_shape: tuple[int, ...]) -> jax.Array:
    ent = (log_std + 0.5 * (1.0 + jnp.log(2 * jnp.pi))).sum(-1)
    return jnp.broadcast_to(ent, batch_shape)
