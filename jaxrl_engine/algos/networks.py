"""Flax networks: MLP and CNN torsos and the PPO actor-critic heads (discrete and Gaussian)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax.linen.dtypes import promote_dtype

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
        # [batch, *obs_shape] -> [batch, features] (named: an empty batch has no -1)
        x = x.reshape((x.shape[0], math.prod(x.shape[1:])))
        for width in self.hidden_sizes:
            x = act(nn.Dense(width, kernel_init=nn.initializers.orthogonal(np.sqrt(2)))(x))
        return nn.Dense(self.out_dim, kernel_init=nn.initializers.orthogonal(self.out_scale))(x)


def conv_as_matmul(x: jax.Array, kernel: jax.Array, stride: int) -> jax.Array:
    """A VALID convolution of `x` [batch, H, W, C] with `kernel` [kh, kw, C, out] at `stride`,
    computed as one dot: the kh*kw strided slices of `x` concatenated along channels (in the
    kernel's (row, column, channel) order) times the kernel reshaped to [kh*kw*C, out].

    The same sum as `lax.conv_general_dilated` in another order (equal to float rounding).
    Why: XLA:CPU runs a convolution inside a loop (the update's minibatch scan) through a slow
    generic path, about 10x slower than this dot on MinAtar's shapes (benchmarks/RESULTS.md).
    """
    kh, kw, c, out = kernel.shape
    out_h = (x.shape[1] - kh) // stride + 1
    out_w = (x.shape[2] - kw) // stride + 1
    slices = [
        x[:, i : i + stride * (out_h - 1) + 1 : stride, j : j + stride * (out_w - 1) + 1 : stride]
        for i in range(kh)
        for j in range(kw)
    ]
    patches = jnp.concatenate(slices, axis=-1)  # [batch, out_h, out_w, kh*kw*C]
    return patches @ kernel.reshape(kh * kw * c, out)


class MatmulConv(nn.Module):
    """`nn.Conv` (VALID, square kernel and stride) with the same parameters, by `conv_as_matmul`."""

    features: int
    kernel: int
    stride: int
    kernel_init: nn.initializers.Initializer

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        shape = (self.kernel, self.kernel, x.shape[-1], self.features)
        kernel = self.param("kernel", self.kernel_init, shape, jnp.float32)
        bias = self.param("bias", nn.initializers.zeros_init(), (self.features,), jnp.float32)
        x, kernel, bias = promote_dtype(x, kernel, bias)  # as nn.Conv does
        return conv_as_matmul(x, kernel, self.stride) + bias


def conv_impl(impl: str) -> str:
    """`algo.cnn.impl` resolved: auto is matmul on CPU, xla on other backends."""
    if impl != "auto":
        return impl
    return "matmul" if jax.default_backend() == "cpu" else "xla"


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
        impl = conv_impl(self.conv.impl)
        init = nn.initializers.orthogonal(np.sqrt(2))
        for i, (features, kernel, stride) in enumerate(
            zip(self.conv.channels, self.conv.kernels, self.conv.strides, strict=True)
        ):
            # Either way the layer is named Conv_i with the same parameters: checkpoints and
            # exports do not depend on the choice.
            if impl == "matmul":
                conv: nn.Module = MatmulConv(features, kernel, stride, init, name=f"Conv_{i}")
            else:
                conv = nn.Conv(
                    features,
                    (kernel, kernel),
                    strides=(stride, stride),
                    padding="VALID",
                    kernel_init=init,
                    name=f"Conv_{i}",
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
    # (log_std [action_dim] or [batch, action_dim]: broadcast explicitly, no rank promotion)
    z = (action - mean) * jnp.broadcast_to(jnp.exp(-log_std), mean.shape)
    log_std = jnp.broadcast_to(log_std, mean.shape)
    return (-0.5 * z**2 - log_std - 0.5 * jnp.log(2 * jnp.pi)).sum(-1)


def gaussian_entropy(log_std: jax.Array, batch_shape: tuple[int, ...]) -> jax.Array:
    ent = (log_std + 0.5 * (1.0 + jnp.log(2 * jnp.pi))).sum(-1)
    return jnp.broadcast_to(ent, batch_shape)
