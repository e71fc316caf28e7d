"""How many cores a vmapped-members program keeps busy on one XLA:CPU device (issue 13):
CPU time (`time.process_time`, all threads) over wall time of one call, for 1 and 32 members
of `jax.vmap(make_train(cfg))` with benchmarks/scaling.py's config (10 epochs).

    .venv/bin/python benchmarks/scaling_cpu_share.py
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
from scaling import _config  # (benchmarks/ is the script's directory: on sys.path)

import jaxrl_engine as jre


def main() -> None:
    cfg = _config(10, [])
    train, base = jre.make_train(cfg), jre.hparams(cfg)
    for m in (1, 32):
        hp = jax.tree.map(lambda x, m=m: jnp.full((m,), x, jnp.float32), base)
        keys = jax.random.split(jax.random.key(0), m)
        compiled = jax.jit(jax.vmap(train)).lower(keys, hp).compile()
        jax.block_until_ready(compiled(keys, hp))
        wall, cpu = time.perf_counter(), time.process_time()
        jax.block_until_ready(compiled(keys, hp))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        print(f"members {m}: wall {wall:.2f} s, CPU {cpu:.2f} s, cores busy {cpu / wall:.2f}")


if __name__ == "__main__":
    main()
