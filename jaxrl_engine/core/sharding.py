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


def to_host(tree: Any) -> Any:
    """numpy copies of a pytree of arrays, in any process of a multi-process run.

    An array this process holds whole is read as it is, a replicated one from its local copy;
    one sharded over other processes' devices is gathered (a collective: every process calls
    this with the same tree, as the driver does)."""

    def one(x: Any) -> Any:
        if not isinstance(x, jax.Array) or x.is_fully_addressable:
            return np.asarray(jax.device_get(x))
        if x.is_fully_replicated:
            return np.asarray(x.addressable_data(0))
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))

    return jax.tree.map(one, tree)


def is_primary() -> bool:
    """Whether this process writes the run's files (process 0; the only one, usually)."""
    return jax.process_index() == 0


def max_over_processes(value: int) -> int:
    """The largest of `value` over every process of a multi-process run (a collective: every
    process calls it at the same point); `value` itself with one process."""
    if jax.process_count() == 1:
        return value
    from jax.experimental import multihost_utils

    return int(np.max(multihost_utils.process_allgather(np.int32(value))))


def sync_processes(name: str) -> None:
    """A barrier over every process of a multi-process run (a no-op with one)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)
