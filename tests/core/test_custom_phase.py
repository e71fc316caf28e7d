"""A user's own phase (`phases={"update_dataset": ...}`) gets everything a default phase gets:
the fused epoch and the driver run it, nan_guard checks it, user hooks wrap it, offload places
around it, warm-up compiles it, profile times it. The phase: PPO's `update_dataset` on the
buffer's rewards times a fixed scale (examples/custom_phase.py), plus a metric of its own."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxrl_engine as jre
from jaxrl_engine.algos.ppo import gae
from jaxrl_engine.compose import make_algorithm
from jaxrl_engine.core.phases import EPOCH_PHASES
from jaxrl_engine.core.sharding import data_mesh
from jaxrl_engine.core.state import get_path
from jaxrl_engine.envs.gymnax_env import make_env
from tests.conftest import small_config
from tests.core.test_engine import key_data, leaves_equal

SCALE = 0.25
KEY = "update_dataset/reward_scale"
OFFLOADED = ("eval_params", "train.params", "train.opt_state")


def reward_scaled(algo: jre.Algorithm, scale: float) -> jre.Phase:
    """The user's phase: written against the state, as the default `update_dataset` is."""

    def update_dataset(state):
        rng, key = jax.random.split(state.rng)
        buffer = state.buffer._replace(reward=state.buffer.reward * scale)
        train, batch, metrics = algo.update_dataset(state.train, buffer, key, state.hparams)
        metrics = {**metrics, KEY: jnp.float32(scale)}
        return state.replace(train=train, batch=batch, rng=rng), metrics

    return update_dataset


def nan_metric_at_epoch_2(algo: jre.Algorithm, scale: float) -> jre.Phase:
    """The same phase, whose own metric is NaN in the second epoch (counter 1)."""
    inner = reward_scaled(algo, scale)

    def update_dataset(state):
        epoch = state.counters.epoch
        state, metrics = inner(state)
        bad = jnp.where(epoch == 1, jnp.float32(jnp.nan), metrics[KEY])
        return state, {**metrics, KEY: bad}

    return update_dataset


def build_custom(cfg: jre.Config, scale: float = SCALE, factory=reward_scaled, **kwargs):
    """`jre.build` with the algorithm bundle the phase closes over and the phase itself."""
    env = make_env(cfg.env.id, cfg.env.params)
    algo = make_algorithm(cfg, env.spec(env.params))
    phases = {"update_dataset": factory(algo, scale)}
    return jre.build(cfg, env=env, algorithm=algo, phases=phases, **kwargs)


def targets_of(engine: jre.Engine, buffer, reward) -> np.ndarray:
    """PPO's value targets (GAE) for `reward` on the rollout in `buffer`."""
    hp = engine.hparams
    _, targets = gae(
        reward,
        buffer.extras["value"],
        buffer.extras["next_value"],
        buffer.terminated.astype(jnp.float32),
        buffer.truncated.astype(jnp.float32),
        hp.gamma,
        hp.gae_lambda,
    )
    return np.asarray(targets)


def kinds(state) -> dict[str, set[str]]:
    return {
        p: {x.sharding.memory_kind for x in jax.tree.leaves(get_path(state, p))} for p in OFFLOADED
    }


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """(engine with the custom phase, default engine) over one env and algorithm bundle;
    shared by the tests below so that each phase compiles once."""
    cfg = small_config(tmp_path=tmp_path_factory.mktemp("runs"))
    custom = build_custom(cfg)
    return custom, jre.build(cfg, env=custom.env, algorithm=custom.algo)


# (a) -------------------------------------------------------------------------------------------
def test_custom_phase_runs_in_the_fused_epoch_the_epochs_loop_and_the_driver(engines, tmp_path):
    engine, _ = engines
    assert engine.num_epochs == 4 and engine.epochs_per_call == 2

    state, metrics = engine.epoch(engine.init(jax.random.key(0)))
    assert float(metrics[KEY]) == SCALE
    assert "update_dataset/return_target_mean" in metrics  # the algorithm's own ran inside
    assert int(state.counters.epoch) == 1

    state, table, done = engine.call("epochs", state, 2)
    assert int(done) == 2 and int(state.counters.epoch) == 3
    np.testing.assert_array_equal(np.asarray(table[KEY]), [SCALE, SCALE])

    _, summary = engine.run(engine.init(jax.random.key(0)), run_dir=tmp_path)
    records = summary["records"]
    assert [r["epoch"] for r in records] == [1, 2, 3, 4]
    assert [r[KEY] for r in records] == [SCALE] * 4
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r[KEY] for r in logged] == [SCALE] * 4


