"""The CNN torso's conv layers on CPU: `algo.cnn.impl=matmul` against `xla` (issues 14 and 16).

One PPO epoch of configs/ppo_minatar_breakout.yaml (Breakout-MinAtar, 64 envs x 128 steps,
4 update epochs x 8 minibatches of 1024) with its MLP replaced by the MinAtar paper's CNN torso
(`algo.torso=cnn`: a 16-filter 3x3 conv then 128 units, actor and critic), the conv computed
both ways: `matmul` (the 9 shifted slices concatenated, times the kernel:
one dot) and `xla` (`lax.conv_general_dilated`). The two have the same parameters and math
(equal to float rounding; `tests/algos/test_cnn_torso.py`). Both engines are compiled first
(compile seconds reported), then their epochs alternate `--repeats` times in this process and
the median seconds per epoch are compared. Exits 1 when matmul is not at least 2x faster.

    .venv/bin/python benchmarks/cnn_epoch.py [--repeats 5] [--config configs/...yaml]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import jax

import jaxrl_engine as jre

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "ppo_minatar_breakout.yaml"
IMPLS = ("matmul", "xla")
THRESHOLD = 2.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--config", type=Path, default=CONFIG)
    args = parser.parse_args()

    engines, states, compile_s = {}, {}, {}
    for impl in IMPLS:
        cfg = jre.load_config(
            args.config,
            overrides=[
                "algo.torso=cnn",
                "algo.hidden_sizes=[128]",
                f"algo.cnn.impl={impl}",
                "total_env_steps=1000000",
                "progress=false",
                "compile_cache_dir=null",  # compiles measured cold
            ],
        )
        engine = jre.build(cfg)
        state = engine.init(jax.random.key(0))
        engine.warm_up(state, phases=["epoch"])  # (the epochs program, which `epoch` runs)
        engines[impl], states[impl] = engine, state
        compile_s[impl] = engine.compile_report["epochs"]["compile_s"]
    steps = engines["matmul"].steps_per_epoch

    seconds: dict[str, list[float]] = {impl: [] for impl in IMPLS}
    for _ in range(args.repeats):
        for impl in IMPLS:
            start = time.perf_counter()
            states[impl], metrics = engines[impl].call("epoch", states[impl])
            jax.block_until_ready((states[impl], metrics))
            seconds[impl].append(time.perf_counter() - start)

    print(f"{args.config.name}: one epoch = {steps} env steps; {args.repeats} alternating repeats")
    print("| algo.cnn.impl | compile s | epoch s (median) | env steps/s | all epochs s |")
    print("|---|---|---|---|---|")
    median = {impl: statistics.median(seconds[impl]) for impl in IMPLS}
    for impl in IMPLS:
        runs = ", ".join(f"{s:.2f}" for s in seconds[impl])
        print(
            f"| {impl} | {compile_s[impl]:.1f} | {median[impl]:.2f} | "
            f"{steps / median[impl]:,.0f} | {runs} |"
        )
    ratio = median["xla"] / median["matmul"]
    print(f"matmul is {ratio:.2f}x faster per epoch than xla (target >= {THRESHOLD}x)")
    return 0 if ratio >= THRESHOLD else 1


if __name__ == "__main__":
    raise SystemExit(main())
