"""Acting overlapped with learning (`env.overlap`): the fixed schedule (rollout k acts with the
params of epoch k-1), reproducible results, the policy-lag metric, and an actor's error
stopping the run with the checkpoint intact."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import jaxrl_engine as jre
from jaxrl_engine.io.checkpoint import Checkpointer
from jaxrl_engine.run.overlap import ACTOR_STREAM, overlapped_epochs
from tests.conftest import small_config

OVERLAP = ["env.overlap=true", "loggers=[jsonl]"]


def leaves_equal(a, b) -> None:
    def plain(x):
        is_key = jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
        return np.asarray(jax.random.key_data(x) if is_key else x)

    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(plain(x), plain(y))


@pytest.fixture(scope="module")
def engine():
    return jre.build(small_config(*OVERLAP))


def test_rollout_k_acts_with_the_params_of_epoch_k_minus_1(engine):
    """The overlapped chunk equals this sequential schedule, bitwise."""
    state = engine.init(jax.random.key(1))
    got, rows = overlapped_epochs(engine, state, 3)

    actor = state.replace(rng=jax.random.fold_in(state.rng, ACTOR_STREAM))
    learner, versions = state, [state.eval_params]
    for k in range(3):
        actor, _ = engine.rollout(actor.replace(eval_params=versions[max(k - 1, 0)]))
        learner = learner.replace(
            buffer=actor.buffer,
            env=actor.env,
            stats=actor.stats,
            counters=learner.counters.replace(env_steps=actor.counters.env_steps),
        )
        learner, _ = engine.learn(learner)
        versions.append(learner.eval_params)
    leaves_equal(got, learner)
    assert [row["rollout/policy_lag"] for row in rows] == [0, 1, 1]
    assert int(got.counters.epoch) == 3 and int(got.counters.env_steps) == 3 * 64


def test_overlapped_runs_are_reproducible_and_log_the_policy_lag(tmp_path):
    results = []
    for name in ("a", "b"):
        cfg = small_config(*OVERLAP, f"name={name}", "eval.interval=3", tmp_path=tmp_path)
        eng = jre.build(cfg)
        state, summary = eng.run(eng.init(jax.random.key(0)))
        results.append((state, summary))
    leaves_equal(results[0][0].train, results[1][0].train)
    lags = [r["rollout/policy_lag"] for r in results[0][1]["records"]]
    assert lags == [0, 1, 1, 0]  # each chunk (3 epochs, then 1) starts with the current params


def test_an_error_in_the_actor_thread_stops_the_run_and_keeps_the_checkpoint(tmp_path):
    cfg = small_config(*OVERLAP, "total_env_steps=640", "save_interval=2", tmp_path=tmp_path)
    eng = jre.build(cfg)
    real_call, rollouts = eng.call, []

    def failing_call(name, state, *args):
        if name == "rollout":
            rollouts.append(1)
            if len(rollouts) == 6:  # the actor's 6th rollout: epoch 6
                raise RuntimeError("actor crashed")
        return real_call(name, state, *args)

    eng.call = failing_call
    with pytest.raises(RuntimeError, match="actor crashed"):
        eng.run(eng.init(jax.random.key(0)))
    checkpoints = Checkpointer(tmp_path / cfg.name / "checkpoints", read_only=True)
    try:
        assert checkpoints.epochs()[-1] == 4
        state, _ = checkpoints.restore(jre.build(cfg))
        assert int(state.counters.epoch) == 4
    finally:
        checkpoints.close()


def test_overlap_refuses_off_policy_algorithms(tmp_path):
    cfg = jre.load_config(
        None,
        [
            "algo.name=dqn",
            "env.overlap=true",
            "total_env_steps=2048",
            "algo.learning_starts=64",
            f"run_dir={tmp_path}",
        ],
    )
    with pytest.raises(jre.ConfigError, match="on-policy algorithms only"):
        jre.build(cfg)
