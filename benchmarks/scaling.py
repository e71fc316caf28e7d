"""Scaling (issue 13): aggregate env steps/s over devices and over vmapped members.

Two tables, PPO on CartPole-v1 with configs/ppo_cartpole.yaml's sizes (16 envs x 128 steps per
member and epoch, 4 x 4 minibatches, 64x64 tanh):

devices   1, 2, 4 devices of a `data` mesh (forced CPU devices, each count in a fresh process:
          XLA_FLAGS must be set before JAX starts), 16 envs per device (weak scaling: the env
          batch grows with the mesh), `engine.epochs` as the driver calls it.
members   M = 1, 8, 32, 128 members vmapped in one program, `jax.jit(jax.vmap(train))` over
          `make_train(cfg)` (what `jre.sweep` compiles): seeds only, and seeds x 2 learning
          rates (M/2 seeds each); one device.

Each row: compile first (reported apart), then `--repeats` timed runs, median; rows of a table
alternate between repeats. Efficiency = aggregate steps/s / (units x the 1-unit row's steps/s).
For the members table it also reports the GFLOP/s achieved (matmul arithmetic estimated from the
network sizes: `flops_per_env_step`), the same members sharded over `--shard` forced CPU devices
on a `sweep` mesh axis (a fresh process; `jre.sweep`'s placement), and a fit
time(M) = fixed + M x per_member of the 1-device epoch time: the fixed part is what does not grow
with members (per-op dispatch, loop control), the per-member part the work that does.

    .venv/bin/python benchmarks/scaling.py [--epochs 10] [--repeats 3] [--members 1 8 32 128]
        [--devices 1 2 4] [--out results.json]

On an accelerator (`benchmarks/gpu_check.sh`): `--devices` with nothing after it skips the
device table; `--members 1 256`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "ppo_cartpole.yaml"
ENVS_PER_DEVICE = 16


def _config(epochs: int, extra: list[str]) -> Any:
    import jaxrl_engine as jre

    steps = epochs * 16 * 128
    return jre.load_config(
        CONFIG,
        [
            f"total_env_steps={steps}",
            f"eval.interval={epochs}",  # one evaluation, at the end
            "progress=false",
            "run_dir=/tmp/jaxrl_scaling",
            "compile_cache_dir=null",  # compiles measured cold
            *extra,
        ],
    )


def device_row(n: int, epochs: int, repeats: int) -> dict[str, Any]:
    """In this process (started with n forced devices): steps/s of `engine.epochs` on an
    n-device data mesh, 16 envs per device."""
    import jax

    import jaxrl_engine as jre

    assert len(jax.devices()) == n, jax.devices()
    cfg = _config(epochs, [f"env.num_envs={ENVS_PER_DEVICE * n}", f"eval.num_envs={16 * n}"])
    engine = jre.build(cfg)
    begin = time.perf_counter()
    state = engine.warm_up(engine.init(jax.random.key(0)), phases=["epochs"])
    compile_s = time.perf_counter() - begin
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        state, _, _ = jax.block_until_ready(engine.call("epochs", state, epochs))
        times.append(time.perf_counter() - start)
    steps = epochs * engine.steps_per_epoch
    return {
        "devices": n,
        "envs": cfg.env.num_envs,
        "compile_s": compile_s,
        "steps_per_s": steps / statistics.median(times),
        "times": times,
    }


def flops_per_env_step(cfg: Any) -> float:
    """PPO's arithmetic per env step (an estimate from the MLP sizes; matmuls only): the acting
    forward pass (actor and critic), the bootstrap value (critic), and per update epoch a
    forward and backward pass (~3 forward passes) of both networks."""
    obs, actions = 4, 2  # CartPole-v1
    widths = list(cfg.algo.hidden_sizes)

    def forward(out: int) -> int:
        sizes = [obs, *widths, out]
        return 2 * sum(a * b for a, b in itertools.pairwise(sizes))

    actor, critic = forward(actions), forward(1)
    return actor + critic + critic + cfg.algo.update_epochs * 3 * (actor + critic)


def member_rows(
    members: list[int], epochs: int, repeats: int, shard: int = 1
) -> list[dict[str, Any]]:
    """Steps/s of M members vmapped in one program (seeds; seeds x 2 lrs), alternated; with
    `shard` > 1 (a process with that many devices), seeds only, the member axis sharded over a
    `sweep` mesh of `shard` devices."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    import jaxrl_engine as jre

    cfg = _config(epochs, [])
    train = jre.make_train(cfg)
    base = jre.hparams(cfg)
    programs = []
    for m in members:
        kinds = ("seeds", "seeds x lrs") if m > 1 and shard == 1 else ("seeds",)
        for kind in kinds:
            lrs = [base.lr] * m if kind == "seeds" else [3e-4, 1e-3] * (m // 2)
            hp = jax.tree.map(lambda x, m=m: jnp.full((m,), x, jnp.float32), base)
            hp = hp.replace(lr=jnp.asarray(lrs, jnp.float32))
            keys = jax.random.split(jax.random.key(0), m)
            swept = jax.jit(jax.vmap(train))
            if shard > 1:
                mesh = Mesh(np.array(jax.devices()[:shard]), ("sweep",))
                along = NamedSharding(mesh, PartitionSpec("sweep"))
                keys, hp = jax.device_put((keys, hp), along)
                swept = jax.jit(jax.vmap(train), in_shardings=(along, along))
                kind = f"seeds, sharded over {shard} devices"
            begin = time.perf_counter()
            compiled = swept.lower(keys, hp).compile()
            programs.append(
                {
                    "members": m,
                    "kind": kind,
                    "compile_s": time.perf_counter() - begin,
                    "run": (compiled, keys, hp),
                    "times": [],
                }
            )
    for _ in range(repeats):
        for row in programs:
            compiled, keys, hp = row["run"]
            start = time.perf_counter()
            jax.block_until_ready(compiled(keys, hp))
            row["times"].append(time.perf_counter() - start)
    steps = epochs * 16 * 128
    for row in programs:
        del row["run"]
        t = statistics.median(row["times"])
        row["steps_per_s"] = row["members"] * steps / t
        row["epoch_ms"] = t / epochs * 1e3
        row["gflop_per_s"] = row["steps_per_s"] * flops_per_env_step(cfg) / 1e9
    return programs


def fit(rows: list[dict[str, Any]]) -> tuple[float, float]:
    """Least squares epoch_ms = fixed + members x per_member over the seeds rows."""
    xs = [r["members"] for r in rows if r["kind"] == "seeds"]
    ys = [r["epoch_ms"] for r in rows if r["kind"] == "seeds"]
    n, mx, my = len(xs), sum(xs) / len(xs), sum(ys) / len(ys)
    if n < 2:
        return float("nan"), float("nan")
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    return my - slope * mx, slope


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--members", type=int, nargs="*", default=[1, 8, 32, 128])
    parser.add_argument("--devices", type=int, nargs="*", default=[1, 2, 4])
    parser.add_argument("--out", help="also write the rows as JSON here")
    parser.add_argument(
        "--shard",
        type=int,
        default=2,
        help="also run the members sharded over this many forced CPU devices (sweep axis; 0: skip)",
    )
    parser.add_argument("--device-row", type=int, help=argparse.SUPPRESS)  # (child process)
    parser.add_argument("--shard-rows", type=int, help=argparse.SUPPRESS)  # (child process)
    args = parser.parse_args()
    if args.device_row is not None:
        print(json.dumps(device_row(args.device_row, args.epochs, args.repeats)))
        return
    if args.shard_rows is not None:
        rows = member_rows(args.members, args.epochs, args.repeats, shard=args.shard_rows)
        print(json.dumps(rows))
        return

    import jax

    print(f"jax {jax.__version__}, backend {jax.default_backend()}, {os.cpu_count()} CPUs")
    devices = []
    for n in args.devices:
        env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={n}"}
        out = subprocess.run(
            [sys.executable, __file__, "--device-row", str(n), "--epochs", str(args.epochs),
             "--repeats", str(args.repeats)],
            env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        devices.append(json.loads(out.stdout.strip().splitlines()[-1]))
    if devices:
        one = devices[0]["steps_per_s"] / devices[0]["devices"]
        print(
            "\n| devices | envs | env steps/s | efficiency | compile s |\n|---:|---:|---:|---:|---:|"
        )
        for r in devices:
            eff = r["steps_per_s"] / (r["devices"] * one)
            print(
                f"| {r['devices']} | {r['envs']} | {r['steps_per_s']:,.0f} | {eff:.2f} | "
                f"{r['compile_s']:.1f} |"
            )
    members = member_rows(args.members, args.epochs, args.repeats) if args.members else []
    if members and args.shard > 1:
        env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={args.shard}"}
        out = subprocess.run(
            [sys.executable, __file__, "--shard-rows", str(args.shard), "--epochs",
             str(args.epochs), "--repeats", str(args.repeats), "--members",
             *[str(m) for m in args.members if m % args.shard == 0]],
            env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        members += json.loads(out.stdout.strip().splitlines()[-1])
    if members:
        one = next(r["steps_per_s"] for r in members if r["members"] == min(args.members))
        print(
            "\n| members | kind | env steps/s (aggregate) | vs 1 member | efficiency | epoch ms "
            "| GFLOP/s (est.) | compile s |\n|---:|---|---:|---:|---:|---:|---:|---:|"
        )
        for r in members:
            ratio = r["steps_per_s"] / one
            print(
                f"| {r['members']} | {r['kind']} | {r['steps_per_s']:,.0f} | {ratio:.2f}x | "
                f"{ratio / r['members'] * min(args.members):.2f} | {r['epoch_ms']:.1f} | "
                f"{r['gflop_per_s']:.1f} | {r['compile_s']:.1f} |"
            )
        fixed, per_member = fit(members)
        print(
            f"\nfit over the seeds rows: epoch time = {fixed:.2f} ms + M x {per_member:.3f} ms "
            f"(the fixed part is {fixed / (fixed + per_member):.0%} of a 1-member epoch)"
        )
    if args.out:
        Path(args.out).write_text(json.dumps({"devices": devices, "members": members}, indent=1))


if __name__ == "__main__":
    main()
