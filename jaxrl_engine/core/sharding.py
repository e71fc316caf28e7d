"""The `data` mesh and where each leaf of the engine state lives on it.

Env batch, episode accumulators and rollout buffers are sharded over `data` along their env
axis; params, optimizer state and everything else are replicated. Plain `jit` over these
placements (GSPMD) partitions the phases; no `shard_map` is needed for PPO.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_engine.core.state import get_path, set_path

DATA = "data"


def data_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A 1-D mesh named `data` over `devices` (default: every device JAX sees)."""
    devices = list(devices) if devices is not None else jax.devices()
    return Mesh(np.array(devices), (DATA,))


def state_sharding(
    state_shape: Any, mesh: Mesh, num_envs: int, host_paths: Sequence[str] = ()
) -> Any:
    """A pytree of `NamedSharding`s matching `state_shape` (an `EngineState` of shapes).

    host_paths: dotted paths whose leaves live in `pinned_host` memory between epochs (offload).
    """
    replicated = NamedSharding(mesh, PartitionSpec(), memory_kind="device")

    def env_axis(axis: int):
        def place(x):
            if len(x.shape) > axis and x.shape[axis] == num_envs:
                return NamedSharding(mesh, PartitionSpec(*([None] * axis), DATA))
            return replicated

        return place

    sharding = jax.tree.map(lambda _: replicated, state_shape)
    sharding = sharding.replace(
        env=jax.tree.map(env_axis(0), state_shape.env),
        stats=jax.tree.map(env_axis(0), state_shape.stats),
        buffer=jax.tree.map(env_axis(1), state_shape.buffer),
        batch=jax.tree.map(env_axis(1), state_shape.batch),
    )
    host = NamedSharding(mesh, PartitionSpec(), memory_kind="pinned_host")
    for path in host_paths:
        sharding = set_path(sharding, path, jax.tree.map(lambda _: host, get_path(sharding, path)))
    return sharding
