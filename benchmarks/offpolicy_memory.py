"""Replay-buffer memory and add time (issue 4).

1. A 1,000,000-transition CartPole buffer (obs f32[4], action i32, reward f32, terminated bool,
   truncated bool, next_obs f32[4]; 16 envs x 62,500 rows): the raw bytes of its fields, the
   bytes JAX holds for it (`jax.live_arrays`), and the growth of the process's resident memory
   from just before `init` to after it was filled completely (every page written), against the
   raw bytes. Everything that compiles is compiled before the first reading. Fails (exit 1)
   above 1.1x.
2. Add time vs capacity: one add of 64 steps x 16 envs, jitted with the buffer donated (how the
   engine's epoch calls it) and, for contrast, without donation (XLA must copy the buffer to
   write the copy). The donated add should stay flat as capacity grows 100x.

    .venv/bin/python benchmarks/offpolicy_memory.py [--repeats 50]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_engine.buffers import replay
from jaxrl_engine.buffers.rollout import Transition

NUM_ENVS, STEPS = 16, 64
LIMIT = 1.1


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def item(num_envs: int = NUM_ENVS) -> Transition:
    return Transition(
        obs=jnp.zeros((num_envs, 4), jnp.float32),
        action=jnp.zeros((num_envs,), jnp.int32),
        reward=jnp.zeros((num_envs,), jnp.float32),
        terminated=jnp.zeros((num_envs,), bool),
        truncated=jnp.zeros((num_envs,), bool),
        next_obs=jnp.zeros((num_envs, 4), jnp.float32),
        extras={},
    )


def chunk(key: jax.Array) -> Transition:
    """64 steps x 16 envs of random CartPole-shaped transitions (every byte nonzero-ish)."""
    k = jax.random.split(key, 4)
    return Transition(
        obs=jax.random.normal(k[0], (STEPS, NUM_ENVS, 4)),
        action=jax.random.randint(k[1], (STEPS, NUM_ENVS), 0, 2),
        reward=jnp.ones((STEPS, NUM_ENVS)),
        terminated=jax.random.bernoulli(k[2], 0.05, (STEPS, NUM_ENVS)),
        truncated=jax.random.bernoulli(k[3], 0.01, (STEPS, NUM_ENVS)),
        next_obs=jax.random.normal(k[0], (STEPS, NUM_ENVS, 4)) + 1.0,
        extras={},
    )


def memory(transitions: int) -> float:
    rows = transitions // NUM_ENVS
    init = jax.jit(lambda: replay.init(item(), rows))
    add = jax.jit(replay.add, donate_argnums=0)
    make = jax.jit(chunk)
    shapes = jax.eval_shape(init)
    add_c = add.lower(shapes, jax.eval_shape(make, jax.random.key(0))).compile()
    init_c = init.lower().compile()
    data = make(jax.random.key(1))
    mem = add_c.memory_analysis()
    raw = sum(
        transitions * np.dtype(x.dtype).itemsize * int(np.prod(x.shape[2:]))
        for x in jax.tree.leaves(shapes.data)
    )
    before_live = sum(x.nbytes for x in jax.live_arrays())
    before = rss_bytes()
    buf = init_c()
    for _ in range(-(-rows // STEPS)):
        buf = add_c(buf, data)
    jax.block_until_ready(buf)
    grown = rss_bytes() - before
    live = sum(x.nbytes for x in jax.live_arrays()) - before_live
    assert int(buf.size()) == transitions
    print(f"1. {transitions:,}-transition CartPole buffer ({rows:,} rows x {NUM_ENVS} envs)")
    print(f"   raw bytes of the fields           {raw:>14,}")
    print(f"   JAX arrays held (live_arrays)     {live:>14,}  ({live / raw:.4f}x raw)")
    print(f"   resident memory growth (RSS)      {grown:>14,}  ({grown / raw:.4f}x raw)")
    if mem is not None:
        print(
            f"   compiled add: alias {mem.alias_size_in_bytes:,} B (in place), "
            f"temp {mem.temp_size_in_bytes:,} B"
        )
    del buf
    return max(live, grown) / raw


def add_time(capacities: list[int], repeats: int) -> None:
    print(f"2. add time, {STEPS} steps x {NUM_ENVS} envs per add (median of {repeats})")
    print(f"   {'capacity':>12} {'donated (us)':>14} {'not donated (us)':>18}")
    data = jax.jit(chunk)(jax.random.key(0))
    for capacity in capacities:
        rows = capacity // NUM_ENVS
        buf = replay.init(item(), rows)
        times = {}
        for name, donate in (("donated", (0,)), ("copy", ())):
            add = jax.jit(replay.add, donate_argnums=donate)
            buf = jax.block_until_ready(add(buf, data))  # compile
            samples = []
            for _ in range(repeats):
                start = time.perf_counter()
                buf = jax.block_until_ready(add(buf, data))
                samples.append(time.perf_counter() - start)
            times[name] = 1e6 * statistics.median(samples)
        print(f"   {capacity:>12,} {times['donated']:>14.1f} {times['copy']:>18.1f}")
        del buf


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, {len(jax.devices())} device(s)")
    ratio = memory(1_000_000)
    add_time([10_000, 100_000, 1_000_000, 4_000_000], args.repeats)
    ok = ratio <= LIMIT
    print(f"memory: {ratio:.4f}x raw bytes (limit {LIMIT}x): {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
