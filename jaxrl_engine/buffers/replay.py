"""The replay buffer: a fixed-shape ring buffer of transitions, `[capacity_per_env, num_envs, ...]`.

Every leaf of `ReplayBuffer.data` has the env axis second, like the rollout buffer
(`[num_steps, num_envs, ...]`), so `core.sharding.state_sharding` shards it over the `data`
mesh axis with no special case: each device stores the transitions of its own envs.

All functions are pure and jittable; shapes never change. Two modes:
- `circular`: a full buffer overwrites its oldest rows;
- `fixed`: a full buffer overwrites nothing. Inside jit nothing can raise, so rows that do not
  fit are dropped and `overflowed` is set; `check_not_overflowed` raises on the host. The engine
  never gets there: the config refuses, before anything compiles, a fixed buffer smaller than
  the run (`algo.buffer_size` vs `total_env_steps`, see `io/config.py`).

Adding is a scatter of `num_steps` rows; inside a jit that donates the state (the engine's epoch
does) XLA updates the buffer in place, so adding costs the same at any capacity
(`benchmarks/offpolicy_memory.py` measures it).

Why not flashbax: it imports and runs with jax 0.10.2, but its buffers are laid out
`[num_envs, time, ...]` (the mesh rule shards axis 1), its flat buffer builds transitions from
consecutive observations (after an auto-reset the next observation is the new episode's first,
not `final_observation`), and it has no fixed mode. The ring buffer here is ~150 lines.
"""

from __future__ import annotations

from typing import Any, Literal

import jax
import jax.numpy as jnp
from flax import struct

Mode = Literal["circular", "fixed"]


class BufferOverflowError(RuntimeError):
    """A fixed-mode buffer was asked to hold more transitions than its capacity."""


class ReplayBuffer(struct.PyTreeNode):
    """data: pytree of [capacity_per_env, num_envs, ...]; position: next row; count: rows added."""

    data: Any
    position: jax.Array  # i32[]: the row the next add starts at
    count: jax.Array  # i32[]: rows added so far (per env), capped at capacity in fixed mode
    overflowed: jax.Array  # bool[]: a fixed-mode add dropped rows
    mode: str = struct.field(pytree_node=False, default="circular")

    @property
    def capacity_per_env(self) -> int:
        return jax.tree.leaves(self.data)[0].shape[0]

    @property
    def num_envs(self) -> int:
        return jax.tree.leaves(self.data)[0].shape[1]

    @property
    def capacity(self) -> int:
        """Transitions the buffer holds when full."""
        return self.capacity_per_env * self.num_envs

    def rows(self) -> jax.Array:
        """i32[]: rows (per env) holding data; every env has the same number."""
        return jnp.minimum(self.count, self.capacity_per_env)

    def size(self) -> jax.Array:
        """i32[]: transitions held."""
        return self.rows() * self.num_envs


def init(item: Any, capacity_per_env: int, mode: Mode = "circular") -> ReplayBuffer:
    """An empty buffer for items shaped like `item` (leaves [num_envs, ...])."""
    if mode not in ("circular", "fixed"):
        raise ValueError(f"replay buffer mode {mode!r}; valid choices: circular, fixed")
    if capacity_per_env < 1:
        raise ValueError(f"replay buffer capacity_per_env={capacity_per_env} must be >= 1")
    data = jax.tree.map(lambda x: jnp.zeros((capacity_per_env, *x.shape), x.dtype), item)
    return ReplayBuffer(
        data=data,
        position=jnp.zeros((), jnp.int32),
        count=jnp.zeros((), jnp.int32),
        overflowed=jnp.zeros((), bool),
        mode=mode,
    )


