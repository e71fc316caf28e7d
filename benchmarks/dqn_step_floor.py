"""How fast can a DQN gradient step be here, whatever the engine does around it? (issue 16)

Builds the Q-network of configs/dqn_cartpole_zoo.yaml (256x256, batch 64; the config
`offpolicy_throughput.py` measures) and times 128 double-DQN gradient steps in one jitted
`lax.scan` on fixed data, for a ladder of loops with less and less besides the network:

  sgd            the loss's three forward passes (Q(s), Q_target(s'), Q(s') for the argmax),
                 its backward pass and a plain SGD update: the floor
  adam           the same with optax's Adam
  engine adam    the same with the engine's optimizer (global-norm clipping, then Adam)
  concat         sgd, with Q(s) and Q(s') as one forward pass over [s; s'] (a candidate lever)

Compare with `offpolicy_throughput.py`'s epoch grad/s, which adds replay sampling, the target
update, metrics and the epoch's rollout. Median of `--repeats` interleaved calls.

    .venv/bin/python benchmarks/dqn_step_floor.py [--repeats 15]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import optax

import jaxrl_engine as jre
from jaxrl_engine.algos.base import adam

ROOT = Path(__file__).resolve().parents[1]
STEPS = 128


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    cfg = jre.load_config(ROOT / "configs/dqn_cartpole_zoo.yaml", ["progress=false"])
    engine = jre.build(cfg)
    q_values, network = engine.algo.static["q_values"], engine.algo.static["network"]
    batch, obs_dim = cfg.algo.batch_size, engine.spec.obs_shape[0]
    params = network.init(jax.random.key(0), jnp.zeros((1, obs_dim)))
    target = jax.tree.map(lambda x: 0.9 * x, params)
    k = jax.random.split(jax.random.key(1), 3)
    obs = jax.random.normal(k[0], (batch, obs_dim))
    next_obs = jax.random.normal(k[1], (batch, obs_dim))
    action = jax.random.randint(k[2], (batch,), 0, engine.spec.action.num_actions)
    reward = jnp.ones(batch)

    def td_loss(q, chooser):
        q_taken = jnp.take_along_axis(q, action[:, None], -1)[:, 0]
        next_target = q_values(target, next_obs)
        next_q = jnp.take_along_axis(next_target, jnp.argmax(chooser, -1)[:, None], -1)[:, 0]
        return ((q_taken - jax.lax.stop_gradient(reward + 0.99 * next_q)) ** 2).mean()

    def separate(p):
        return td_loss(q_values(p, obs), q_values(p, next_obs))

    def concat(p):
        both = q_values(p, jnp.concatenate([obs, next_obs]))
        return td_loss(both[:batch], both[batch:])

    def loop(loss, tx):
        def body(carry, _):
            p, s = carry
            updates, s = tx.update(jax.grad(loss)(p), s, p)
            return (optax.apply_updates(p, updates), s), None

        run = jax.jit(lambda p, s: jax.lax.scan(body, (p, s), None, length=STEPS)[0])
        state = tx.init(params)
        return lambda: jax.block_until_ready(run(params, state))

    rows = {
        "sgd": loop(separate, optax.sgd(1e-4)),
        "adam": loop(separate, optax.adam(1e-4)),
        "engine adam": loop(separate, adam(1e-4, max_grad_norm=cfg.algo.max_grad_norm)),
        "concat": loop(concat, optax.sgd(1e-4)),
    }
    for fn in rows.values():
        fn()
    seconds: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(args.repeats):
        for name, fn in rows.items():
            start = time.perf_counter()
            fn()
            seconds[name].append(time.perf_counter() - start)
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}; batch {batch}")
    for name, s in seconds.items():
        print(f"{name:<12} {STEPS / statistics.median(s):>8,.0f} grad steps/s")


if __name__ == "__main__":
    main()
