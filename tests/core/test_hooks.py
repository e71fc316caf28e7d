"""Hooks: `chain` order, `every` cadence, user hooks, `nan_guard` errors, `timed` and the table."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxrl_engine as jre
from tests.conftest import SMALL, small_config


def recording(name: str, log: list[str]) -> jre.Hook:
    """A hook that logs its before/after work around the phase it wraps."""

    def transform(phase):
        def wrapped(state):
            log.append(f"{name}:before")
            state, metrics = phase(state)
            log.append(f"{name}:after")
            return state, {**metrics, name: len(log)}

        return wrapped

    return transform


def test_chain_wraps_first_hook_innermost():
    def run(compose) -> tuple[list[str], tuple]:
        log: list[str] = []

        def phase(state):
            log.append("phase")
            return state + 1, {}

        out = compose(recording("a", log), recording("b", log))(phase)(0)
        return log, out

    log, out = run(lambda a, b: jre.chain(a, b))
    assert log == ["b:before", "a:before", "phase", "a:after", "b:after"]
    assert out == (1, {"a": 4, "b": 5})
    assert run(lambda a, b: lambda phase: b(a(phase))) == (log, out)


def test_empty_chain_is_the_identity():
    def phase(state):
        return state * 2, {"x": 1}

    assert jre.chain()(phase)(3) == (6, {"x": 1})


def marked(phase):
    """Adds `train/marked` = 1.0: whether the hook ran this epoch (and an int metric)."""

    def wrapped(state):
        state, metrics = phase(state)
        return state, {**metrics, "train/marked": jnp.float32(1.0), "train/sevens": jnp.int32(7)}

    return wrapped


@pytest.mark.parametrize("n", [0, -2, 2.5, True, "2"])
def test_every_refuses_a_period_that_is_not_a_whole_number_of_epochs(n):
    with pytest.raises(ValueError, match=rf"every\(n={n!r}, \.\.\.\): n is a whole number"):
        jre.every(n, lambda phase: phase)
    with pytest.raises(TypeError, match="hook is 3"):
        jre.every(2, 3)


def two_args(phase, extra):
    return phase


def loss_as_int(phase):
    def wrapped(state):
        state, metrics = phase(state)
        return state, {**metrics, "train/loss": jnp.int32(1)}

    return wrapped


def test_a_hook_of_another_signature_or_changing_a_type_under_every_is_named(small_cfg):
    with pytest.raises(TypeError, match=r"hook two_args failed when given its phase: .*'extra'"):
        jre.build(small_cfg, hooks={"train": [two_args]})
    with pytest.raises(
        TypeError, match=r"every\(2, loss_as_int\): the hook changes the type .*'train/loss'"
    ):
        jre.build(small_cfg, hooks={"train": [jre.every(2, loss_as_int)]})


def test_every_applies_the_hook_only_on_epochs_divisible_by_n(small_cfg):
    engine = jre.build(small_cfg, hooks={"train": [jre.every(2, marked)]})
    state = engine.init(jax.random.key(0))
    seen = []
    for _ in range(4):
        counter = int(state.counters.epoch)  # `train` sees the epoch before sync_weights adds 1
        state, metrics = engine.epoch(state)
        seen.append((counter, float(metrics["train/marked"])))
        assert np.isfinite(float(metrics["train/loss"]))  # the phase itself runs every epoch
    assert [c for c, _ in seen] == [0, 1, 2, 3]
    assert [v == 1.0 for _, v in seen] == [True, False, True, False]
    assert all(np.isnan(v) for c, v in seen if c % 2)
    # An int metric of the hook's: NaN on the skipped epochs too (as float32), not -2**31.
    assert metrics["train/sevens"].dtype == jnp.float32 and np.isnan(metrics["train/sevens"])


def test_every_padding_does_not_trip_nan_guard_in_the_driver(small_cfg, tmp_path):
    """`every` pads its metrics with NaN on skipped epochs; that is not a non-finite failure."""
    assert small_cfg.nan_guard
    engine = jre.build(small_cfg, hooks={"train": [jre.every(2, marked)]})
    _, history_summary = engine.run(engine.init(jax.random.key(0)), run_dir=tmp_path)
    history = history_summary["records"]
    assert [r["epoch"] for r in history] == [1, 2, 3, 4]
    assert [r["train/marked"] == 1.0 for r in history] == [True, False, True, False]
    assert history[0]["train/sevens"] == 7 and np.isnan(history[1]["train/sevens"])


def param_norm(phase):
    """A user hook in a few lines: the global norm of the params after the phase."""

    def wrapped(state):
        state, metrics = phase(state)
        return state, {**metrics, "train/param_norm": optax.tree.norm(state.train.params)}

    return wrapped


def test_user_hook_metric_shows_up_in_epoch_metrics_and_run_history(small_cfg, tmp_path):
    engine = jre.build(small_cfg, hooks={"train": [param_norm]})
    state, metrics = engine.epoch(engine.init(jax.random.key(0)))
    expected = float(optax.tree.norm(state.train.params))
    np.testing.assert_allclose(float(metrics["train/param_norm"]), expected, rtol=1e-5)

    _, history_summary = engine.run(state, run_dir=tmp_path)
    history = history_summary["records"]
    assert all(r["train/param_norm"] > 0 for r in history)
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all("train/param_norm" in r for r in logged)


def poison_obs_at_epoch_3(phase):
    """Feeds the rollout of the third epoch (counter 2) NaN observations."""

    def wrapped(state):
        obs = jnp.where(state.counters.epoch == 2, jnp.nan, state.env.obs)
        return phase(state.replace(env=state.env.replace(obs=obs)))

    return wrapped


def test_nan_guard_stops_the_run_naming_phase_quantity_and_epoch(small_cfg, tmp_path):
    engine = jre.build(small_cfg, hooks={"rollout": [poison_obs_at_epoch_3]})
    assert engine.num_epochs == 4
    # The NaN observations reach the values the rollout stored; GAE is the first non-finite
    # quantity the engine computes from them. Epochs count from 1, as in metrics.jsonl.
    with pytest.raises(jre.NonFiniteError, match=r"phase 'update_dataset'.*epoch 3") as info:
        engine.run(engine.init(jax.random.key(0)), run_dir=tmp_path)
    assert info.value.phase == "update_dataset"
    assert info.value.quantity.startswith("update_dataset/")
    assert info.value.epoch == 3
    logged = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(logged) == 2  # the epochs before the failure are kept


def test_nan_guard_off_lets_the_same_run_finish(tmp_path):
    cfg = small_config("nan_guard=false", tmp_path=tmp_path)
    engine = jre.build(cfg, hooks={"rollout": [poison_obs_at_epoch_3]})
    _, history_summary = engine.run(engine.init(jax.random.key(0)), run_dir=tmp_path)
    history = history_summary["records"]
    assert len(history) == 4


def test_a_finite_run_does_not_trace_its_phases_for_the_guard_names(small_cfg, tmp_path):
    """The names behind a guard index are found (by tracing the phase) only when the guard
    fires: a run that stays finite pays nothing for them in its train_s; a fired guard still
    names its quantity (the test above)."""
    engine = jre.build(small_cfg)
    traced: list[str] = []
    names = engine.guarded_names
    trace = names._trace
    names._trace = lambda phase: traced.append(phase) or trace(phase)
    engine.run(engine.init(jax.random.key(0)), run_dir=tmp_path)
    assert traced == []
    assert "update_dataset/advantage_mean" in names["update_dataset"]
    assert traced == ["update_dataset"]  # (the guard's own phase first)
    assert set(names) == {"rollout", "update_dataset", "train", "sync_weights", "evaluate"}


def poison_metric(phase):
    def wrapped(state):
        state, metrics = phase(state)
        bad = jnp.where(state.counters.epoch == 2, jnp.nan, 1.0)
        return state, {**metrics, "train/mine": bad}

    return wrapped


@pytest.mark.parametrize("engine_guard", ["true", "false"])
def test_a_users_own_nan_guard_stops_the_run_naming_its_quantity(engine_guard, tmp_path):
    """A `nan_guard` of the user's (any name) is checked by the driver like the engine's,
    whether or not the engine installs its own (`nan_guard: false`)."""
    cfg = small_config(f"nan_guard={engine_guard}", tmp_path=tmp_path)
    hooks = {"train": [jre.chain(poison_metric, jre.nan_guard("mine"))]}
    engine = jre.build(cfg, hooks=hooks)
    with pytest.raises(jre.NonFiniteError) as info:
        engine.run(engine.init(jax.random.key(0)), run_dir=tmp_path)
    error = info.value
    assert (error.phase, error.guard, error.quantity, error.epoch) == (
        "train",
        "mine",
        "train/mine",
        3,
    )
    assert "in phase 'train' (nan_guard 'mine'), quantity 'train/mine', epoch 3" in str(error)
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2


def test_a_users_nan_guard_skips_what_is_nan_by_meaning(tmp_path):
    """Episode statistics before the first episode ends, and an off-policy train phase's
    metrics while it idles before `learning_starts`, are NaN by meaning, for a guard of the
    user's as for the engine's."""
    dqn = ["algo.name=dqn", "algo.learning_starts=128", "algo.buffer_size=512"]
    small = [o for o in SMALL if o not in ("algo.num_minibatches=2", "algo.update_epochs=2")]
    cfg = jre.load_config(None, [*small, *dqn, "loggers=[jsonl]", f"run_dir={tmp_path}"])
    hooks = {name: [jre.nan_guard(f"mine_{name}")] for name in ("rollout", "train")}
    engine = jre.build(cfg, hooks=hooks)
    _, summary = engine.run(engine.init(jax.random.key(0)))
    assert summary["status"] == "completed"
    assert np.isnan(summary["records"][0]["train/loss"])  # (idle: NaN, logged as null)


def test_a_guard_name_on_evaluate_and_an_epoch_phase_is_refused_and_every_pads_guards(
    tmp_path,
):
    """Evaluation's metrics join the epoch's last record: one guard name on both would hide
    a fired guard. Under `every`, a guard's skipped epochs read -1 (found nothing)."""
    cfg = small_config("nan_guard=false", "loggers=[jsonl]", tmp_path=tmp_path)
    with pytest.raises(ValueError, match="'mine' guards the evaluate phase and a phase of"):
        jre.build(cfg, hooks={name: [jre.nan_guard("mine")] for name in ("train", "evaluate")})
    engine = jre.build(cfg, hooks={"train": [jre.every(2, jre.nan_guard("mine"))]})
    state = engine.init(jax.random.key(0))
    for _ in range(2):  # (epoch 1 guarded, epoch 2 skipped)
        state, metrics = engine.epoch(state)
        assert int(metrics["guard/mine"]) == -1


