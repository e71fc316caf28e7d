"""Compile time of three small engines (PPO, DQN, SAC: the test suite's kind of program) under
the `XLA_FLAGS` this process was started with: which XLA flags make the suite compile faster.

    for f in "" --xla_cpu_use_fusion_emitters=false; do
      XLA_FLAGS="--xla_backend_optimization_level=0 $f" .venv/bin/python benchmarks/suite_flags.py
    done

Prints one JSON line: the summed backend compile (s, JAX's monitoring events), the script's wall
(s) and the SAC epoch's last loss (equal between flags here, to the digits printed). The compile
cache is off (`compile_cache_dir=null`), so every program compiles.
"""

from __future__ import annotations

import collections
import json
import time
from pathlib import Path

import jax
import jax.monitoring

import jaxrl_engine as jre

ROOT = Path(__file__).resolve().parents[1]
SMALL = [
    "algo.num_steps=16",
    "env.num_envs=4",
    "eval.num_envs=4",
    "eval.interval=2",
    "algo.hidden_sizes=[16,16]",
    "total_env_steps=256",
    "progress=false",
    "compile_cache_dir=null",
]
ENGINES = [
    (None, ["algo.num_minibatches=2", "algo.update_epochs=2"]),
    (
        "configs/dqn_cartpole.yaml",
        ["algo.learning_starts=32", "algo.buffer_size=256", "algo.num_steps=40"],
    ),
    ("configs/sac_pendulum.yaml", ["algo.learning_starts=32", "algo.buffer_size=256"]),
]


def main() -> None:
    seconds: collections.Counter = collections.Counter()
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, duration, **_: seconds.update({event: duration})
    )
    start = time.perf_counter()
    for config, extra in ENGINES:
        cfg = jre.load_config(config and str(ROOT / config), [*SMALL, *extra])
        engine = jre.build(cfg)
        state = engine.warm_up(engine.init(jax.random.key(0)))
        state, metrics, _ = engine.epochs(state, 2)
        jax.block_until_ready(state)
    loss = next(k for k in metrics if "loss" in k)
    print(
        json.dumps(
            {
                "compile_s": round(seconds["/jax/core/compile/backend_compile_duration"], 2),
                "wall_s": round(time.perf_counter() - start, 2),
                loss: float(metrics[loss][-1]),
            }
        )
    )


if __name__ == "__main__":
    main()
