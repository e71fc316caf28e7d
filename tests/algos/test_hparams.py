"""Traced hyperparameters: one program trains several settings, each equal to its own run.
(DQN's and SAC's: tests/algos/test_off_policy.py, whose vmapped members differ in a learning
rate too; TD3's: tests/algos/test_td3.py.)"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_engine as jre
from tests.algos.test_off_policy import config
from tests.conftest import small_config

LRS = (3e-4, 1e-3)


def stack(*hparams):
    return jax.tree.map(lambda *x: jnp.stack([jnp.asarray(v, jnp.float32) for v in x]), *hparams)


def assert_members_equal_their_own_runs(cfg, field: str):
    train = jre.make_train(cfg)
    hp = jre.hparams(cfg)
    settings = [hp.replace(**{field: lr}) for lr in LRS]
    keys = jax.random.split(jax.random.key(7), len(LRS))
    swept, swept_metrics = jax.jit(jax.vmap(train))(keys, stack(*settings))
    single = jax.jit(train)
    finals = []
    for i, setting in enumerate(settings):
        state, metrics = single(keys[i], setting)
        assert float(getattr(state.hparams, field)) == pytest.approx(LRS[i])
        for a, b in zip(
            jax.tree.leaves(state.train.params), jax.tree.leaves(swept.train.params), strict=True
        ):
            np.testing.assert_allclose(np.asarray(b)[i], np.asarray(a), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(
            swept_metrics["evaluate/episode_return"][i],
            metrics["evaluate/episode_return"],
            rtol=1e-5,
        )
        finals.append(jax.tree.leaves(state.train.params))
    # The learning rate is really traced: the two settings trained different params.
    assert not all(np.allclose(a, b) for a, b in zip(*finals, strict=True))


def test_ppo_learning_rate_sweep_equals_separate_runs(tmp_path):
    assert_members_equal_their_own_runs(small_config(tmp_path=tmp_path), "lr")


def test_hparams_come_from_the_config_and_live_in_the_state(tmp_path):
    cfg = small_config("algo.lr=1e-3", "algo.clip_eps=0.3", tmp_path=tmp_path)
    hp = jre.hparams(cfg)
    assert (hp.lr, hp.clip_eps) == (1e-3, 0.3)
    engine = jre.build(cfg)
    state = engine.init(jax.random.key(0))
    assert state.hparams.lr.dtype == jnp.float32 and float(state.hparams.lr) == pytest.approx(1e-3)
    other = engine.init(jax.random.key(0), hp.replace(lr=2e-3))
    assert float(other.hparams.lr) == pytest.approx(2e-3)
    # Same compiled epoch for both (hparams are data, not constants of the trace).
    engine.epoch(state)
    engine.epoch(other)
    assert engine.epoch._cache_size() == 1


def test_learning_rate_annealing_reads_the_traced_lr(tmp_path):
    """With annealing on, a 2x lr gives 2x the first update (Adam's first step is lr * sign)."""
    cfg = small_config("algo.update_epochs=1", "algo.num_minibatches=1", tmp_path=tmp_path)
    engine = jre.build(cfg)
    hp = engine.hparams
    steps = {}
    for lr in LRS:
        state = engine.init(jax.random.key(0), hp.replace(lr=lr))
        before = jax.tree.leaves(jax.device_get(state.train.params))
        state, _ = engine.epoch(state)
        after = jax.tree.leaves(jax.device_get(state.train.params))
        steps[lr] = np.concatenate([(a - b).ravel() for a, b in zip(after, before, strict=True)])
    ratio = np.abs(steps[LRS[1]]).max() / np.abs(steps[LRS[0]]).max()
    assert ratio == pytest.approx(LRS[1] / LRS[0], rel=1e-3)


@pytest.mark.parametrize("anneal", [True, False])
def test_train_lr_is_the_learning_rate_of_each_epochs_last_update(anneal, tmp_path):
    """PPO: 4 updates an epoch, 8 epochs, annealed linearly to 0 over the 32 (or constant);
    DQN: its schedule spans the gradient steps after learning_starts (none in epoch 1)."""
    cfg = small_config(
        "total_env_steps=512", f"algo.anneal_lr={str(anneal).lower()}", tmp_path=tmp_path
    )
    engine = jre.build(cfg)
    _, summary = engine.run(engine.init(jax.random.key(0)))
    lr, updates, total = cfg.algo.lr, engine.algo.grad_steps_per_epoch, engine.num_epochs
    want = [lr * (1 - (e * updates - 1) / (total * updates)) if anneal else lr for e in range(1, 9)]
    np.testing.assert_allclose(
        [r["train/lr"] for r in summary["records"]], want, rtol=1e-6, atol=1e-10
    )

    cfg = config(
        "dqn",
        "name=dqn",
        "algo.lr=1e-3",
        "algo.target_update_interval=8",
        f"algo.anneal_lr={str(anneal).lower()}",
        tmp_path=tmp_path,
    )
    engine = jre.build(cfg)
    _, summary = engine.run(engine.init(jax.random.key(0)))
    steps = engine.driver.cfg.algo.replay(4, engine.num_epochs).run_grad_steps  # 56, 8 an epoch
    done = [max(0, 8 * (e - 1)) for e in range(1, engine.num_epochs + 1)]  # after epoch e
    want = [1e-3 * (1 - max(n - 1, 0) / steps) if anneal else 1e-3 for n in done]
    np.testing.assert_allclose(
        [r["train/lr"] for r in summary["records"]], want, rtol=1e-6, atol=1e-10
    )
