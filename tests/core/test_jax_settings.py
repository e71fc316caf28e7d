"""Process-wide JAX settings the engine cannot train under are refused at build, by name."""

from __future__ import annotations

import warnings

import jax
import numpy as np
import pytest

import jaxrl_engine as jre
from jaxrl_engine.core.engine import JaxSettingError
from jaxrl_engine.io.checkpoint import Checkpointer
from tests.conftest import small_config


@pytest.mark.parametrize(
    "setting, advice",
    [
        ("jax_enable_x64", "float32"),
        ("jax_disable_jit", "ahead of time"),
        ("jax_debug_nans", "nan_guard"),
    ],
)
def test_an_unsupported_setting_is_refused_at_every_entry_point(setting, advice, tmp_path):
    cfg = small_config(tmp_path=tmp_path)
    engine = jre.build(cfg)
    state = engine.init(jax.random.key(0))
    previous = getattr(jax.config, setting)
    jax.config.update(setting, True)
    try:
        with pytest.raises(JaxSettingError, match=f"^{setting} is on: .*{advice}"):
            jre.build(cfg)
        # Turned on since the build: every entry point says so (not a dtype or trace error)
        for call in (
            lambda: engine.run(state),
            lambda: engine.init(jax.random.key(0)),
            lambda: engine.epoch(state),
            lambda: engine.epochs(state, 2),
            lambda: engine.rollout(state),
            lambda: engine.warm_up(state, phases=["rollout"]),
        ):
            with pytest.raises(JaxSettingError, match=f"^{setting} is on"):
                call()
    finally:
        jax.config.update(setting, previous)
    assert not (tmp_path / cfg.name).exists()  # nothing written


def test_a_resume_under_another_threefry_setting_is_warned_about(tmp_path):
    # The same keys give other bits under the other setting: the resumed run is not exact.
    cfg = small_config(tmp_path=tmp_path)
    engine = jre.build(cfg)
    engine.run(engine.init(jax.random.key(0)), num_epochs=2)
    checkpoints = Checkpointer(tmp_path / cfg.name / "checkpoints", read_only=True)
    try:
        assert checkpoints.info().threefry_partitionable is jax.config.jax_threefry_partitionable
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            checkpoints.restore(engine)  # the same setting: no warning
        previous = jax.config.jax_threefry_partitionable
        jax.config.update("jax_threefry_partitionable", not previous)
        try:
            with pytest.warns(UserWarning, match="jax_threefry_partitionable=") as caught:
                checkpoints.restore(engine)
            assert "will not equal an uninterrupted one" in str(caught[0].message)
        finally:
            jax.config.update("jax_threefry_partitionable", previous)
    finally:
        checkpoints.close()


@pytest.mark.parametrize(
    "overrides",
    [
        ["env.id=Pendulum-v1", "algo.normalize_obs=true", "algo.normalize_reward=true"],
        ["algo.name=sac", "env.id=Pendulum-v1", "algo.learning_starts=16", "algo.batch_size=8"],
        ["algo.name=td3", "env.id=Pendulum-v1", "algo.learning_starts=16", "algo.batch_size=8"],
        ["algo.torch_policy.factory=jaxrl_engine.interop.torch_nets:mlp"],
    ],
    ids=["ppo-continuous", "sac", "td3", "torch-fast-path"],
)
def test_the_engine_broadcasts_explicitly_under_rank_promotion_raise(overrides, tmp_path):
    # A strict codebase's setting: the engine's own broadcasts (action bounds, log-std, twin
    # critics' targets, normalisers, the torch fast path's biases) name their axes.
    base = ["env.num_envs=4", "algo.num_steps=8", "eval.num_envs=2", "progress=false"]
    ppo = ["algo.num_minibatches=2"] if not any("algo.name" in o for o in overrides) else []
    cfg = jre.load_config(None, [*base, *ppo, f"run_dir={tmp_path}", *overrides])
    with jax.numpy_rank_promotion("raise"):
        engine = jre.build(cfg)
        state = engine.init(jax.random.key(0))
        for _ in range(3):  # (past the off-policy warm-up)
            state, metrics = engine.epoch(state)
        state, evaluation = engine.evaluate(state)
    assert all(np.isfinite(float(v)) for k, v in metrics.items() if "loss" in k)
    assert np.isfinite(float(evaluation["evaluate/episode_return"]))


def test_under_x64_a_runs_deterministic_policy_plays_its_exported_graph(tmp_path):
    """A trained run's greedy policy is usable in a process that turned x64 on (its exported
    graph, float32 inside, takes float64 observations); what needs the engine says why not."""
    cfg = small_config("total_env_steps=128", tmp_path=tmp_path)
    engine = jre.build(cfg)
    engine.run(engine.init(jax.random.key(0)))
    run = tmp_path / cfg.name
    obs = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    want = np.asarray(jre.make_policy(run)(obs))
    jax.config.update("jax_enable_x64", True)
    try:
        policy = jre.make_policy(run)
        wide = jax.numpy.asarray(obs, dtype=jax.numpy.float64)
        np.testing.assert_array_equal(np.asarray(policy(wide)), want)
        np.testing.assert_array_equal(np.asarray(jax.jit(policy)(wide)), want)
        for kwargs, what in (
            ({"deterministic": False}, "sampling actions"),
            ({"checkpoint": True}, "reading the checkpoint's params"),
        ):
            with pytest.raises(JaxSettingError, match=f"{what} needs the run's engine.*x64"):
                jre.make_policy(run, **kwargs)
    finally:
        jax.config.update("jax_enable_x64", False)
