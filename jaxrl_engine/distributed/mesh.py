"""The mesh of a config (`mesh.data`, `mesh.sweep`), checked against the visible devices.

A train shards its env batch over a 1-D `data` mesh (default: every device). A sweep adds a
`sweep` axis in front: its members are sharded over `sweep`, each member's env batch over
`data` (default 1: members first, since they need no communication). Both sizes are checked
before anything is compiled, with a message naming the keys.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh

from jaxrl_engine.core.sharding import DATA, data_mesh
from jaxrl_engine.io.config import ConfigError, MeshConfig

SWEEP = "sweep"


def train_mesh(mesh: MeshConfig, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """The `data` mesh of a train: the first `mesh.data` devices (null: all of them)."""
    devices = list(devices) if devices is not None else jax.devices()
    data = mesh.data if mesh.data is not None else len(devices)
    if data > len(devices):
        raise ConfigError(
            f"mesh.data={data} needs {data} devices, {len(devices)} are visible "
            "(leave mesh.data null to use them all)"
        )
    return data_mesh(devices[:data])


def sweep_size(members: int, available: int) -> int:
    """The most devices (at most `available`) that divide `members` evenly."""
    return max(d for d in range(1, min(members, available) + 1) if members % d == 0)


def sweep_mesh(mesh: MeshConfig, members: int, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """The 2-D (`sweep`, `data`) mesh of a program of `members` members.

    mesh.data: null is 1; mesh.sweep: null is `sweep_size(members, devices // data)`. Members
    are never padded: an explicit `mesh.sweep` must divide `members`.
    """
    devices = list(devices) if devices is not None else jax.devices()
    data = mesh.data if mesh.data is not None else 1
    if data > len(devices):
        raise ConfigError(f"mesh.data={data} needs {data} devices, {len(devices)} are visible")
    sweep = mesh.sweep if mesh.sweep is not None else sweep_size(members, len(devices) // data)
    if sweep * data > len(devices):
        raise ConfigError(
            f"mesh.sweep={sweep} x mesh.data={data} needs {sweep * data} devices, "
            f"{len(devices)} are visible"
        )
    if members % sweep:
        raise ConfigError(
            f"mesh.sweep={sweep} must divide the {members} members of each compiled program "
            "(members are sharded evenly, not padded): choose a divisor, or leave mesh.sweep "
            "null to pick the largest that fits the devices"
        )
    chosen = devices[: sweep * data]
    processes = {d.process_index for d in devices}
    if len({d.process_index for d in chosen}) < len(processes):
        # (a process holding no member fails its first collective, then the job hangs)
        raise ConfigError(
            f"{members} members on mesh.sweep={sweep} x mesh.data={data} = {len(chosen)} "
            f"devices leave processes out: a multi-process sweep puts members on the devices "
            f"of all {len(processes)} processes ({len(devices)} devices), so give it a number "
            f"of members that spreads over them (e.g. a multiple of {len(processes)}), or set "
            "mesh.sweep / mesh.data to use them all"
        )
    grid = np.array(chosen).reshape(sweep, data)
    return Mesh(grid, (SWEEP, DATA))