# (b) -------------------------------------------------------------------------------------------
def test_scaled_targets_differ_from_the_default_and_the_rest_is_the_same(engines):
    custom, default = engines
    s_c, m_c = custom.epoch(custom.init(jax.random.key(0)))
    s_d, m_d = default.epoch(default.init(jax.random.key(0)))

    # Same where it should be: the rollout (observations, stored rewards, values), the key the
    # phase advances, the counters. The buffer keeps the env's own rewards.
    for part in ("env", "buffer", "counters", "stats", "eval_version"):
        assert leaves_equal(getattr(s_c, part), getattr(s_d, part)), part
    np.testing.assert_array_equal(jax.random.key_data(s_c.rng), jax.random.key_data(s_d.rng))
    for k in ("rollout/reward_mean", "rollout/episodes", "sync_weights/version"):
        np.testing.assert_array_equal(np.asarray(m_c[k]), np.asarray(m_d[k]))

    # Different where it should be: the targets are the GAE of the scaled rewards.
    buffer = s_c.buffer
    scaled = targets_of(custom, buffer, buffer.reward * SCALE)
    unscaled = targets_of(custom, buffer, buffer.reward)
    np.testing.assert_allclose(np.asarray(s_c.batch.returns), scaled, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(s_d.batch.returns), unscaled, rtol=1e-5, atol=1e-6)
    target_key = "update_dataset/return_target_mean"
    np.testing.assert_allclose(float(m_c[target_key]), scaled.mean(), rtol=1e-5)
    np.testing.assert_allclose(float(m_d[target_key]), unscaled.mean(), rtol=1e-5)
    assert abs(float(m_c[target_key])) < 0.5 * abs(float(m_d[target_key]))
    assert KEY not in m_d
    # ... and the learner trained on them.
    assert not leaves_equal(s_c.train.params, s_d.train.params)


def test_scale_one_is_the_default_phase_exactly(engines):
    custom, default = engines
    rolled, _ = custom.rollout(custom.init(jax.random.key(3)))
    s_d, m_d = default.update_dataset(rolled)
    s_1, m_1 = jax.jit(reward_scaled(custom.algo, 1.0))(rolled)
    assert leaves_equal(key_data(s_1), key_data(s_d))
    assert set(m_1) == {*m_d, KEY} - {"guard/update_dataset"}
    assert leaves_equal({k: m_1[k] for k in m_1 if k != KEY}, {k: m_d[k] for k in m_1 if k != KEY})


# (c) -------------------------------------------------------------------------------------------
def test_nan_guard_checks_the_custom_phase(engines, tmp_path):
    custom, _ = engines
    assert KEY in custom.guarded_names["update_dataset"]
    _, metrics = custom.call("update_dataset", custom.rollout(custom.init(jax.random.key(0)))[0])
    assert int(metrics["guard/update_dataset"]) == -1

    engine = build_custom(small_config(tmp_path=tmp_path), factory=nan_metric_at_epoch_2)
    with pytest.raises(jre.NonFiniteError, match=r"phase 'update_dataset'.*epoch 2") as info:
        engine.run(engine.init(jax.random.key(0)), run_dir=tmp_path / "run")
    assert info.value.phase == "update_dataset"
    assert info.value.quantity == KEY
    assert info.value.epoch == 2
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 1


# (d) -------------------------------------------------------------------------------------------
def test_user_hooks_wrap_the_custom_phase(engines, tmp_path):
    seen: list[list[str]] = []

    def double_rewards(phase):
        """Before the phase: the rewards it reads are doubled."""

        def wrapped(state):
            buffer = state.buffer._replace(reward=2.0 * state.buffer.reward)
            return phase(state.replace(buffer=buffer))

        return wrapped

    def read_metrics(phase):
        """After the phase: sees its metrics (and the guard's, which sits inside user hooks)."""

        def wrapped(state):
            state, metrics = phase(state)
            seen.append(sorted(metrics))
            return state, {**metrics, "update_dataset/hooked_scale": 10.0 * metrics[KEY]}

        return wrapped

    plain, _ = engines
    hooks = {"update_dataset": [double_rewards, read_metrics]}
    engine = build_custom(small_config(tmp_path=tmp_path), hooks=hooks)
    state, metrics = engine.epoch(engine.init(jax.random.key(0)))
    reference, _ = plain.epoch(plain.init(jax.random.key(0)))

    assert float(metrics["update_dataset/hooked_scale"]) == pytest.approx(10.0 * SCALE)
    assert seen and all({KEY, "guard/update_dataset"} <= set(keys) for keys in seen)
    buffer = state.buffer
    np.testing.assert_array_equal(
        np.asarray(buffer.reward), 2.0 * np.asarray(reference.buffer.reward)
    )
    expected = targets_of(engine, buffer, buffer.reward * SCALE)  # doubled, then scaled
    np.testing.assert_allclose(np.asarray(state.batch.returns), expected, rtol=1e-5, atol=1e-6)


