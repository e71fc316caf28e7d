"""Where a host env's rollout step goes (issue 12): per 16-env CartPole-v1 step, medians.

vector step      GymnasiumEnv._host_step (gymnasium's SAME_STEP vector env + conversions)
bare step        the gymnasium vector env's own `step`
io_callback      one ordered `io_callback` of a trivial function inside a `lax.scan`
host call        the same with `ordered_host_call` (what the host envs use: envs/host_callback.py)
rollout step     the engine's PPO rollout phase (configs/ppo_gym_cartpole.yaml sizes) / 128
step inside      the vector step timed inside that rollout's callback (slower than alone: the
                 interpreter's caches are shared with XLA's work between the calls)
acting in XLA    rollout step - step inside - host call (the network, sampling, the scan)

  .venv/bin/python benchmarks/host_step_costs.py
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

import jaxrl_engine as jre
from jaxrl_engine.envs.gymnasium_env import GymnasiumEnv
from jaxrl_engine.envs.host_callback import ordered_host_call

STEPS, REPEATS = 2000, 5


def per_call_us(fn, calls: int) -> float:
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def main() -> None:
    env = GymnasiumEnv("CartPole-v1", 16, 16)
    env._host_reset(env.params, np.array([0], np.uint32))
    actions = np.random.default_rng(0).integers(0, 2, (STEPS, 16)).astype(np.int32)
    vector = per_call_us(lambda: [env._host_step(env.params, a) for a in actions], STEPS)
    vec = env.vector_env(env.params)
    bare = per_call_us(lambda: [vec.step(a.astype(np.int64)) for a in actions], STEPS)
    env.close()

    def scan_of(call):
        def scan(x):
            def step(c, _):
                return call(lambda a: a, jax.ShapeDtypeStruct((16, 4), jnp.float32), c) + 1.0, None

            return jax.lax.scan(step, x, None, length=128)[0]

        scanned, x = jax.jit(scan), jnp.zeros((16, 4))
        scanned(x).block_until_ready()
        return per_call_us(lambda: [scanned(x).block_until_ready() for _ in range(20)], 20 * 128)

    callback = scan_of(lambda f, s, x: io_callback(f, s, x, ordered=True))
    host_call = scan_of(ordered_host_call)

    cfg = jre.load_config(
        None,
        ["env.suite=gymnasium", "env.num_envs=16", "algo.num_steps=128", "run_dir=unused"],
    )
    engine = jre.build(cfg)
    inside: list[float] = []  # the vector step's own time, timed inside the rollout's callback
    host_step = engine.env._host_step

    def timed_step(*args):
        start = time.perf_counter()
        out = host_step(*args)
        inside.append(time.perf_counter() - start)
        return out

    engine.env._host_step = timed_step
    state = engine.warm_up(engine.init(jax.random.key(0)), phases=["rollout"])
    holder = [state]

    def rollouts():
        for _ in range(5):
            holder[0], _ = jax.block_until_ready(engine.call("rollout", holder[0]))

    rollout = per_call_us(rollouts, 5 * 128)
    in_rollout = statistics.median(inside[-5 * 128 :]) * 1e6
    engine.env.close()
    acting = rollout - in_rollout - host_call
    rows = {
        "vector step (GymnasiumEnv._host_step)": vector,
        "bare gymnasium vector step": bare,
        "ordered io_callback in a scan": callback,
        "ordered_host_call in a scan": host_call,
        "engine rollout step (PPO, 16 envs)": rollout,
        "vector step inside the rollout (timed in its callback)": in_rollout,
        "acting in XLA (rollout - vector step inside - host call)": acting,
    }
    print("| per 16-env step | us |\n|---|---:|")
    for name, us in rows.items():
        print(f"| {name} | {us:.0f} |")


if __name__ == "__main__":
    main()
