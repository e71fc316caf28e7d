"""Actor-learner split (issue 4): does acting on one device overlap learning on another?

Runs DQN (configs/dqn_cartpole_zoo.yaml, `learning_starts` lowered so every timed epoch trains)
for `--epochs` epochs per run, four ways, alternating, `--repeats` times in one process:

  fused epoch         `engine.epoch` (rollout -> update_dataset -> train -> sync, one call)
  split, 1 device     `run_split(actor=cpu:0, learner=cpu:0)`: the split schedule, one device
  split, 2 devices    `run_split(actor=cpu:0, learner=cpu:1)`: the same, acting and learning
                      on different devices, dispatched to overlap
and, to size what overlap could gain, the actor's and the learner's compiled halves alone
(`act` / `learn`, called `--epochs` times each). Ideal overlapped time = max(act, learn);
no overlap = act + learn.

The devices are XLA's forced host devices (`--xla_force_host_platform_device_count=2`, set
here before JAX starts); on a CPU they share the machine's cores.

    .venv/bin/python benchmarks/offpolicy_split.py [--epochs 20] [--repeats 5]
        [--override algo.train_ratio=0.125 ...]
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
).strip()

import argparse
import statistics
import sys
import time
from pathlib import Path

import jax

import jaxrl_engine as jre
from jaxrl_engine.core.sharding import data_mesh
from jaxrl_engine.distributed.split import run_split, split_functions

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "dqn_cartpole_zoo.yaml"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--override", action="append", default=[], help="extra config override (key=value)"
    )
    args = parser.parse_args(argv)
    cfg = jre.load_config(CONFIG, ["progress=false", "algo.learning_starts=256", *args.override])
    cpu0, cpu1 = jax.devices()[:2]
    engine = jre.build(cfg, mesh=data_mesh([cpu0]))
    n = args.epochs

    def warm(k):  # a state past warm-up, so every timed learner call trains
        state = engine.init(k)
        for _ in range(2):
            state, _ = engine.epoch(state)
        return jax.block_until_ready(state)

    def fused(k):
        state = warm(k)
        start = time.perf_counter()
        for _ in range(n):
            state, metrics = engine.epoch(state)
        jax.block_until_ready((state, metrics))
        return time.perf_counter() - start

    def split(learner):
        def run(k):
            state = warm(k)
            start = time.perf_counter()
            out, _ = run_split(engine, state, n, cpu0, learner)
            jax.block_until_ready(out)
            return time.perf_counter() - start

        return run

    act, learn = split_functions(engine)

    def halves(k):
        """(act seconds, learn seconds) for n calls of each half alone, on cpu:0."""
        state = warm(k)
        learner = jax.device_put(state, cpu0, may_alias=False)  # before act donates env/stats
        env, stats, params = state.env, state.stats, state.eval_params
        rng = jax.random.fold_in(state.rng, 1)
        start = time.perf_counter()
        for _ in range(n):
            env, stats, rng, traj, _ = act(params, env, stats, rng)
        jax.block_until_ready((env, traj))
        t_act = time.perf_counter() - start
        traj = jax.device_put(traj, cpu0, may_alias=False)
        start = time.perf_counter()
        for _ in range(n):
            learner, _ = learn(learner, traj)
        jax.block_until_ready(learner)
        return t_act, time.perf_counter() - start

    runners = {
        "fused epoch": fused,
        "split, 1 device": split(cpu0),
        "split, 2 devices": split(cpu1),
    }
    for fn in runners.values():
        fn(jax.random.key(1000))  # compile and warm up
    halves(jax.random.key(1000))
    seconds: dict[str, list[float]] = {name: [] for name in runners}
    acts, learns = [], []
    for rep in range(args.repeats):
        k = jax.random.key(rep)
        for name, fn in runners.items():
            seconds[name].append(fn(k))
        a, b = halves(k)
        acts.append(a)
        learns.append(b)

    ms = {name: statistics.median(v) / n * 1e3 for name, v in seconds.items()}
    t_act, t_learn = statistics.median(acts) / n * 1e3, statistics.median(learns) / n * 1e3
    print(
        f"DQN CartPole-v1, {cfg.env.num_envs} envs x {cfg.algo.num_steps} steps, "
        f"{engine.algo.grad_steps_per_epoch} gradient steps per epoch; {n} epochs per run, "
        f"{args.repeats} alternating repeats; devices {[str(d) for d in (cpu0, cpu1)]}; "
        f"CPUs {sorted(os.sched_getaffinity(0))}"
    )
    print()
    print("| variant | ms per epoch (median) | x fused epoch |")
    print("| --- | ---: | ---: |")
    for name, value in ms.items():
        print(f"| {name} | {value:.1f} | {ms['fused epoch'] / value:.3f} |")
    print()
    print(
        f"halves alone: act {t_act:.1f} ms, learn {t_learn:.1f} ms per epoch; no overlap "
        f"= {t_act + t_learn:.1f} ms, full overlap = {max(t_act, t_learn):.1f} ms"
    )
    gain = ms["split, 1 device"] / ms["split, 2 devices"]
    print(f"split on 2 devices vs 1: {gain:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
