"""`jre.make_policy`: act with a trained policy in one line, from memory or a run directory."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import jaxrl_engine as jre
from tests.conftest import small_config


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("policy")
    cfg = small_config("save_interval=2", tmp_path=root)
    engine = jre.build(cfg)
    state, summary = engine.run(engine.init(jax.random.key(0)))
    return engine, state, summary["run_dir"]


def evaluate_action(engine, state, obs):
    action, _ = engine.algo.act(state.eval_params, obs, jax.random.key(0), True)
    return np.asarray(engine.spec.action.clip(action))


def test_policy_from_engine_and_state_is_the_evaluation_action(trained):
    engine, state, _ = trained
    policy = jre.make_policy((engine, state))
    obs = state.env.obs
    np.testing.assert_array_equal(
        np.asarray(jax.jit(policy)(obs)), evaluate_action(engine, state, obs)
    )


def test_policy_from_a_run_directory_acts_like_the_trained_one(trained):
    engine, state, run_dir = trained
    obs = np.random.default_rng(0).normal(size=(32, *engine.spec.obs_shape)).astype(np.float32)
    want = evaluate_action(engine, state, obs)
    for checkpoint in (False, True):  # the exported params, or the latest checkpoint's
        policy = jre.make_policy(run_dir, checkpoint=checkpoint)
        np.testing.assert_array_equal(np.asarray(jax.jit(policy)(obs)), want)


def test_a_stochastic_policy_needs_a_key_and_samples(trained):
    engine, state, _ = trained
    policy = jre.make_policy((engine, state), deterministic=False)
    obs = np.repeat(np.asarray(state.env.obs[:1]), 256, axis=0)
    with pytest.raises(ValueError, match="PRNG key"):
        policy(obs)
    actions = np.asarray(policy(obs, jax.random.key(3)))
    assert actions.shape == (256,) and set(np.unique(actions)) <= {0, 1}


def test_a_directory_without_a_run_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"not a run directory|no checkpoints"):
        jre.make_policy(tmp_path)
