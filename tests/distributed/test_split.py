"""The actor-learner split (`run_split`): same results on one device or two, a real schedule
(counters, learning), and clear refusals."""

from __future__ import annotations

import math
from pathlib import Path

import jax
import pytest

import jaxrl_engine as jre
from jaxrl_engine.distributed.split import run_split
from tests.conftest import NaNRewardsFrom, run_on_four_devices, small_config

ROOT = Path(__file__).resolve().parents[2]

SPLIT = """
import json, jax, numpy as np
import jaxrl_engine as jre
from jaxrl_engine.core.sharding import data_mesh
from jaxrl_engine.distributed.split import run_split
cfg = jre.load_config("configs/dqn_cartpole_zoo.yaml", ["progress=false", "algo.learning_starts=512",
                                                    "algo.buffer_size=4096"])
d = jax.devices()
engine = jre.build(cfg, mesh=data_mesh([d[0]]))
one, rec_one = run_split(engine, engine.init(jax.random.key(3)), 6, d[0], d[0])
two, rec_two = run_split(engine, engine.init(jax.random.key(3)), 6, d[0], d[1])
leaves = lambda s: jax.tree.leaves(s.replace(rng=jax.random.key_data(s.rng)))
print(json.dumps({
    "equal": all(np.array_equal(np.asarray(a), np.asarray(b))
                 for a, b in zip(leaves(one), leaves(two), strict=True)),
    "devices": sorted({str(x.device) for x in jax.tree.leaves(two.train)}),
    "epoch": int(two.counters.epoch), "env_steps": int(two.counters.env_steps),
    "grad_steps": int(two.train.schedule.grad_steps),
    "losses": [r["train/loss"] for r in rec_two],
    "records_equal": json.dumps(rec_one) == json.dumps(rec_two),  # (NaN losses: no == )
}))
"""


def test_split_on_two_devices_equals_the_same_schedule_on_one():
    out = run_on_four_devices(SPLIT)
    assert out["equal"] and out["records_equal"]
    assert out["devices"] == ["cpu:1"]  # the learner's device holds the final state
    assert out["epoch"] == 6 and out["env_steps"] == 6 * 256
    # learning_starts=512: the learner's first call (the first 256 transitions) only fills
    # the buffer (no loss: NaN); the other five each take 128 gradient steps.
    assert out["grad_steps"] == 5 * 128
    assert math.isnan(out["losses"][0]) and all(loss > 0 for loss in out["losses"][1:])


def test_split_refuses_on_policy_algorithms_and_offload():
    cpu = jax.devices()[0]
    engine = jre.build(small_config())
    with pytest.raises(ValueError, match=r"algo.name='ppo' is on-policy"):
        run_split(engine, engine.init(jax.random.key(0)), 2, cpu, cpu)
    cfg = jre.load_config(ROOT / "configs" / "dqn_cartpole.yaml", ["offload=true"])
    engine = jre.build(cfg)
    with pytest.raises(ValueError, match=r"host memory between epochs \(offload=true, or hooks"):
        run_split(engine, engine.init(jax.random.key(0)), 2, cpu, cpu)


def test_a_non_finite_reward_on_the_actor_stops_the_split_run_naming_its_epoch():
    """The actor's rollout has its own nan_guard: NaN rewards from env step 48 (epoch 4 of 16
    env steps, before any learning) are reported as the rollout's, at that epoch."""

    cpu = jax.devices()[0]
    overrides = ["env.num_envs=4", "algo.num_steps=16", "algo.train_ratio=0.125"]
    cfg = jre.load_config(
        ROOT / "configs" / "dqn_cartpole.yaml",
        [*overrides, "algo.learning_starts=100000", "algo.buffer_size=4096", "progress=false"],
    )
    engine = jre.build(cfg, env=NaNRewardsFrom(start=3 * 16))
    assert engine.steps_per_epoch == 4 * 16
    with pytest.raises(jre.NonFiniteError) as info:
        run_split(engine, engine.init(jax.random.key(0)), 6, cpu, cpu)
    assert (info.value.phase, info.value.quantity, info.value.epoch) == (
        "rollout",
        "rollout/reward_mean",
        4,
    )
