"""`jre.make_policy`: act with a trained policy in one line, from memory or a run directory."""

from __future__ import annotations

import shutil

import jax
import numpy as np
import pytest

import jaxrl_engine as jre
from jaxrl_engine.export.policy import ExportError
from jaxrl_engine.io.checkpoint import Checkpointer
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
        assert np.asarray(policy(obs[:0])).shape == (0, *want.shape[1:])  # an empty batch


def test_a_checkpoint_pruned_while_read_gives_the_newer_latest(trained, tmp_path, monkeypatch):
    # A run still training deletes its older checkpoints (keep_checkpoints) as it saves: the
    # latest one listed may be gone when read
    engine, state, run_dir = trained
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    listed = []
    real_latest = Checkpointer.latest

    def listed_before_the_writer_pruned(self):
        listed.append(real_latest(self))
        if len(listed) == 1:
            shutil.rmtree(self.path_of(2))  # epoch 2 was the latest when listed, then pruned
            return 2
        return listed[-1]

    monkeypatch.setattr(Checkpointer, "latest", listed_before_the_writer_pruned)
    policy = jre.make_policy(run, checkpoint=True)
    assert listed == [4, 4]
    obs = np.asarray(state.env.obs)
    np.testing.assert_array_equal(np.asarray(policy(obs)), evaluate_action(engine, state, obs))


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


def test_a_run_of_a_network_given_to_algo_build_acts_through_its_exported_graph(tmp_path):
    # config.yaml cannot name the network: rebuilt from it, the policy would be another one.
    # make_policy(run) plays the exported graph (the trained network); sampled actions and
    # the checkpoint say what config.yaml lacks.
    import flax.linen as nn

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(2)(nn.relu(nn.Dense(8)(x))), None, nn.Dense(1)(x)[..., 0]

    cfg = small_config("name=own_net", tmp_path=tmp_path)
    sizes = jre.build(cfg)
    algo = cfg.algo.build(sizes.spec, sizes.num_envs, sizes.num_epochs, network=Net())
    engine = jre.build(cfg, algorithm=algo)
    state, _ = engine.run(engine.init(jax.random.key(0)))
    obs = jax.random.normal(jax.random.key(1), (64, 4))
    np.testing.assert_array_equal(
        jre.make_policy(tmp_path / "own_net")(obs), jre.make_policy((engine, state))(obs)
    )
    with pytest.raises(ExportError, match=r"algo\.build\(network=\.\.\.\) is not in"):
        jre.make_policy(tmp_path / "own_net", deterministic=False)
    with pytest.raises(jre.CheckpointError, match=r"what config\.yaml cannot name"):
        jre.make_policy(tmp_path / "own_net", checkpoint=True)
