"""Training targets with torch in the loop, through the CLI as a user runs it."""

from __future__ import annotations

import jax
import numpy as np
import pytest

pytest.importorskip("torch")

import jaxrl_engine as jre
from tests.conftest import small_config
from tests.test_targets import train


@pytest.mark.slow
def test_torch_mlp_policy_fast_path_reaches_475(tmp_path):
    summary, _ = train("configs/ppo_torch_policy.yaml", "seed=0", tmp_path=tmp_path)
    assert summary["final_eval_return"] >= 475, summary


@pytest.mark.slow
def test_torch_policy_universal_path_trains(tmp_path):
    summary, _ = train(
        "configs/ppo_torch_policy.yaml",
        "algo.torch_policy.path=universal",
        "total_env_steps=100000",
        tmp_path=tmp_path,
    )
    assert summary["final_eval_return"] >= 300, summary


@pytest.mark.slow
def test_torch_learner_acting_in_jax_reaches_475(tmp_path):
    summary, _ = train(
        "configs/ppo_torch_policy.yaml",
        "algo.torch_policy.learner=torch",
        "algo.torch_policy.critic=torch",
        tmp_path=tmp_path,
    )
    assert summary["final_eval_return"] >= 475, summary


def test_torch_learner_trains_in_torch_and_the_actor_acts_with_its_weights(tmp_path):
    cfg = small_config(
        "algo.torch_policy.learner=torch", "algo.torch_policy.critic=torch", tmp_path=tmp_path
    )
    engine = jre.build(cfg)
    learner = engine.algo.static["torch_learner"]
    state = engine.init(jax.random.key(0))
    before = {k: v.clone() for k, v in learner.actor.state_dict().items()}
    state, metrics = engine.epoch(state)
    assert np.isfinite(float(metrics["train/loss"]))
    # annealed over the run's updates, as the JAX learner's `train/lr`: the rate of epoch 1's
    # last update (number updates - 1, counted from 0, of num_epochs * updates)
    updates = engine.algo.grad_steps_per_epoch
    want = cfg.algo.lr * (1 - (updates - 1) / (engine.num_epochs * updates))
    assert float(metrics["train/lr"]) == pytest.approx(want, rel=1e-6)
    after = learner.actor.state_dict()
    assert any(not bool((before[k] == after[k]).all()) for k in before), "torch did not step"
    # sync_weights handed the torch weights to the JAX actor...
    for k, v in after.items():
        np.testing.assert_array_equal(np.asarray(state.eval_params["net"]["actor"][k]), v.numpy())
    # ...with one counted copy per epoch, and the batch reached torch zero-copy.
    weight_bytes = sum(
        v.numel() * 4 for m in (learner.actor, learner.critic) for v in m.state_dict().values()
    )
    assert learner.bytes_to_jax == weight_bytes
    assert learner.batch_report.copied_bytes == 0 and learner.batch_report.zero_copy_bytes > 0
    # Outside jit the torch weights bridge zero-copy.
    params = learner.acting_params()
    for k, v in after.items():
        assert params["actor"][k].unsafe_buffer_pointer() == v.data_ptr()


def test_the_torch_learner_refuses_to_be_vmapped_over_seeds(tmp_path):
    cfg = small_config(
        "algo.torch_policy.learner=torch", "algo.torch_policy.critic=torch", tmp_path=tmp_path
    )
    train = jre.make_train(cfg)
    with pytest.raises(ValueError, match="cannot be vmapped"):
        jax.eval_shape(jax.vmap(train), jax.random.split(jax.random.key(0), 2))
