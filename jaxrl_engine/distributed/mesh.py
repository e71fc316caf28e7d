"""The mesh of a config (`mesh.data`, `mesh.sweep`), checked against the visible devices.

A train shards its env batch over a 1-D `data` mesh (default: every device). A sweep adds a
`sweep` axis in front: its members are sharded over `sweep`, each member's env batch over
`data` (default 1: members first, since they need no communication). Both sizes are checked
before anything is compiled, with a message naming the keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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


def sweep_size(members: int, available: int, processes: int = 1, data: int = 1) -> int:
    """The most devices (at most `available`) that divide `members` evenly; with several
    processes, a number whose devices (times `data`) spread evenly over them (else 0)."""
    fits = [
        d
        for d in range(1, min(members, available) + 1)
        if members % d == 0 and (d * data) % processes == 0
    ]
    return max(fits, default=0)


def sweep_mesh(mesh: MeshConfig, members: int, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """The 2-D (`sweep`, `data`) mesh of a program of `members` members.

    mesh.data: null is 1; mesh.sweep: null is `sweep_size(members, devices // data)`. Members
    are never padded: an explicit `mesh.sweep` must divide `members`. In a multi-process job
    the mesh takes as many devices from each process (every process holds members).
    """
    chosen, sweep, data = sweep_devices(mesh, members, devices)
    grid = np.array(chosen).reshape(sweep, data)
    return Mesh(grid, (SWEEP, DATA))


def sweep_devices(
    mesh: MeshConfig, members: int, devices: Sequence[Any] | None = None
) -> tuple[list[Any], int, int]:
    """(the devices of a program's mesh in (sweep, data) order, sweep, data); `sweep_mesh`."""
    devices = list(devices) if devices is not None else jax.devices()
    processes = sorted({d.process_index for d in devices})
    data = mesh.data if mesh.data is not None else 1
    if data > len(devices):
        raise ConfigError(f"mesh.data={data} needs {data} devices, {len(devices)} are visible")
    n = len(processes)
    sweep = (
        mesh.sweep if mesh.sweep is not None else sweep_size(members, len(devices) // data, n, data)
    )
    if sweep == 0 or (sweep * data) % n:
        # (a process holding no member fails its first collective, then the job hangs)
        raise ConfigError(
            f"{members} members cannot be spread evenly over the job's {n} processes "
            f"(mesh.sweep x mesh.data = {sweep or '?'} x {data} devices; every process must "
            f"hold members): give the sweep a number of members with a divisor that, times "
            f"mesh.data, is a multiple of {n} and fits the {len(devices)} devices (e.g. {n} "
            "members), or set mesh.sweep / mesh.data"
        )
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
    per = sweep * data // n  # from each process, in its own device order
    chosen = [d for p in processes for d in [x for x in devices if x.process_index == p][:per]]
    if len(chosen) < sweep * data:
        raise ConfigError(
            f"mesh.sweep={sweep} x mesh.data={data} needs {per} devices from each of the "
            f"{n} processes; some have fewer"
        )
    return chosen, sweep, data
