"""Running mean/variance (Welford, batched) for observation and reward normalisation."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


class RunningMeanStd(struct.PyTreeNode):
    mean: jax.Array
    var: jax.Array
    count: jax.Array  # f32[]

    @classmethod
    def create(cls, shape: tuple[int, ...]) -> RunningMeanStd:
        return cls(
            mean=jnp.zeros(shape, jnp.float32),
            var=jnp.ones(shape, jnp.float32),
            count=jnp.full((), 1e-4, jnp.float32),
        )

    def update(self, x: jax.Array) -> RunningMeanStd:
        """Merge a batch `x: [..., *shape]` (all leading axes are samples)."""
        x = x.reshape((-1, *self.mean.shape)).astype(jnp.float32)
        b_mean, b_var, b_count = x.mean(0), x.var(0), jnp.float32(x.shape[0])
        delta = b_mean - self.mean
        total = self.count + b_count
        mean = self.mean + delta * b_count / total
        m2 = self.var * self.count + b_var * b_count + delta**2 * self.count * b_count / total
        return RunningMeanStd(mean=mean, var=m2 / total, count=total)

    def normalize(self, x: jax.Array, clip: float = 10.0) -> jax.Array:
        # (explicit broadcasts over the leading sample axes: no rank promotion)
        mean = jnp.broadcast_to(self.mean, x.shape)
        std = jnp.broadcast_to(jnp.sqrt(self.var + 1e-8), x.shape)
        return jnp.clip((x - mean) / std, -clip, clip)
