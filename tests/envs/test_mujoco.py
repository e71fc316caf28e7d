"""MuJoCo tasks through the host path (`env.suite: gymnasium`, the `mujoco` extra): spaces map
to the engine's spec, and configs/ppo_mujoco_inverted_pendulum.yaml runs end to end (train,
evaluate, export, `jaxrl-engine eval`). Its learning target is a slow row of
tests/test_targets.py."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_engine as jre
from jaxrl_engine import cli
from jaxrl_engine.envs.gymnasium_env import GymnasiumEnv
from tests.conftest import SMALL

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("mujoco", "imageio")),
    reason='mujoco is not installed (pip install -e ".[mujoco]")',
)

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "ppo_mujoco_inverted_pendulum.yaml"
# 4 epochs of 4 envs x 16 steps: the host path end to end, not learning
SHORT = [*SMALL, "eval.num_envs=2", "save_interval=2", "loggers=[jsonl]"]


@pytest.mark.parametrize(
    ("env_id", "obs_dim", "low", "high"),
    [
        ("InvertedPendulum-v5", 4, (-3.0,), (3.0,)),
        ("Hopper-v5", 11, (-1.0,) * 3, (1.0,) * 3),
    ],
)
def test_mujoco_spaces_map_to_the_engine_spec(env_id, obs_dim, low, high):
    spec = GymnasiumEnv(env_id, 2, 2).spec(None)
    assert spec.env_id == env_id and spec.obs_shape == (obs_dim,)
    assert spec.obs_dtype == np.float32  # MuJoCo's float64 observations, as the networks take
    assert not spec.action.discrete and spec.action.shape == (len(low),)
    assert spec.action.low == low and spec.action.high == high
    assert spec.max_episode_steps == 1000


def test_the_untrained_policy_is_far_below_the_target(tmp_path):
    """The margin tests/test_targets.py asserts (>= 900): the config's untrained policy
    balances the pole for about 24 steps (23.7-24.5 for seeds 0-2, 16 episodes each)."""
    cfg = jre.load_config(CONFIG, [f"run_dir={tmp_path}", "progress=false", "loggers=[jsonl]"])
    engine = jre.build(cfg)
    _, metrics = engine.call("evaluate", engine.init(jax.random.key(0)))
    assert 5 <= float(metrics["evaluate/episode_return"]) <= 100, metrics


def test_the_config_runs_on_the_host_path_end_to_end(tmp_path, capsys):
    cfg = jre.load_config(CONFIG, [*SHORT, f"run_dir={tmp_path}", "name=mj"])
    engine = jre.build(cfg)
    state, summary = engine.run(engine.init(jax.random.key(0)))
    assert summary["status"] == "completed" and summary["epochs"] == 4
    assert summary["env_steps"] == 256 and int(state.counters.epoch) == 4
    run = tmp_path / "mj"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2, 3, 4]
    returns = [r["evaluate/episode_return"] for r in records if "evaluate/episode_return" in r]
    assert len(returns) == 2 and all(np.isfinite(returns)) and min(returns) >= 1
    assert all(np.isfinite(r["train/loss"]) for r in records)
    assert (run / "checkpoints").is_dir()
    action = jre.make_policy(run)(jnp.full((3, 4), 10.0))  # clipped to the bounds
    assert action.shape == (3, 1) and bool(jnp.all(jnp.abs(action) <= 3.0))
    capsys.readouterr()
    assert cli.main(["eval", str(run), "--episodes", "2"]) == 0
    stats = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert stats["episodes"] == 2 and stats["return_min"] >= 1, stats