def add(buffer: ReplayBuffer, trajectory: Any) -> ReplayBuffer:
    """Write a trajectory (leaves [num_steps, num_envs, ...]) at `position`, wrapping around.

    Fixed mode: rows past the capacity are dropped (nothing is overwritten) and `overflowed` set.
    """
    steps = jax.tree.leaves(trajectory)[0].shape[0]
    cap = buffer.capacity_per_env
    offsets = jnp.arange(steps, dtype=jnp.int32)
    rows = (buffer.position + offsets) % cap
    if buffer.mode == "fixed":
        fits = buffer.count + offsets < cap
        rows = jnp.where(fits, rows, cap)  # out of bounds: dropped by mode="drop"
        count = jnp.minimum(buffer.count + steps, cap)
        overflowed = buffer.overflowed | ~jnp.all(fits)
        position = jnp.minimum(buffer.position + steps, cap) % cap
    else:
        count = jnp.minimum(buffer.count + steps, jnp.iinfo(jnp.int32).max // 2)
        overflowed = buffer.overflowed
        position = (buffer.position + steps) % cap
    data = jax.tree.map(
        lambda store, new: store.at[rows].set(new.astype(store.dtype), mode="drop"),
        buffer.data,
        trajectory,
    )
    return buffer.replace(data=data, position=position, count=count, overflowed=overflowed)


def sample_uniform(
    buffer: ReplayBuffer, key: jax.Array, shape: tuple[int, ...]
) -> tuple[jax.Array, jax.Array]:
    """(rows, envs), each i32[*shape]: uniform over the written transitions only.

    Before anything is written there is nothing to sample: rows are then 0 (callers gate on
    `size() >= min_size`).
    """
    k_row, k_env = jax.random.split(key)
    rows = jax.random.randint(k_row, shape, 0, jnp.maximum(buffer.rows(), 1), dtype=jnp.int32)
    envs = jax.random.randint(k_env, shape, 0, buffer.num_envs, dtype=jnp.int32)
    return rows, envs


def sample_prioritized(
    buffer: ReplayBuffer,
    priorities: jax.Array,
    key: jax.Array,
    shape: tuple[int, ...],
    alpha: float | jax.Array,
    beta: float | jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(rows, envs, importance weights f32[*shape]), P(i) proportional to priorities[i]**alpha.

    priorities: f32[capacity_per_env, num_envs] (unwritten rows are never drawn, whatever they
    hold). Weights are (size * P(i))**-beta, divided by their maximum over each minibatch (the
    last axis of `shape`: Schaul et al. 2016, so a minibatch's largest weight is 1). Sampling
    is one cumulative sum and a binary search per draw: O(capacity) per call, then
    O(log capacity) per draw.
    """
    cap, num_envs = priorities.shape
    written = jnp.arange(cap)[:, None] < buffer.rows()
    p = jnp.where(written, priorities.astype(jnp.float32) ** alpha, 0.0).reshape(-1)
    cdf = jnp.cumsum(p)
    total = cdf[-1]
    u = jax.random.uniform(key, shape) * total
    flat = jnp.clip(jnp.searchsorted(cdf, u, side="right"), 0, cap * num_envs - 1)
    prob = p[flat] / jnp.maximum(total, 1e-30)
    weights = (buffer.size().astype(jnp.float32) * prob) ** (-beta)
    weights = weights / jnp.maximum(weights.max(axis=-1, keepdims=True), 1e-30)
    return (flat // num_envs).astype(jnp.int32), (flat % num_envs).astype(jnp.int32), weights


def gather(buffer: ReplayBuffer, rows: jax.Array, envs: jax.Array) -> Any:
    """The transitions at (rows, envs): leaves [*rows.shape, ...]."""
    return jax.tree.map(lambda x: x[rows, envs], buffer.data)


def check_not_overflowed(buffer: ReplayBuffer) -> None:
    """Host side: raise `BufferOverflowError` if a fixed-mode add dropped rows."""
    if bool(jax.device_get(jnp.any(buffer.overflowed))):
        raise BufferOverflowError(
            f"fixed-mode replay buffer overflowed its capacity of {buffer.capacity} transitions "
            f"({buffer.capacity_per_env} rows x {buffer.num_envs} envs); rows past it were "
            "dropped. Raise the capacity (algo.buffer_size) or use algo.buffer_mode=circular"
        )
