"""Brax's JAX physics envs (`env.suite: brax`, the `brax` extra): spaces map to the engine's
spec, the adapter's episode limit and auto-reset follow the engine's protocol, bad ids and params
are refused naming the key, and configs/ppo_brax_inverted_pendulum.yaml runs end to end (train,
evaluate, export, `jaxrl-engine eval`). Its learning target is a slow row of
tests/test_targets.py."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_engine as jre
from jaxrl_engine import cli
from jaxrl_engine.io.config import ConfigError

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("brax") is None,
    reason='brax is not installed (pip install -e ".[brax]")',
)

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "ppo_brax_inverted_pendulum.yaml"


def _env(**params):
    from jaxrl_engine.envs.brax_env import BraxEnv

    return BraxEnv("inverted_pendulum", params)


def test_spaces_map_to_the_engine_spec():
    env = _env()
    spec = env.spec(env.params)
    assert spec.env_id == "inverted_pendulum" and spec.obs_shape == (4,)
    assert spec.obs_dtype == np.float32 and spec.max_episode_steps == 1000
    assert not spec.action.discrete and spec.action.shape == (1,)
    assert spec.action.low == (-1.0,) and spec.action.high == (1.0,)
    assert env.backend == "spring"  # the default: the fastest Brax pipeline on CPU
    assert _env(max_steps_in_episode=7).spec(None).max_episode_steps == 7


def test_episode_limit_truncates_and_auto_resets_with_the_final_observation():
    """Holding the pole still (action 0) for 5 steps does not terminate; with a 5-step limit the
    5th step is truncated, returns a fresh episode's observation, and the ended episode's last
    observation in info["final_observation"]."""
    env = _env(max_steps_in_episode=5)
    obs, state = env.reset(jax.random.key(0), env.params)
    step = jax.jit(env.step)
    zero = jnp.zeros((1,))
    flags = []
    for i in range(5):
        prev = state
        obs, state, reward, terminated, truncated, info = step(
            jax.random.key(i + 1), state, zero, env.params
        )
        flags.append((bool(terminated), bool(truncated), float(reward)))
    assert flags[:4] == [(False, False, 1.0)] * 4
    assert flags[4] == (False, True, 1.0)
    assert int(state.time) == 0 and int(prev.time) == 4
    # the final observation continues the episode; the returned one starts the next
    direct = env.env.step(prev.inner, zero)
    np.testing.assert_allclose(info["final_observation"], direct.obs, rtol=1e-6, atol=1e-6)
    assert not np.allclose(obs, direct.obs)
    assert float(jnp.abs(obs).max()) < 0.1  # Brax resets near upright (small noise)


def test_a_fall_terminates_and_is_not_truncated():
    env = _env()
    _, state = env.reset(jax.random.key(0), env.params)
    step = jax.jit(env.step)
    for i in range(200):  # pushing one way topples the pole well within 200 steps
        _, state, _, terminated, truncated, _ = step(
            jax.random.key(i), state, jnp.ones((1,)), env.params
        )
        if bool(terminated):
            break
    assert bool(terminated) and not bool(truncated), i
    assert int(state.time) == 0


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (["env.id=inverted_pendulm"], "'inverted_pendulm' is not a Brax env"),
        (["env.params.backend=bullet"], "env.params.backend='bullet'"),
        (["env.params.max_steps_in_episode=0"], "max_steps_in_episode=0"),
        (["env.params.gravity=2"], "not keyword arguments of Brax env"),
        (["eval.env_params.max_steps_in_episode=-1"], "eval.env_params.max_steps_in_episode"),
    ],
)
def test_bad_brax_configs_are_refused_naming_the_key(overrides, fragment):
    with pytest.raises(ConfigError) as err:
        jre.load_config(CONFIG, overrides)
    assert fragment in str(err.value), str(err.value)


def test_the_config_runs_end_to_end_and_its_untrained_policy_is_far_below_the_target(
    tmp_path, capsys
):
    """A few epochs through the engine (train, evaluate, checkpoint, export, `eval` verb); the
    untrained policy balances for ~20 steps, far below the slow target's 900."""
    short = [
        f"run_dir={tmp_path}",
        "name=bx",
        "progress=false",
        "loggers=[jsonl]",
        "env.num_envs=4",
        "eval.num_envs=4",
        "eval.interval=2",
        "algo.num_steps=16",
        "algo.num_minibatches=2",
        "total_env_steps=256",
    ]
    engine = jre.build(jre.load_config(CONFIG, short))
    state = engine.init(jax.random.key(0))
    _, metrics = engine.call("evaluate", state)
    assert 3 <= float(metrics["evaluate/episode_return"]) <= 100, metrics
    state, summary = engine.run(state)
    assert summary["status"] == "completed" and summary["epochs"] == 4
    assert summary["env_steps"] == 256 and int(state.counters.epoch) == 4
    run = tmp_path / "bx"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2, 3, 4]
    assert all(np.isfinite(r["train/loss"]) for r in records)
    action = jre.make_policy(run)(jnp.full((3, 4), 10.0))  # clipped to the bounds
    assert action.shape == (3, 1) and bool(jnp.all(jnp.abs(action) <= 1.0))
    capsys.readouterr()
    assert cli.main(["eval", str(run), "--episodes", "2"]) == 0
    stats = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert stats["episodes"] == 2 and stats["return_min"] >= 1, stats


def test_importing_brax_prints_nothing_on_stdout():
    """The CLI's stdout is its JSON summary; mujoco.mjx prints "Failed to import warp" there on
    import when its optional GPU backend is absent (a fresh process: the import is the point)."""
    code = "from jaxrl_engine.envs.brax_env import brax_env_ids; assert brax_env_ids()"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout == ""


def test_making_an_env_writes_no_mujoco_log_into_the_working_directory(tmp_path, monkeypatch):
    # Brax's halfcheetah model makes MuJoCo warn on every make; MuJoCo's own handler would append
    # that to ./MUJOCO_LOG.TXT. The adapter routes it through Python warnings instead.
    import mujoco

    from jaxrl_engine.envs.brax_env import BraxEnv

    monkeypatch.chdir(tmp_path)
    env = BraxEnv("halfcheetah")
    assert env.spec(env.params).obs_shape == (17,)
    assert list(tmp_path.iterdir()) == []
    assert mujoco.get_mju_user_warning() is None  # MuJoCo's default handler is back
