"""Torch bridge benchmark (issue 3): rollout speed of the policy paths, and weight-sync cost.

Rollout steps/s, CartPole-v1, `--num-envs` envs (16, the configs' own, and 256) x 128 steps per
call (configs/ppo_torch_policy.yaml: 64x64 tanh MLP actor, flax MLP critic):

  (a) native   the engine's jitted `rollout` phase with PPO's flax policy (configs/ppo_cartpole.yaml)
  (b) fast     the same phase acting with a torch nn.Sequential on the fast path
  (c) universal  the same phase calling the torch module through pure_callback each step
  (d) torch    a plain torch loop: the torch MLP (no_grad, Categorical sampling) over TorchCartPole
  (e) host     the engine's PPO policy (fast path, jitted step) over TorchCartPole through the
               host adapter (DLPack both ways); informational

Each row runs `--repeats` timed blocks (after two warm-up calls) alternately; medians are shown.
Targets, at every env count: fast >= 0.9x native; universal within 20x native. The universal
path pays JAX's host-callback machinery once per step (a fixed cost, amortised by more envs).

Weight sync for a ~10M-parameter torch MLP (float32): time (median of `--repeats`) and bytes
copied, per direction: torch -> JAX zero-copy (from_torch of the state dict), torch -> JAX as a
bf16 acting copy, JAX -> torch zero-copy (to_torch), JAX -> torch into the module's own storage
(export_to_torch), and JAX -> torch -> JAX through an io_callback (what the torch learner's
sync costs inside jit). Target: torch -> JAX copies 0 bytes.

    .venv/bin/python benchmarks/torch_bridge.py [--blocks 20] [--repeats 5]
"""

from __future__ import annotations

import argparse
import itertools
import platform
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import torch

import jaxrl_engine as jre
from jaxrl_engine.interop import BridgeReport, from_torch, to_torch
from jaxrl_engine.interop.torch_env import TorchCartPole, TorchSimRollout
from jaxrl_engine.interop.torch_nets import mlp
from jaxrl_engine.interop.torch_policy import export_to_torch

ROOT = Path(__file__).resolve().parents[1]


def engine_rollout(config: str, *overrides: str):
    cfg = jre.load_config(ROOT / config, ["progress=false", *overrides])
    engine = jre.build(cfg)
    state = engine.init(jax.random.key(0))
    steps = cfg.algo.num_steps * cfg.env.num_envs
    rollout = engine.rollout

    def run(blocks: int) -> float:
        nonlocal state
        start = time.perf_counter()
        for _ in range(blocks):
            state, _ = rollout(state)
        jax.block_until_ready(state)
        return blocks * steps / (time.perf_counter() - start)

    run(2)  # the second call may recompile (the state now carries committed shardings)
    return run, cfg


def torch_loop(num_envs: int, num_steps: int):
    torch.manual_seed(0)
    actor = mlp((4,), 2, 0.01)
    sim = TorchCartPole(num_envs, seed=0)
    obs = sim.reset()
    generator = torch.Generator().manual_seed(0)

    def run(blocks: int) -> float:
        nonlocal obs
        start = time.perf_counter()
        with torch.no_grad():
            for _ in range(blocks * num_steps):
                probs = torch.softmax(actor(obs), -1)
                action = torch.multinomial(probs, 1, generator=generator)[:, 0]
                obs, *_ = sim.step(action)
        return blocks * num_steps * num_envs / (time.perf_counter() - start)

    run(2)  # the second call may recompile (the state now carries committed shardings)
    return run


def host_loop(cfg_overrides: list[str]):
    cfg = jre.load_config(
        ROOT / "configs/ppo_torch_policy.yaml", ["progress=false", *cfg_overrides]
    )
    engine = jre.build(cfg)
    state = engine.init(jax.random.key(0))
    host = TorchSimRollout(engine, TorchCartPole(cfg.env.num_envs, seed=0))
    steps = cfg.algo.num_steps * cfg.env.num_envs

    def run(blocks: int) -> float:
        nonlocal state
        start = time.perf_counter()
        for _ in range(blocks):
            state, _ = host.rollout(state)
        jax.block_until_ready(state)
        return blocks * steps / (time.perf_counter() - start)

    run(2)  # the second call may recompile (the state now carries committed shardings)
    return run


