"""Checkpoint cost (issue 5): save and restore time of a 100M-parameter state, and checkpoint
overhead as a fraction of training time at the default `save_interval`.

Part 1, a 100M-parameter state: PPO on CartPole-v1 with 12 hidden layers of 2144 units in both
actor and critic (101M learner params; the whole `EngineState` also holds Adam's two moments and
the acting copy, ~4x that). It times `Checkpointer.save` (orbax write + CRC-32 of every leaf,
synchronous, atomic) and `Checkpointer.restore` (read onto the engine's shardings + CRC check),
`--repeats` times each, and one epoch of that engine with a small rollout (4 envs x 16 steps,
1 update epoch, 1 minibatch), then prints save_s / (save_interval x epoch_s).

Part 2, the default run (configs/ppo_cartpole.yaml): the driver trains `--epochs` epochs with
the default `save_interval` and with `save_interval=0` (no checkpoints), alternating,
`--repeats` times, in one process; overhead = median train_s with checkpoints / without - 1.
It also prints the mean time of one save of that state against one epoch.

    .venv/bin/python benchmarks/checkpoint.py [--repeats 3] [--epochs 50] [--skip-large]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

import jaxrl_engine as jre
from jaxrl_engine.io.checkpoint import Checkpointer

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "ppo_cartpole.yaml"
LARGE = [
    "algo.hidden_sizes=[2144,2144,2144,2144,2144,2144,2144,2144,2144,2144,2144,2144]",
    "env.num_envs=4",
    "eval.num_envs=4",
    "algo.num_steps=16",
    "algo.update_epochs=1",
    "algo.num_minibatches=1",
    "progress=false",
    "loggers=[jsonl]",
]


def count(tree) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))


def nbytes(state) -> int:
    return sum(x.nbytes for x in jax.tree.leaves(state.replace(rng=jax.random.key_data(state.rng))))


def large_state(repeats: int, root: Path) -> None:
    cfg = jre.load_config(CONFIG, LARGE)
    engine = jre.build(cfg)
    state = jax.block_until_ready(engine.init(jax.random.key(0)))
    params = count(state.train.params)
    print(
        f"100M state: {params / 1e6:.1f}M learner params, whole EngineState "
        f"{nbytes(state) / 2**30:.2f} GiB ({len(jax.tree.leaves(state))} leaves)"
    )
    checkpoints = Checkpointer(root / "large", keep=2)
    saves, restores = [], []
    for i in range(repeats):
        state = state.replace(counters=state.counters.replace(epoch=state.counters.epoch + 1))
        start = time.perf_counter()
        checkpoints.save(state, config=cfg.model_dump(mode="json"), num_epochs=1)
        saves.append(time.perf_counter() - start)
        start = time.perf_counter()
        restored, _ = checkpoints.restore(engine)
        jax.block_until_ready(restored)
        restores.append(time.perf_counter() - start)
        del restored
        print(f"  repeat {i + 1}: save {saves[-1]:.2f} s, restore {restores[-1]:.2f} s", flush=True)
    size = sum(p.stat().st_size for p in (root / "large").rglob("*") if p.is_file()) / 2**30
    print(f"  on disk: {size:.2f} GiB for {len(checkpoints.epochs())} checkpoints")
    engine.warm_up(state, phases=["epoch"])
    epochs = []
    for _ in range(2):
        start = time.perf_counter()
        state, _ = jax.block_until_ready(engine.call("epoch", state))
        epochs.append(time.perf_counter() - start)
    save_s, restore_s, epoch_s = (statistics.median(x) for x in (saves, restores, epochs))
    interval = jre.Config().save_interval
    print(
        f"  median save {save_s:.2f} s, median restore {restore_s:.2f} s; one epoch "
        f"(4 envs x 16 steps, 1x1 updates) {epoch_s:.2f} s"
    )
    print(
        f"  overhead at save_interval={interval}: save / ({interval} x epoch) = "
        f"{save_s / (interval * epoch_s):.1%}"
    )


def default_run(repeats: int, epochs: int, root: Path) -> None:
    steps = epochs * 16 * 128
    base = [f"total_env_steps={steps}", "progress=false", f"run_dir={root}", "loggers=[jsonl]"]
    interval = jre.Config().save_interval
    engines = {
        "with": jre.build(jre.load_config(CONFIG, base)),
        "without": jre.build(jre.load_config(CONFIG, [*base, "save_interval=0"])),
    }
    train_s: dict[str, list[float]] = {"with": [], "without": []}
    for i in range(repeats + 1):  # the first round compiles and is not counted
        for name, engine in engines.items():
            _, summary = engine.run(engine.init(jax.random.key(i)), run_dir=root / f"{name}{i}")
            if i:
                train_s[name].append(summary["train_s"])
    with_s, without_s = statistics.median(train_s["with"]), statistics.median(train_s["without"])
    print(
        f"default run (configs/ppo_cartpole.yaml), {epochs} epochs, save_interval={interval} "
        f"(saves after epochs {', '.join(str(e) for e in range(interval, epochs + 1, interval))}"
        f"{'' if epochs % interval == 0 else f', {epochs}'}):"
    )
    print(
        f"  median train_s with checkpoints {with_s:.2f} s, without {without_s:.2f} s "
        f"({repeats} runs each): overhead {with_s / without_s - 1:+.1%}"
    )
    engine = engines["with"]
    state = engine.init(jax.random.key(0))
    for _ in range(3):
        state, _ = jax.block_until_ready(engine.call("epoch", state))
    checkpoints = Checkpointer(root / "direct", keep=2)
    saves, epoch_times = [], []
    for _ in range(10):
        start = time.perf_counter()
        state, _ = jax.block_until_ready(engine.call("epoch", state))
        epoch_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        checkpoints.save(state, config={}, num_epochs=engine.num_epochs)
        saves.append(time.perf_counter() - start)
    save_s, epoch_s = statistics.median(saves), statistics.median(epoch_times)
    print(
        f"  state {nbytes(state) / 2**10:.0f} KiB: median save {1e3 * save_s:.0f} ms, median "
        f"epoch {1e3 * epoch_s:.0f} ms; save / ({interval} x epoch) = "
        f"{save_s / (interval * epoch_s):.1%}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--skip-large", action="store_true", help="only the default-run part")
    args = parser.parse_args()
    print(
        f"jax {jax.__version__} ({jax.default_backend()}), python {platform.python_version()}, "
        f"{platform.machine()}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if not args.skip_large:
            large_state(args.repeats, root)
        default_run(args.repeats, args.epochs, root)


if __name__ == "__main__":
    main()