def test_an_evaluate_hooks_metric_of_an_epoch_phases_name_is_refused(small_cfg):
    """The evaluation's metrics join the epoch's record (and `make_train`'s per-epoch arrays):
    an evaluate hook returning `train/loss` would replace the epoch's losses there."""

    def loss_too(phase):
        def hooked(state):
            state, metrics = phase(state)
            return state, {**metrics, "train/loss": jnp.float32(-1.0)}

        return hooked

    with pytest.raises(ValueError, match=r"phase 'evaluate' returns metric 'train/loss'.*prefix"):
        jre.build(small_cfg, hooks={"evaluate": [loss_too]})


def test_a_users_nan_guard_of_the_engines_name_is_refused(small_cfg):
    with pytest.raises(ValueError, match=r"already reports 'guard/train'.*another name"):
        jre.build(small_cfg, hooks={"train": [jre.nan_guard("train")]})  # (traced at build)


def test_timed_records_count_total_and_average():
    timer = jre.Timer()

    def phase(state):
        time.sleep(0.02)
        return state, {}

    timed_phase = jre.timed("slow", timer)(phase)
    for _ in range(3):
        assert timed_phase(jnp.ones(2))[1] == {}
    summary = timer.summary()["slow"]
    assert summary["count"] == 3
    assert summary["total_s"] >= 3 * 0.02
    assert summary["avg_s"] == pytest.approx(summary["total_s"] / 3)


