"""What settings cost: the wall time of one run under a setting against the same run without
it, for the settings that multiply run time when set small or large (README, "What costs
time").

Each variant is a config (the shipped PPO CartPole or DQN CartPole config, shortened, with
overrides) built and run once first (compile excluded from what is timed), then run again
`--repeats` times, the variants taking turns in one process; the figure is the median of
`engine.run`'s wall time (the whole call: epochs, evaluations, checkpoints, logs, export) and
its ratio to the base variant's median. A fresh run directory each time; the persistent
compile cache off.

    .venv/bin/python benchmarks/settings_cost.py [--repeats 3] [--only ppo|dqn]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import jax

import jaxrl_engine as jre

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
COMMON = ["compile_cache_dir=null", "progress=false"]
# (name, config file, overrides): the first of each group is its base.
PPO = [
    ("ppo: base (200k steps, 16 envs x 128)", "ppo_cartpole.yaml", []),
    ("ppo: save_interval=1", "ppo_cartpole.yaml", ["save_interval=1"]),
    ("ppo: eval.interval=1", "ppo_cartpole.yaml", ["eval.interval=1"]),
    ("ppo: eval.episodes=256 (16 rounds of 16 envs)", "ppo_cartpole.yaml", ["eval.episodes=256"]),
    (
        "ppo: eval.episodes=256, eval.num_envs=256 (one round)",
        "ppo_cartpole.yaml",
        ["eval.episodes=256", "eval.num_envs=256"],
    ),
    (
        "ppo: algo.num_steps=8 (16 env steps x 8 an epoch)",
        "ppo_cartpole.yaml",
        ["algo.num_steps=8"],
    ),
]
PPO_STEPS = ["total_env_steps=200000"]
DQN = [
    (
        "dqn: base (30k steps, buffer 1e6, uniform)",
        "dqn_cartpole.yaml",
        ["algo.buffer_size=1000000"],
    ),
    (
        "dqn: algo.prioritized=true, buffer 1e6",
        "dqn_cartpole.yaml",
        ["algo.buffer_size=1000000", "algo.prioritized=true"],
    ),
    (
        "dqn: algo.prioritized=true, buffer 1e4",
        "dqn_cartpole.yaml",
        ["algo.buffer_size=10000", "algo.prioritized=true"],
    ),
    ("dqn: uniform, buffer 1e4", "dqn_cartpole.yaml", ["algo.buffer_size=10000"]),
]
DQN_STEPS = ["total_env_steps=30000"]


def build(config: str, overrides: list[str], steps: list[str], root: Path, i: int):
    cfg = jre.load_config(
        CONFIGS / config, [*COMMON, *steps, *overrides, f"run_dir={root}", f"name={config[:3]}{i}"]
    )
    return jre.build(cfg)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=["ppo", "dqn"])
    args = parser.parse_args()
    groups = [
        g
        for n, g in (("ppo", (PPO, PPO_STEPS)), ("dqn", (DQN, DQN_STEPS)))
        if args.only in (None, n)
    ]
    print(
        f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"jax {jax.__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for variants, steps in groups:
            engines = []
            for i, (_, config, overrides) in enumerate(variants):
                engine = build(config, overrides, steps, root / "warm", i)
                engine.run(engine.init(jax.random.key(0)))  # compiles (not timed)
                engines.append(engine)
            walls: dict[str, list[float]] = {name: [] for name, _, _ in variants}
            for r in range(args.repeats):
                for i, ((name, _, _), engine) in enumerate(zip(variants, engines, strict=True)):
                    state = jax.block_until_ready(engine.init(jax.random.key(r + 1)))
                    began = time.perf_counter()
                    engine.run(state, run_dir=str(root / f"r{r}_{i}"))
                    walls[name].append(time.perf_counter() - began)
            base = statistics.median(walls[variants[0][0]])
            print(f"\nload average {os.getloadavg()[0]:.2f}")
            print("| variant | run wall s (median) | min / max | x base |")
            print("| --- | --- | --- | --- |")
            for name, times in walls.items():
                median = statistics.median(times)
                print(
                    f"| {name} | {median:.2f} | {min(times):.2f} / {max(times):.2f} | "
                    f"{median / base:.2f}x |"
                )


if __name__ == "__main__":
    main()
