"""`EngineState.counters`: what each counter counts, for an off-policy run across its warm-up."""

from __future__ import annotations

from pathlib import Path

import jax
import optax

import jaxrl_engine as jre
from jaxrl_engine.io.checkpoint import Checkpointer

# 4 envs x 8 steps = 32 env steps per epoch; learning_starts=50: epoch 1 only collects (its
# train is idle), epochs 2 and 3 take 0.25 x 32 = 8 gradient steps each.
TINY_DQN = [
    "algo.name=dqn",
    "env.id=CartPole-v1",
    "env.num_envs=4",
    "eval.num_envs=4",
    "algo.num_steps=8",
    "algo.buffer_size=200",
    "algo.batch_size=16",
    "algo.learning_starts=50",
    "algo.train_ratio=0.25",
    "algo.target_update_interval=8",
    "algo.hidden_sizes=[16,16]",
    "total_env_steps=256",
    "progress=false",
]


def optimizer_steps(opt_state) -> int:
    """Adam's step count in an optax state (the updates the optimizer applied)."""
    counts = [
        int(s.count)
        for s in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
        if isinstance(s, optax.ScaleByAdamState)
    ]
    assert len(counts) == 1, counts
    return counts[0]


def test_dqn_grad_steps_count_only_the_steps_taken_after_learning_starts(tmp_path):
    engine = jre.build(jre.load_config(None, [*TINY_DQN, f"run_dir={tmp_path}"]))
    state = engine.init(jax.random.key(0))
    seen = []
    for _ in range(3):
        state, metrics = engine.epoch(state)
        seen.append(
            (
                float(metrics["train/learning"]),
                int(state.counters.grad_steps),
                optimizer_steps(state.train.opt_state),
                int(state.train.schedule.grad_steps),
            )
        )
    # (learning, counters.grad_steps, optimizer steps, schedule.grad_steps) after each epoch
    assert seen == [(0.0, 0, 0, 0), (1.0, 8, 8, 8), (1.0, 16, 16, 16)]
    assert int(state.counters.env_steps) == 3 * 32
    assert int(state.counters.epoch) == 3


def test_a_dqn_run_and_its_checkpoints_count_the_gradient_steps_taken(tmp_path):
    cfg = jre.load_config(
        None, [*TINY_DQN, f"run_dir={tmp_path}", "save_interval=1", "keep_checkpoints=8"]
    )
    engine = jre.build(cfg)
    state, summary = engine.run(engine.init(jax.random.key(0)))
    assert summary["status"] == "completed" and engine.num_epochs == 8
    # 7 learning epochs x 8 (the count the config checks size the run by)
    run_grad_steps = cfg.algo.replay(cfg.env.num_envs, engine.num_epochs).run_grad_steps
    assert run_grad_steps == 56
    assert int(state.counters.grad_steps) == run_grad_steps
    assert optimizer_steps(state.train.opt_state) == run_grad_steps
    assert int(state.train.schedule.grad_steps) == run_grad_steps
    # Each checkpoint holds the count of its epoch (a state leaf: nothing else to restore).
    checkpoints = Checkpointer(Path(summary["run_dir"]) / "checkpoints", read_only=True)
    try:
        assert checkpoints.epochs() == list(range(1, 9))
        for epoch in checkpoints.epochs():
            saved, _ = checkpoints.restore(engine, epoch)
            assert int(saved.counters.grad_steps) == 8 * max(epoch - 1, 0), epoch
            assert int(saved.counters.grad_steps) == int(saved.train.schedule.grad_steps)
    finally:
        checkpoints.close()