def test_timed_waits_for_the_device_result():
    timer = jre.Timer()
    x = jnp.ones((1500, 1500)) / 1500  # idempotent under matmul: no overflow
    work = jax.jit(lambda s: (jnp.linalg.matrix_power(s, 16), {}))
    jax.block_until_ready(work(x))  # compile outside the timer
    out, _ = jre.timed("work", timer)(work)(x)
    assert out.is_ready()  # timed returned only once the (async) device work finished


def test_timing_summary_lists_every_phase(small_cfg, capsys):
    engine = jre.build(small_cfg)
    state = engine.init(jax.random.key(0))
    names = ("rollout", "update_dataset", "train", "sync_weights", "evaluate")
    for name in names:
        state, _ = engine.timed_call(name, state)
    table = engine.timing_summary(echo=False)
    assert capsys.readouterr().out == ""
    lines = table.splitlines()
    assert "count" in lines[0] and "total" in lines[0] and "avg" in lines[0]
    for name in names:
        (row,) = [line for line in lines if line.split()[0] == name]
        assert row.split()[1] == "1"
    assert engine.timing_summary() is None  # printed only (a notebook shows it once)
    assert capsys.readouterr().out.strip() == table


def test_nan_guard_index_names_the_first_non_finite_quantity():
    """`guard/<phase>` is the index (in `guarded_quantities` order: sorted metrics, then the
    state paths) of the first quantity holding a NaN/Inf; integer and empty values are skipped."""
    from jaxrl_engine.core.nan_guard import guarded_quantities, nan_guard
    from jaxrl_engine.core.state import Counters

    def phase_with(metrics, obs):
        def phase(state):
            return state, metrics

        state = SimpleNamespace(env=SimpleNamespace(obs=obs), counters=Counters.zeros())
        names = guarded_quantities(list(metrics), ("env.obs",))
        _, out = nan_guard("p", ("env.obs",))(phase)(state)
        index = int(out["guard/p"])
        return names[index] if index >= 0 else None

    finite = jnp.ones((3, 2))
    metrics = {
        "a": jnp.float32(1.0),
        "b": jnp.int32(3),
        "c": jnp.array([1.0, jnp.nan]),
        "d": jnp.zeros((0,)),
        "e": jnp.float32(jnp.inf),
    }
    assert phase_with(metrics, finite) == "c"
    assert phase_with({**metrics, "c": jnp.ones(2)}, finite) == "e"
    clean = {**metrics, "c": jnp.ones(2), "e": jnp.float32(0.0)}
    assert phase_with(clean, finite) is None
    assert phase_with(clean, finite.at[2, 1].set(-jnp.inf)) == "env.obs"
    assert phase_with({"n": jnp.int32(1)}, finite.astype(jnp.int32)) is None


@pytest.mark.parametrize("learning, flagged", [(1.0, 1), (0.0, -1)])
def test_an_idle_phases_nan_metrics_are_not_flagged_and_a_working_ones_are(learning, flagged):
    """`train/learning` 0 (off-policy warm-up: nothing computed) makes the other train
    metrics NaN by meaning; once it is 1 a NaN loss is the guard's to report."""
    from jaxrl_engine.core.nan_guard import nan_guard

    def phase(state):
        return state, {"train/learning": jnp.float32(learning), "train/loss": jnp.float32("nan")}

    _, metrics = jax.jit(nan_guard("train")(phase))(jnp.zeros(()))
    assert int(metrics["guard/train"]) == flagged  # 1: "train/loss", after "train/learning"
