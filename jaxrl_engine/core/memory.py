"""Does the engine state fit in memory? Checked from shapes, before anything is compiled.

A state larger than the memory that holds it fails late and badly: XLA's CPU client allocates
the buffers of `init` (a 3 x 100,000-wide MLP is ~80 GB of parameters, Adam's moments twice
that again) and the process swaps or is killed, without a word about which size was wrong.
`check_state_fits` adds up the bytes each memory pool would hold (from `jax.eval_shape`'s
shapes and the state's shardings) and raises `StateTooLargeError` naming the largest leaves.
Only the state is counted: training needs more (gradients, the rollout's trajectory, XLA's
temporaries), so a state that passes may still not fit, but one that fails cannot.
"""

from __future__ import annotations

import math
import os
import warnings
from typing import Any

import jax

GiB = 1024**3


class StateTooLargeError(ValueError):
    """The engine state needs more memory than its devices (or this host) have."""


def host_available_bytes() -> int | None:
    """This host's available memory (`MemAvailable` on Linux), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def device_limit_bytes(device: Any) -> int | None:
    """An accelerator's memory pool (`bytes_limit` of its allocator), or None where unknown."""
    try:
        stats = device.memory_stats() or {}
    except Exception:  # backends without allocator statistics
        return None
    limit = stats.get("bytes_limit")
    return int(limit) if limit else None


def _pool(device: Any, memory_kind: str | None) -> str:
    """The memory a shard lives in: the host's for CPU devices and host memory kinds."""
    if device.platform == "cpu" or (memory_kind or "").endswith("host"):
        return "host"
    return f"{device.platform}:{device.id}"


def pool_bytes(shapes: Any, shardings: Any) -> tuple[dict[str, int], list[tuple[int, str]]]:
    """({pool: bytes}, [(bytes, description) of each leaf, largest first]) of a state of
    `shapes` (ShapeDtypeStructs) placed by `shardings` (a matching pytree of Shardings). The
    pools are this process's: its host memory and each of its accelerators."""
    pools: dict[str, int] = {}
    leaves: list[tuple[int, str]] = []
    here = jax.process_index()
    flat_shardings = jax.tree.leaves(
        shardings, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding)
    )
    flat = jax.tree_util.tree_flatten_with_path(shapes)[0]
    if len(flat) != len(flat_shardings):
        raise ValueError(f"{len(flat)} state leaves but {len(flat_shardings)} shardings")
    for (path, leaf), sharding in zip(flat, flat_shardings, strict=True):
        itemsize = leaf.dtype.itemsize  # a PRNG key dtype has one too (8 for threefry)
        shard = math.prod(sharding.shard_shape(leaf.shape)) * itemsize
        kind = getattr(sharding, "memory_kind", None)
        for device in sharding.device_set:
            if device.process_index != here:  # another process's (host's) memory
                continue
            pool = _pool(device, kind)
            pools[pool] = pools.get(pool, 0) + shard
        total = math.prod(leaf.shape) * itemsize
        leaves.append(
            (total, f"{jax.tree_util.keystr(path).lstrip('.')} {list(leaf.shape)} {leaf.dtype}")
        )
    leaves.sort(key=lambda t: -t[0])
    return pools, leaves


def check_state_fits(
    shapes: Any,
    shardings: Any,
    *,
    what: str = "the engine state",
) -> None:
    """Raise `StateTooLargeError` when a state of `shapes` placed by `shardings` needs more
    bytes in some memory pool than it has (the host's available memory; an
    accelerator's allocator limit). A pool whose size is unknown is not checked."""
    pools, leaves = pool_bytes(shapes, shardings)
    devices = {
        f"{d.platform}:{d.id}": d
        for s in jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))
        for d in s.device_set
    }
    for pool, need in sorted(pools.items()):
        have = host_available_bytes() if pool == "host" else device_limit_bytes(devices[pool])
        if have is None or need <= have // 2:
            continue
        where = "this host's available memory" if pool == "host" else f"device {pool}'s memory"
        largest = "; ".join(f"{desc}: {_size(size)}" for size, desc in leaves[:3])
        if need <= have:  # (measured: a SAC run's peak was 1.5-2.2x its replay buffer)
            warnings.warn(
                f"{what} needs {_size(need)} of {where} ({_size(have)}): training needs more "
                "than its state (compiled programs' buffers, checkpoint copies; up to about "
                f"twice it), so the run may be killed for memory; its largest parts: {largest}",
                stacklevel=2,
            )
            continue
        raise StateTooLargeError(
            f"{what} needs {_size(need)}, more than {where} ({_size(have)}), before any "
            f"training memory; its largest parts: {largest}"
        )


def _size(n: int) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / 2**20:.2f} MiB"
