"""DQN and SAC on the engine's phases: purity under vmap, the async schedule, config errors."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_engine as jre
from jaxrl_engine.algos.dqn import epsilon
from tests.conftest import run_on_four_devices

SMALL = {
    "dqn": ["algo.name=dqn", "env.id=CartPole-v1"],
    "sac": ["algo.name=sac", "env.id=Pendulum-v1"],
}
COMMON = [
    "env.num_envs=4",
    "eval.num_envs=4",
    "eval.interval=3",
    "algo.num_steps=8",
    "algo.buffer_size=200",
    "algo.batch_size=16",
    "algo.learning_starts=64",
    "algo.train_ratio=0.25",
    "algo.hidden_sizes=[16,16]",
    "total_env_steps=256",
    "progress=false",
]


def config(algo: str, *overrides: str, tmp_path=None) -> jre.Config:
    extra = [f"run_dir={tmp_path}"] if tmp_path is not None else []
    return jre.load_config(None, [*SMALL[algo], *COMMON, *extra, *overrides])


@pytest.mark.parametrize("algo", ["dqn", "sac"])
def test_epoch_writes_the_replay_buffer_and_trains_after_warm_up(algo, tmp_path):
    engine = jre.build(config(algo, tmp_path=tmp_path))
    state = engine.init(jax.random.key(0))
    assert state.buffer.data.obs.shape[:2] == (50, 4)  # [capacity_per_env, num_envs]
    learned = []
    for _ in range(3):
        before = jax.tree.map(np.asarray, state.train.params)
        state, metrics = engine.epoch(state)
        after = jax.tree.map(np.asarray, state.train.params)
        changed = any(
            not np.array_equal(a, b)
            for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True)
        )
        loss = float(metrics["train/loss" if algo == "dqn" else "train/critic_loss"])
        learned.append((float(metrics["train/learning"]), changed, np.isnan(loss)))
        assert int(metrics["guard/train"]) == -1  # a NaN loss before learning is not an error
    # 32 transitions per epoch, learning_starts=64: epoch 1 only collects (no loss: NaN, which
    # metrics.jsonl logs as null and TensorBoard and plot leave out).
    assert learned == [(0.0, False, True), (1.0, True, False), (1.0, True, False)]
    assert int(state.buffer.size()) == 96
    assert int(state.train.schedule.grad_steps) == 2 * 8
    assert int(state.counters.env_steps) == 96


def test_an_update_interval_longer_than_the_run_is_warned_about_with_the_runs_steps(tmp_path):
    # 8 epochs of 32 env steps, learning from epoch 2 (learning_starts=64), 8 gradient steps
    # each: 56 gradient steps. An interval of 57 never updates the target network; 56 does.
    with pytest.warns(UserWarning, match=r"target_update_interval=57 > the run's 56 gradient"):
        config("dqn", "algo.target_update_interval=57")
    with pytest.warns(UserWarning, match=r"policy_delay=57 > the run's 56 gradient steps"):
        jre.load_config(
            None, ["algo.name=td3", "env.id=Pendulum-v1", *COMMON, "algo.policy_delay=57"]
        )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        engine = jre.build(config("dqn", "algo.target_update_interval=56", tmp_path=tmp_path))
    state = engine.init(jax.random.key(0))
    for _ in range(engine.num_epochs):
        state, _ = engine.epoch(state)
    assert int(state.train.schedule.grad_steps) == 56  # the count the warning names
    # ... and the one DQN's anneal_lr schedule spans (it ended at 0.5 x lr with warm-up)
    assert engine.driver.cfg.algo.replay(4, engine.num_epochs).run_grad_steps == 56


@pytest.mark.parametrize(("algo", "field"), [("dqn", "lr"), ("sac", "critic_lr")])
def test_vmapped_make_train_over_2_members_equals_their_own_runs(algo, field, tmp_path):
    """`jax.jit(jax.vmap(train))(keys, hparams)`: two members that differ in seed and in a
    learning rate (a traced hyperparameter) train as their own runs do, replay buffer included."""
    cfg = config(algo, "algo.prioritized=true", tmp_path=tmp_path)
    train = jre.make_train(cfg)
    hp = jre.hparams(cfg)
    lrs = (3e-4, 1e-3)
    settings = [hp.replace(**{field: lr}) for lr in lrs]
    stacked = jax.tree.map(lambda *x: jnp.stack([jnp.float32(v) for v in x]), *settings)
    keys = jax.vmap(jax.random.key)(jnp.arange(2))
    batched_state, batched = jax.jit(jax.vmap(train))(keys, stacked)
    single = jax.jit(train)
    loss = "train/loss" if algo == "dqn" else "train/critic_loss"
    for i in range(2):
        state, metrics = single(jax.random.key(i), settings[i])
        assert float(getattr(state.hparams, field)) == pytest.approx(lrs[i])
        for k in (loss, "evaluate/episode_return", "update_dataset/buffer_size"):
            np.testing.assert_allclose(batched[k][i], metrics[k], rtol=1e-4, atol=1e-4)
        for a, b in zip(
            jax.tree.leaves((state.train.params, state.buffer.data)),
            jax.tree.leaves((batched_state.train.params, batched_state.buffer.data)),
            strict=True,
        ):
            np.testing.assert_allclose(np.asarray(b)[i], np.asarray(a), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("algo", ["dqn", "sac"])
def test_prioritized_beta_anneals_linearly_to_its_end_value_over_the_run(algo, tmp_path):
    cfg = config(algo, "algo.prioritized=true", "algo.priority_beta=0.5", tmp_path=tmp_path)
    engine = jre.build(cfg)  # 256 / 32 = 8 epochs
    state = engine.init(jax.random.key(0))
    betas = []
    for _ in range(engine.num_epochs):
        state, metrics = engine.epoch(state)
        betas.append(float(metrics["update_dataset/priority_beta"]))
    # Each epoch samples with the beta of the env steps collected so far (32 an epoch).
    want = [0.5 + 0.5 * 32 * k / 256 for k in range(1, 9)]
    np.testing.assert_allclose(betas, want, rtol=1e-6)
    assert "beta (algo.priority_beta_end)" in cfg.algo.run_length_schedules()


def test_dqns_epsilon_metric_is_the_one_its_epochs_rollout_acted_with(tmp_path):
    cfg = config(
        "dqn", "algo.learning_starts=0", "algo.exploration_fraction=0.5", tmp_path=tmp_path
    )
    engine = jre.build(cfg)  # 8 epochs of 32 env steps; epsilon 1 -> 0.05 over 128 steps
    state = engine.init(jax.random.key(0))
    for k in range(engine.num_epochs):
        acted_with = float(state.eval_params["epsilon"])  # sync_weights' copy, before the epoch
        state, metrics = engine.epoch(state)
        assert float(metrics["train/epsilon"]) == pytest.approx(acted_with, abs=1e-7)
        assert acted_with == pytest.approx(max(0.05, 1.0 - 0.95 * 32 * k / 128), abs=1e-6)


def test_sync_every_k_makes_acting_weights_lag_the_learner(tmp_path):
    cfg = config("dqn", "algo.sync_every=3", "algo.learning_starts=0", tmp_path=tmp_path)
    engine = jre.build(cfg)  # 256 / 32 = 8 epochs
    state = engine.init(jax.random.key(0))
    snapshots = {}
    for epoch in range(1, engine.num_epochs + 1):
        state, _ = engine.epoch(state)
        snapshots[epoch] = jax.tree.map(np.asarray, state.train.params)
        acting = jax.tree.map(np.asarray, state.eval_params["q"])
        # Refreshed after epochs 3 and 6, and after the last one (8).
        source = epoch if epoch % 3 == 0 or epoch == engine.num_epochs else 3 * (epoch // 3)
        want = snapshots.get(
            source, jax.tree.map(np.asarray, engine.init(jax.random.key(0)).train.params)
        )
        for a, b in zip(jax.tree.leaves(acting), jax.tree.leaves(want), strict=True):
            np.testing.assert_array_equal(a, b)
        if source != epoch:
            assert not all(
                np.array_equal(a, b)
                for a, b in zip(
                    jax.tree.leaves(acting), jax.tree.leaves(snapshots[epoch]), strict=True
                )
            )


def test_train_ratio_sets_gradient_steps_per_epoch(tmp_path):
    engine = jre.build(config("sac", "algo.train_ratio=0.5", tmp_path=tmp_path))
    assert engine.algo.grad_steps_per_epoch == 16  # 0.5 x 8 steps x 4 envs
    state, _ = engine.epoch(engine.init(jax.random.key(0)))
    assert int(state.counters.grad_steps) == 0  # 32 env steps < learning_starts=64: idle
    state, _ = engine.epoch(state)
    assert int(state.counters.grad_steps) == 16


def test_dqn_epsilon_is_one_during_warm_up_then_decays(tmp_path):
    engine = jre.build(config("dqn", "algo.exploration_fraction=0.5", tmp_path=tmp_path))
    hp, cfg = engine.hparams, engine.driver.cfg
    run_steps = engine.num_epochs * engine.steps_per_epoch
    eps = lambda steps: epsilon(steps, hp, cfg.algo.learning_starts, run_steps)  # noqa: E731
    assert float(eps(jnp.int32(10))) == 1.0  # below learning_starts=64
    assert float(eps(jnp.int32(64))) == pytest.approx(1.0 - 0.95 * 64 / 128)
    assert float(eps(jnp.int32(256))) == pytest.approx(0.05)


def test_sac_actions_are_squashed_into_the_env_bounds(tmp_path):
    engine = jre.build(config("sac", "algo.learning_starts=0", tmp_path=tmp_path))
    state = engine.init(jax.random.key(0))
    params = engine.algo.acting_params(state.train, state.hparams)
    params = {**params, "actor": jax.tree.map(lambda x: 100.0 * x, params["actor"])}
    obs = jnp.ones((64, 3)) * 10
    action, _ = engine.algo.act(params, obs, jax.random.key(1), False)
    assert action.shape == (64, 1)
    assert float(jnp.abs(action).max()) <= 2.0


@pytest.mark.parametrize(
    ("overrides", "keys"),
    [
        (
            ["algo.buffer_mode=fixed", "algo.buffer_size=200"],
            ["algo.buffer_mode", "algo.buffer_size", "total_env_steps"],
        ),
        (["algo.buffer_size=202"], ["algo.buffer_size", "env.num_envs"]),
        (["algo.train_ratio=0.01"], ["algo.train_ratio"]),
        (["algo.tau=1.5"], ["algo.tau"]),
    ],
)
def test_bad_off_policy_configs_fail_before_compiling_naming_the_keys(overrides, keys):
    with pytest.raises(jre.ConfigError) as e:
        config("dqn", *overrides)
    for key in keys:
        assert key in str(e.value)


def test_unknown_dqn_key_lists_the_dqn_keys_and_bad_name_lists_the_algorithms():
    with pytest.raises(jre.ConfigError, match=r"'algo.bogus'.*target_update_interval"):
        config("dqn", "algo.bogus=1")
    with pytest.raises(jre.ConfigError, match=r"'ppo', 'dqn', 'sac'"):
        jre.load_config(None, ["algo.name=a2c"])


def test_cli_exits_2_when_a_fixed_buffer_cannot_hold_the_run(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "jaxrl_engine.cli",
            "train",
            *SMALL["dqn"],
            *COMMON,
            "algo.buffer_mode=fixed",
            f"run_dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert "algo.buffer_size" in proc.stderr and "total_env_steps" in proc.stderr


DATA_PARALLEL = textwrap.dedent(
    """
    import json, jax, numpy as np
    import jaxrl_engine as jre
    from jaxrl_engine.core.sharding import data_mesh
    from tests.algos.test_off_policy import config
    cfg = config("dqn", "env.num_envs=8", "eval.num_envs=8", "algo.buffer_size=400",
                 "algo.prioritized=true")
    out = {}
    for n in (1, 4):
        engine = jre.build(cfg, mesh=data_mesh(jax.devices()[:n]))
        state = engine.init(jax.random.key(0))
        for _ in range(3):
            state, metrics = engine.epoch(state)
        out[n] = dict(
            params=[np.asarray(x).tolist() for x in jax.tree.leaves(state.train.params)],
            loss=float(metrics["train/loss"]),
            buffer_spec=str(state.buffer.data.obs.sharding.spec),
            buffer_devices=len(state.buffer.data.obs.sharding.device_set),
        )
    print(json.dumps(out))
    """
)


@pytest.mark.multidevice
def test_replay_buffer_is_sharded_over_data_and_matches_one_device():
    out = run_on_four_devices(DATA_PARALLEL)
    one, four = out["1"], out["4"]
    assert four["buffer_spec"] == "P(None, 'data')" and four["buffer_devices"] == 4
    assert abs(one["loss"] - four["loss"]) <= 1e-4 * max(1.0, abs(one["loss"]))
    for a, b in zip(one["params"], four["params"], strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


def test_a_resume_refuses_a_new_init_alpha_which_only_init_reads(tmp_path):
    # Accepted and recorded in config.yaml, the override changed nothing: alpha is trained
    # state (log_alpha), restored from the checkpoint.
    cfg = config("sac", "algo.autotune=false", "save_interval=2", tmp_path=tmp_path)
    engine = jre.build(cfg)
    engine.run(engine.init(jax.random.key(0)), num_epochs=2)
    run = tmp_path / cfg.name
    with pytest.raises(jre.ConfigError, match=r"algo.init_alpha=0.05: it only sets the trained"):
        jre.resume(run, ["algo.init_alpha=0.05"])
    jre.resume(run, ["algo.actor_lr=0.0001"])  # a hyperparameter the steps read: applies