def rollout_rows(num_envs: int, blocks: int, repeats: int) -> dict[str, float]:
    envs = [f"env.num_envs={num_envs}", f"eval.num_envs={num_envs}"]
    native, cfg = engine_rollout("configs/ppo_cartpole.yaml", *envs)
    fast, _ = engine_rollout("configs/ppo_torch_policy.yaml", *envs)
    universal, _ = engine_rollout(
        "configs/ppo_torch_policy.yaml", "algo.torch_policy.path=universal", *envs
    )
    slow_blocks = max(1, blocks // 10)
    runners = {
        "(a) native JAX policy": (native, blocks),
        "(b) fast path": (fast, blocks),
        "(c) universal path": (universal, slow_blocks),
        "(d) plain torch loop, TorchCartPole": (
            torch_loop(num_envs, cfg.algo.num_steps),
            slow_blocks,
        ),
        "(e) host adapter, TorchCartPole": (host_loop(envs), slow_blocks),
    }
    results: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(repeats):
        for name, (run, n) in runners.items():
            results[name].append(run(n))
    return {name: statistics.median(v) for name, v in results.items()}


def ten_million_mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    widths = [1024, 2048, 2048, 1280, 1024, 256]
    layers: list[torch.nn.Module] = []
    for a, b in itertools.pairwise(widths):
        layers += [torch.nn.Linear(a, b), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers)


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        jax.block_until_ready(jax.tree.leaves(out, is_leaf=lambda x: isinstance(x, torch.Tensor)))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def sync_rows(repeats: int) -> tuple[int, list[tuple[str, float, int]]]:
    module = ten_million_mlp()
    n_params = sum(p.numel() for p in module.parameters())
    state = dict(module.state_dict())
    rows = []

    report = BridgeReport()
    params = from_torch(state, report=report)
    assert all(params[k].unsafe_buffer_pointer() == v.data_ptr() for k, v in state.items())
    rows.append(
        (
            "torch -> JAX, zero-copy (from_torch)",
            timed(lambda: from_torch(state), repeats),
            report.copied_bytes,
        )
    )

    def bf16() -> dict:
        return jax.tree.map(lambda p: p.astype(jnp.bfloat16), from_torch(state))

    cast = bf16()
    rows.append(
        (
            "torch -> JAX, bf16 acting copy",
            timed(bf16, repeats),
            sum(p.nbytes for p in cast.values()),
        )
    )

    jax_params = jax.tree.map(jnp.array, params)  # JAX-owned weights (a JAX learner's)
    report = BridgeReport()
    tensors = to_torch(jax_params, report=report)
    assert all(tensors[k].data_ptr() == jax_params[k].unsafe_buffer_pointer() for k in state)
    rows.append(
        (
            "JAX -> torch, zero-copy (to_torch)",
            timed(lambda: to_torch(jax_params), repeats),
            report.copied_bytes,
        )
    )
    written = export_to_torch(jax_params, module)
    rows.append(
        (
            "JAX -> torch module storage (export_to_torch)",
            timed(lambda: export_to_torch(jax_params, module), repeats),
            written,
        )
    )

    shapes = jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype), jax_params)
    host_weights = {k: v.detach().numpy() for k, v in module.state_dict().items()}
    via_callback = jax.jit(
        lambda: jax.experimental.io_callback(lambda: host_weights, shapes, ordered=False)
    )
    via_callback()
    rows.append(
        (
            "torch -> JAX inside jit (io_callback, torch learner sync)",
            timed(via_callback, repeats),
            sum(v.nbytes for v in host_weights.values()),
        )
    )
    return n_params, rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=20, help="rollout calls per timed block")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--num-envs",
        type=lambda v: [int(n) for n in v.split(",")],
        default=[16, 256],
        help="comma-separated env counts for the rollout rows (16: the configs' own)",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)

    print(
        f"jax {jax.__version__} ({jax.devices()[0].platform}), torch {torch.__version__}, "
        f"{platform.processor() or platform.machine()}, python {platform.python_version()}"
    )
    ok = True
    for num_envs in args.num_envs:
        rows = rollout_rows(num_envs, args.blocks, args.repeats)
        native = rows["(a) native JAX policy"]
        print(f"\nrollout, {num_envs} envs x 128 steps per call, median env steps/s:")
        print("| path | steps/s | vs native |\n| --- | ---: | ---: |")
        for name, rate in rows.items():
            print(f"| {name} | {rate:,.0f} | {rate / native:.3f}x |")
        fast_ratio = rows["(b) fast path"] / native
        universal_slowdown = native / rows["(c) universal path"]
        print(f"{num_envs} envs: fast path / native = {fast_ratio:.3f} (target >= 0.9)")
        print(f"{num_envs} envs: native / universal = {universal_slowdown:.1f}x (target <= 20)")
        ok = ok and fast_ratio >= 0.9 and universal_slowdown <= 20

    n_params, sync = sync_rows(args.repeats)
    print(f"\nweight sync, {n_params:,} float32 parameters ({n_params * 4 / 2**20:.1f} MiB):")
    print("| direction | median ms | bytes copied |\n| --- | ---: | ---: |")
    for name, seconds, copied in sync:
        print(f"| {name} | {seconds * 1e3:.3f} | {copied:,} |")
    ok = ok and sync[0][2] == 0
    print("targets met" if ok else "TARGETS MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