# (e) -------------------------------------------------------------------------------------------
def test_offload_works_with_the_custom_phase(engines, tmp_path):
    plain, _ = engines
    engine = build_custom(small_config("offload=true", tmp_path=tmp_path))
    results = []
    for e in (plain, engine):
        state, _ = e.rollout(e.init(jax.random.key(1)))
        state, metrics = e.update_dataset(state)
        assert float(metrics[KEY]) == SCALE
        if e is engine:
            # update_dataset places nothing: what was offloaded stays offloaded around it.
            assert kinds(state) == {p: {"pinned_host"} for p in OFFLOADED}
            assert {x.sharding.memory_kind for x in jax.tree.leaves(state.batch)} == {"device"}
        fused, fused_metrics = e.epoch(e.init(jax.random.key(1)))
        if e is engine:
            assert kinds(fused) == {p: {"pinned_host"} for p in OFFLOADED}
        results.append(jax.device_get((key_data(state), key_data(fused), fused_metrics)))
    assert leaves_equal(results[0], results[1])  # same values, other memory kinds


def test_a_custom_phase_reading_offloaded_params_reloads_them_with_hooks(tmp_path):
    """Offload placement follows the phase's name: during `update_dataset` the learner params
    stay in host memory (the default phase does not read them). A replacement that does read
    them reloads them with the public placement hooks, and offloads them again after."""

    def with_param_norm(algo, scale):
        inner = reward_scaled(algo, scale)

        def update_dataset(state):
            state, metrics = inner(state)
            return state, {
                **metrics,
                "update_dataset/param_norm": optax.tree.norm(state.train.params),
            }

        return update_dataset

    mesh = data_mesh()
    params = ("train.params",)
    hooks = {"update_dataset": [jre.reload_before(params, mesh), jre.offload_after(params, mesh)]}
    cfg = small_config("offload=true", tmp_path=tmp_path)
    engine = build_custom(cfg, factory=with_param_norm, mesh=mesh, hooks=hooks)
    state = engine.init(jax.random.key(0))
    expected = float(optax.tree.norm(jax.device_get(state.train.params)))
    state, metrics = engine.update_dataset(state)
    assert float(metrics["update_dataset/param_norm"]) == pytest.approx(expected, rel=1e-6)
    assert float(metrics[KEY]) == SCALE
    assert kinds(state) == {p: {"pinned_host"} for p in OFFLOADED}


# (f) -------------------------------------------------------------------------------------------
def test_an_unknown_phase_name_is_a_value_error_naming_it(engines, tmp_path):
    plain, _ = engines
    cfg = small_config(tmp_path=tmp_path)
    phase = reward_scaled(plain.algo, SCALE)
    with pytest.raises(ValueError, match=r"unknown phase\(s\) \['update_datasets'\]"):
        jre.build(cfg, env=plain.env, algorithm=plain.algo, phases={"update_datasets": phase})
    with pytest.raises(ValueError, match=r"'updatedataset'.*'update_dataset'"):
        jre.Engine(
            plain.env,
            plain.algo,
            num_envs=4,
            num_steps=16,
            num_epochs=1,
            phases={"updatedataset": phase},
        )


# (g) -------------------------------------------------------------------------------------------
def test_warm_up_compiles_the_custom_phase_and_profile_times_it(engines, tmp_path):
    engine, _ = engines
    state = engine.warm_up(engine.init(jax.random.key(0)), phases=[*EPOCH_PHASES, "evaluate"])
    assert engine.compiled("update_dataset")
    report = engine.compile_report["update_dataset"]
    assert report["compile_s"] > 0 and report["output_bytes"] > 0
    rolled, _ = engine.call("rollout", state)
    _, metrics = engine.call("update_dataset", rolled)  # warm_up's executable: the custom phase
    assert float(metrics[KEY]) == SCALE

    # A profiling driver (one timed call per phase) runs what warm_up compiled.
    profile = jre.Driver(small_config("profile=true", tmp_path=tmp_path))
    _, summary = profile.run(engine, engine.init(jax.random.key(0)), run_dir=tmp_path / "run")
    assert [r[KEY] for r in summary["records"]] == [SCALE] * 4
    table = engine.timing_summary(echo=False)
    rows = {line.split()[0]: line.split()[1:] for line in table.splitlines()[1:]}
    assert rows["update_dataset"][0] == "4"
