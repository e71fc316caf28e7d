"""`core.memory`: the bytes a state needs in each memory pool, from shapes and shardings."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec

import jaxrl_engine.core.memory as memory
from tests.conftest import run_on_four_devices


def test_pool_bytes_counts_every_leaf_once_per_device_and_names_the_largest():
    mesh = jax.make_mesh((1,), ("data",))
    shapes = {
        "w": jax.ShapeDtypeStruct((256, 128), jnp.float32),
        "key": jax.eval_shape(lambda: jax.random.key(0)),
        "n": jax.ShapeDtypeStruct((), jnp.int32),
    }
    shardings = jax.tree.map(lambda _: NamedSharding(mesh, PartitionSpec()), shapes)
    pools, leaves = memory.pool_bytes(shapes, shardings)
    assert pools == {"host": 256 * 128 * 4 + 8 + 4}
    assert leaves[0] == (256 * 128 * 4, "['w'] [256, 128] float32")


def test_check_state_fits_names_the_pool_and_the_largest_parts(monkeypatch):
    mesh = jax.make_mesh((1,), ("data",))
    shapes = {"big": jax.ShapeDtypeStruct((1024, 1024), jnp.float32)}
    shardings = {"big": NamedSharding(mesh, PartitionSpec())}
    monkeypatch.setattr(memory, "host_available_bytes", lambda: 8 * 2**20)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        memory.check_state_fits(shapes, shardings)  # half the memory: fits, nothing said
    monkeypatch.setattr(memory, "host_available_bytes", lambda: 4 * 2**20)
    with pytest.warns(UserWarning, match=r"needs 4.00 MiB of this host's .*up to about twice"):
        memory.check_state_fits(shapes, shardings)  # exactly 4 MiB: fits, but tightly
    monkeypatch.setattr(memory, "host_available_bytes", lambda: 4 * 2**20 - 1)
    with pytest.raises(
        memory.StateTooLargeError,
        match=r"needs 4.00 MiB, more than this host's available memory \(4.00 MiB\).*\['big'\] \[1024, 1024\]",
    ):
        memory.check_state_fits(shapes, shardings)
    monkeypatch.setattr(memory, "host_available_bytes", lambda: None)  # unknown: not checked
    memory.check_state_fits(shapes, shardings)


def test_on_four_cpu_devices_a_replicated_leaf_counts_four_times_a_sharded_one_once():
    out = run_on_four_devices(
        """
import json, jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
from jaxrl_engine.core.memory import pool_bytes
mesh = jax.make_mesh((4,), ("data",))
shapes = {"params": jax.ShapeDtypeStruct((1000,), jnp.float32),
          "obs": jax.ShapeDtypeStruct((64, 10), jnp.float32)}
shardings = {"params": NamedSharding(mesh, P()), "obs": NamedSharding(mesh, P("data"))}
print(json.dumps(pool_bytes(shapes, shardings)[0]))
"""
    )
    # Four CPU devices share this host's memory: 4 copies of params, the obs split in four.
    assert out == {"host": 4 * 1000 * 4 + 64 * 10 * 4}
