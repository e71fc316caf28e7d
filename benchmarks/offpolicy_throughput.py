"""Off-policy throughput (issue 4): DQN and SAC env steps/s and gradient steps/s, in one run.

For each of configs/dqn_cartpole_zoo.yaml and configs/sac_pendulum.yaml, after a warm-up that fills
the buffer past `learning_starts` (so every gradient step is real):

  rollout       `engine.rollout` alone (jitted): env steps/s of acting + env + buffer add;
  train fused   the algorithm's `train`: G gradient steps as one `lax.scan` in one jitted
                call (G = the config's gradient steps per epoch), train state donated;
  train loop    the same G gradient steps as a Python loop over a jitted one-step `train`
                (the same algorithm built with one gradient step per epoch), state donated;
  epoch         `engine.epoch` (rollout -> sample -> train -> sync, one jitted call, state
                donated): env steps/s and gradient steps/s at the config's train_ratio.
  GFLOP/s       the epoch's gradient steps/s times one gradient step's flops, as XLA's cost
                analysis of the compiled one-step `train` counts them (matmuls dominate).
  % matmul      that rate against one jitted [n, n] @ [n, n] matmul at its best size here
                (`--matmul-n`, timed in the same process): how far the epoch is from the
                machine's arithmetic limit, the ceiling no schedule change can pass.

Every timing is the median of `--repeats` calls, each blocked on its result; compilation is
excluded (each function runs once before timing). Fused and loop calls alternate, so that the
load of a shared machine weighs on both alike.

    .venv/bin/python benchmarks/offpolicy_throughput.py [--repeats 20]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import jax

import jaxrl_engine as jre

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"dqn": "configs/dqn_cartpole_zoo.yaml", "sac": "configs/sac_pendulum.yaml"}


def median_seconds(fn: Any, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def bench(name: str, repeats: int) -> dict[str, float]:
    cfg = jre.load_config(
        ROOT / CONFIGS[name], ["progress=false", "nan_guard=false", "compile_cache_dir=null"]
    )
    engine = jre.build(cfg)
    algo = engine.algo
    G = algo.grad_steps_per_epoch
    state = engine.init(jax.random.key(0))
    warm_epochs = -(-cfg.algo.learning_starts // engine.steps_per_epoch) + 1
    for _ in range(warm_epochs):
        state, _ = engine.epoch(state)
    jax.block_until_ready(state)
    out: dict[str, float] = {"G": G, "env_steps_per_epoch": engine.steps_per_epoch}

    # rollout alone (not donated: the engine's separate phases are not; the epoch below is)
    rollout = engine.rollout
    jax.block_until_ready(rollout(state))
    t = median_seconds(lambda: jax.block_until_ready(rollout(state)), repeats)
    out["rollout_env_steps_per_s"] = engine.steps_per_epoch / t

    state, _ = engine.update_dataset(state)
    train_state, buffer, batch = state.train, state.buffer, state.batch

    hp = state.hparams
    fused = jax.jit(algo.train, donate_argnums=0)
    one_cfg = cfg.algo.model_copy(
        update={"train_ratio": 1.0 / (cfg.algo.num_steps * engine.num_envs)}
    )
    one = one_cfg.build(engine.spec, engine.num_envs, engine.num_epochs)
    assert one.grad_steps_per_epoch == 1
    step = jax.jit(one.train, donate_argnums=0)
    slices = [jax.tree.map(lambda x, i=i: x[i : i + 1], batch) for i in range(G)]
    compiled = step.lower(train_state, buffer, slices[0], jax.random.key(0), hp).compile()
    out["flops_per_grad_step"] = float(compiled.cost_analysis()["flops"])
    keys = list(jax.random.split(jax.random.key(2), G))
    holder = {name: jax.tree.map(lambda x: x.copy(), train_state) for name in ("fused", "loop")}

    def run_fused():
        holder["fused"], _ = fused(holder["fused"], buffer, batch, jax.random.key(1), hp)
        jax.block_until_ready(holder["fused"])

    def run_loop():
        ts = holder["loop"]
        for i in range(G):
            ts, _ = step(ts, buffer, slices[i], keys[i], hp)
        holder["loop"] = jax.block_until_ready(ts)

    run_fused()
    run_loop()
    # Interleaved, so that a change in the machine's load hits both alike.
    fused_s, loop_s = [], []
    for _ in range(repeats):
        fused_s.append(median_seconds(run_fused, 1))
        loop_s.append(median_seconds(run_loop, 1))
    out["fused_grad_steps_per_s"] = G / statistics.median(fused_s)
    out["loop_grad_steps_per_s"] = G / statistics.median(loop_s)

    epoch_holder = {"s": state}

    def run_epoch():
        epoch_holder["s"], _ = engine.epoch(epoch_holder["s"])
        jax.block_until_ready(epoch_holder["s"])

    run_epoch()
    t = median_seconds(run_epoch, repeats)
    out["epoch_env_steps_per_s"] = engine.steps_per_epoch / t
    out["epoch_grad_steps_per_s"] = G / t
    out["gflops"] = out["flops_per_grad_step"] * out["epoch_grad_steps_per_s"] / 1e9
    return out


def matmul_gflops(n: int, repeats: int) -> float:
    """GFLOP/s of one jitted f32 [n, n] @ [n, n] (median of `repeats` calls)."""
    a = jax.numpy.ones((n, n), jax.numpy.float32)
    matmul = jax.jit(lambda x: x @ x)
    jax.block_until_ready(matmul(a))
    return 2 * n**3 / median_seconds(lambda: jax.block_until_ready(matmul(a)), repeats) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument(
        "--matmul-n",
        type=int,
        nargs="+",
        default=[256, 512, 1024, 2048],
        help="matmul sizes to time; the best rate is the %% matmul reference",
    )
    args = parser.parse_args()
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, {len(jax.devices())} device(s)")
    rates = {n: matmul_gflops(n, args.repeats) for n in args.matmul_n}
    print("matmul GFLOP/s: " + ", ".join(f"[{n}]^2 {r:,.1f}" for n, r in rates.items()))
    header = (
        f"{'algo':<5}{'G':>5}{'rollout env/s':>15}{'fused grad/s':>14}{'loop grad/s':>13}"
        f"{'fused/loop':>11}{'epoch env/s':>13}{'epoch grad/s':>14}{'MFLOP/step':>12}"
        f"{'GFLOP/s':>9}{'% matmul':>10}"
    )
    print(header)
    for name in CONFIGS:
        r = bench(name, args.repeats)
        print(
            f"{name:<5}{int(r['G']):>5}{r['rollout_env_steps_per_s']:>15,.0f}"
            f"{r['fused_grad_steps_per_s']:>14,.0f}{r['loop_grad_steps_per_s']:>13,.0f}"
            f"{r['fused_grad_steps_per_s'] / r['loop_grad_steps_per_s']:>10.2f}x"
            f"{r['epoch_env_steps_per_s']:>13,.0f}{r['epoch_grad_steps_per_s']:>14,.0f}"
            f"{r['flops_per_grad_step'] / 1e6:>12.1f}{r['gflops']:>9.1f}"
            f"{100 * r['gflops'] / max(rates.values()):>9.0f}%",
            flush=True,
        )


if __name__ == "__main__":
    main()
