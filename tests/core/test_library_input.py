"""Bad input in library calls: each is refused before anything is compiled or written, with an
error naming the argument (or the phase, the metric, the field) at fault."""

from __future__ import annotations

import json
import warnings
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_engine as jre
from jaxrl_engine.export.policy import ExportError
from tests.conftest import SMALL


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("library_input")
    cfg = jre.load_config(None, [*SMALL, f"run_dir={root}", "name=r"])
    engine = jre.build(cfg)
    return cfg, engine, engine.init(jax.random.key(0)), root


def engine_with(cfg, engine, hooks):
    """`engine` with `hooks`, built without the build's own trace of the hooked epoch (which
    raises the same errors: the tests trace it themselves)."""
    with mock.patch.object(jre.Engine, "_placed_as_the_epoch_leaves_it", lambda self, s: s):
        return jre.build(cfg, env=engine.env, algorithm=engine.algo, hooks=hooks)


def test_with_hparams_refuses_a_value_of_another_shape_than_the_states(built):
    _, engine, state, _ = built
    wide = engine.hparams.replace(gamma=jnp.full((4,), 0.9))  # would broadcast over 4 envs
    with pytest.raises(ValueError, match=r"with_hparams: hparams\.gamma has shape \(4,\), the "):
        engine.with_hparams(state, wide)
    same = engine.with_hparams(state, engine.hparams.replace(gamma=0.5))
    assert float(same.hparams.gamma) == 0.5


@pytest.mark.parametrize(
    "num_epochs, error, match",
    [
        (5, ValueError, r"num_epochs=5 is not within 1\.\.4"),
        (0, ValueError, r"num_epochs=0 is not within"),
        (-3, ValueError, r"num_epochs=-3 is not within"),
        ("5", TypeError, r"num_epochs='5': give a whole number"),
        (2.0, TypeError, r"num_epochs=2\.0"),
        (True, TypeError, r"num_epochs=True"),
    ],
)
def test_run_refuses_num_epochs_outside_the_configs_epochs(built, num_epochs, error, match):
    _, engine, state, root = built
    assert engine.num_epochs == 4
    with pytest.raises(error, match=match):
        engine.run(state, num_epochs=num_epochs)
    assert not (root / "r").exists()  # refused before the run directory was made


def test_run_refuses_num_epochs_before_the_states_epoch_and_a_run_dir_not_a_path(built):
    _, engine, state, root = built
    later = state.replace(counters=state.counters.replace(epoch=jnp.int32(3)))
    with pytest.raises(ValueError, match=r"num_epochs=2 is before the state's epoch 3"):
        engine.run(later, num_epochs=2)
    with pytest.raises(TypeError, match=r"run_dir=5 is not a path"):
        engine.run(state, run_dir=5)
    assert not (root / "r").exists()


def test_a_sweep_refuses_num_epochs_before_its_directory_is_made(built):
    cfg, _, _, root = built
    with pytest.raises(ValueError, match=r"sweep: num_epochs=99 is not within 1\.\.4"):
        jre.sweep(cfg.model_copy(update={"name": "sw"}), seeds=[0, 1], num_epochs=99)
    assert not (root / "sw").exists()


def test_a_non_scalar_metric_is_refused_when_traced_naming_the_phase_and_key(built):
    cfg, engine, state, _ = built

    def per_layer(phase):
        def hooked(s):
            s, metrics = phase(s)
            return s, {**metrics, "train/per_layer": jnp.arange(3.0)}

        return hooked

    with pytest.raises(ValueError, match=r"phase 'train': metric 'train/per_layer' has shape"):
        jax.eval_shape(engine_with(cfg, engine, {"train": [per_layer]}).pure_epoch, state)


def test_a_metric_key_two_phases_return_is_named_not_overwritten(built):
    cfg, engine, state, _ = built

    def loss_in_rollout(phase):  # PPO's train phase returns "train/loss" too
        def hooked(s):
            s, metrics = phase(s)
            return s, {**metrics, "train/loss": jnp.float32(0.0)}

        return hooked

    message = r"phase 'train' returned metric 'train/loss', which an earlier phase"
    with pytest.raises(ValueError, match=message):
        jax.eval_shape(engine_with(cfg, engine, {"rollout": [loss_in_rollout]}).pure_epoch, state)
    with pytest.raises(ValueError, match=message):  # (the build traces a hooked epoch)
        jre.build(cfg, env=engine.env, algorithm=engine.algo, hooks={"rollout": [loss_in_rollout]})


def test_a_replaced_phase_that_changes_the_states_shapes_is_named(built):
    cfg, engine, _, _ = built

    def sync_weights(s):  # doubles every acting param
        doubled = jax.tree.map(lambda x: jnp.concatenate([x, x]) if x.ndim else x, s.eval_params)
        return s.replace(eval_params=doubled), {}

    # Named at build (which traces the epoch of an engine with the user's phases or hooks,
    # for the metric names evaluation shares with it), not as 'epochs failed to compile'
    with pytest.raises(ValueError, match=r"phase 'sync_weights' returned state\.eval_params"):
        jre.build(cfg, env=engine.env, algorithm=engine.algo, phases={"sync_weights": sync_weights})


def test_a_replaced_phase_of_another_signature_is_refused_at_build(built):
    cfg, engine, _, _ = built
    for phase, said in [
        (lambda state, extra: (state, {}), r"cannot be called with the state alone"),
        (lambda: None, r"cannot be called with the state alone"),
        ("update", r"is 'update': a phase is a function"),
    ]:
        with pytest.raises(TypeError, match=rf"phases\['update_dataset'\].*{said}"):
            jre.build(cfg, env=engine.env, algorithm=engine.algo, phases={"update_dataset": phase})
    ok = jre.build(  # (extra arguments with defaults, and *args, are fine)
        cfg,
        env=engine.env,
        algorithm=engine.algo,
        phases={"update_dataset": lambda s, k=1: (s, {})},
    )
    assert ok.raw_phases["update_dataset"] is not None


def test_a_policy_names_the_observation_shape_it_takes(built):
    _, engine, state, _ = built
    policy = jre.make_policy((engine, state))
    with pytest.raises(ValueError, match=r"obs has shape \[4\], this policy takes \[batch, 4\] "):
        policy(jnp.zeros((4,)))
    with pytest.raises(
        ValueError, match=r"obs has shape \[1, 5\], this policy takes \[batch, 4\]$"
    ):
        policy(jnp.zeros((1, 5)))
    assert np.asarray(policy([[0.0, 0.0, 0.0, 0.0]])).shape == (1,)  # a list is an array
    assert np.asarray(jax.jit(policy)(jnp.zeros((3, 4)))).shape == (3,)


def test_arguments_of_the_wrong_kind_are_named(built):
    cfg, engine, state, _ = built
    with pytest.raises(TypeError, match=r"build: cfg is a dict; give a Config: jre.load_config"):
        jre.build({"name": "x"})
    with pytest.raises(TypeError, match=r"build: cfg is a str"):
        jre.build("configs/ppo_cartpole.yaml")
    some = {"env": engine.env, "algorithm": engine.algo}
    with pytest.raises(TypeError, match=r"hooks\['train'\] is a function: give a list"):
        jre.build(cfg, **some, hooks={"train": lambda phase: phase})
    with pytest.raises(TypeError, match=r"hooks\['train'\]\[0\] is 3: a hook is a function"):
        jre.build(cfg, **some, hooks={"train": [3]})
    with pytest.raises(TypeError, match=r"host_hooks\[0\] is a object: a host hook is"):
        jre.build(cfg, **some, host_hooks=[object()])
    with pytest.raises(TypeError, match=r"host_hooks is a HostHook: give a list"):
        jre.build(cfg, **some, host_hooks=jre.HostHook())
    with pytest.raises(jre.ConfigError, match=r"grid key 'algo.lr': 0.001 is not a list"):
        jre.sweep(cfg, seeds=[0], grid={"algo.lr": 1e-3})
    with pytest.raises(TypeError, match=r"engine.epochs\(state, n\): n=1.5 is not a whole"):
        engine.epochs(state, 1.5)
    with pytest.raises(ValueError, match=r"n=-1 epochs; give 0 or more"):
        engine.epochs(state, -1)
    with pytest.raises(TypeError, match=r"make_policy: source is an \(engine, state\) pair"):
        jre.make_policy((1, 2))
    with pytest.raises(TypeError, match=r"engine.init: key is int \(\); give a PRNG key"):
        engine.init(0)
    assert engine.init(jax.random.PRNGKey(0)).counters.epoch == 0  # a raw key is a key


def test_a_hand_built_engine_and_a_config_that_does_not_describe_it_are_refused(built, tmp_path):
    cfg, engine, _, _ = built
    other = jre.Engine(
        engine.env,
        engine.algo,
        num_envs=8,  # the config says 4
        num_steps=16,
        num_epochs=4,
        eval_interval=2,
        driver=jre.Driver(cfg),
    )
    with pytest.raises(jre.ConfigError, match=r"env.num_envs: 4 in the config, 8 in the engine"):
        other.run(other.init(jax.random.key(0)), run_dir=tmp_path / "hand")
    assert not (tmp_path / "hand").exists()


def test_resume_and_make_policy_of_a_sweeps_directory_name_the_sweep(tmp_path):
    sweep = tmp_path / "sw"
    (sweep / "seed0").mkdir(parents=True)
    (sweep / "seed0" / "metrics.jsonl").write_text("")
    (sweep / "checkpoints" / "group0").mkdir(parents=True)
    (sweep / "sweep.json").write_text(json.dumps({"members": ["seed0"]}))
    (sweep / "sweep.csv").write_text("member,seed\nseed0,0\n")
    with pytest.raises(jre.CheckpointError, match=r"it is a sweep's directory.*resume_sweep"):
        jre.resume(sweep)
    with pytest.raises(ExportError, match=rf"sweep's directory: make_policy takes .* e.g. {sweep}"):
        jre.make_policy(sweep)


def test_resume_of_a_run_stopped_before_its_first_checkpoint_says_to_start_it_again(tmp_path):
    (tmp_path / "k" / "checkpoints").mkdir(parents=True)  # killed before its first save
    with pytest.raises(jre.CheckpointError, match=r"stopped before its first checkpoint.*again"):
        jre.resume(tmp_path / "k")


def test_an_algorithm_of_the_users_own_name_trains_and_its_run_asks_for_it_back(built, tmp_path):
    """`jre.build(cfg, algorithm=...)` with an algorithm no config can name trains through
    `engine.run`; its checkpoints and exported policy record the name, so `resume` and
    `make_policy` of the run ask for the algorithm instead of rebuilding the config's."""
    cfg, engine, _, _ = built
    mine = engine.algo._replace(name="my_ppo")
    cfg = cfg.model_copy(update={"run_dir": str(tmp_path), "name": "mine"})
    own = jre.build(cfg, env=engine.env, algorithm=mine)
    state, summary = own.run(own.init(jax.random.key(0)))
    assert summary["status"] == "completed"
    run = tmp_path / "mine"
    with pytest.raises(jre.CheckpointError, match=r"algorithm 'my_ppo' \(one given to jre.build"):
        jre.resume(run)
    again, restored = jre.resume(run, env=engine.env, algorithm=mine)
    assert int(restored.counters.epoch) == int(state.counters.epoch)
    obs = jnp.zeros((3, *engine.spec.obs_shape))
    exported = jre.make_policy(run)  # the exported graph: nothing rebuilt from config.yaml
    np.testing.assert_array_equal(exported(obs), jre.make_policy((again, restored))(obs))
    with pytest.raises(ExportError, match=r"algorithm 'my_ppo' given to jre.build"):
        jre.make_policy(run, deterministic=False)


def test_a_host_hook_that_raises_leaves_a_failed_summary_beside_the_checkpoints(built, tmp_path):
    cfg, engine, _, _ = built

    class Boom(jre.HostHook):
        def on_records(self, run, records):
            if records[-1]["epoch"] >= 3:
                raise RuntimeError("my hook broke\nsecond line")

    cfg = cfg.model_copy(update={"run_dir": str(tmp_path), "name": "boom", "save_interval": 2})
    hooked = jre.Engine(
        engine.env,
        engine.algo,
        num_envs=cfg.env.num_envs,
        num_steps=cfg.algo.num_steps,
        num_epochs=engine.num_epochs,
        eval_interval=engine.eval_interval,
        eval_envs=cfg.eval.num_envs,
        driver=jre.Driver(cfg, host_hooks=[Boom()]),
    )
    with pytest.raises(RuntimeError, match="my hook broke"):
        hooked.run(hooked.init(jax.random.key(0)))
    summary = json.loads((tmp_path / "boom" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"] == "RuntimeError: my hook broke"
    assert summary["checkpoint"].endswith("epoch_2")  # the last good one, left as it was
    assert (tmp_path / "boom" / "metrics.jsonl").read_text().count("\n") >= 2


def test_a_keyboard_interrupt_from_on_epoch_stops_the_run_as_sigint_does(built, tmp_path):
    engine = built[1]

    def stop_at_1(record):  # a notebook user's way to stop a run from its own code
        if record["epoch"] >= 1:
            raise KeyboardInterrupt("enough")

    with pytest.raises(jre.TrainingInterrupted) as stopped:
        engine.run(engine.init(jax.random.key(0)), run_dir=tmp_path / "stop", on_epoch=stop_at_1)
    state = stopped.value.state
    # The chunk of epochs 1-2 (eval.interval=2) ran: the state after it, not a donated one.
    assert int(state.counters.epoch) == 2 and engine.num_epochs == 4
    summary = json.loads((tmp_path / "stop" / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["epochs"] == 2
    assert summary["final_eval_epoch"] == 2  # (eval.interval=2), not the run's last epoch, 4
    assert summary["checkpoint"].endswith("epoch_2")
    _, restored = jre.resume(tmp_path / "stop")
    assert int(restored.counters.epoch) == 2
    lines = (tmp_path / "stop" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [1, 2]


def test_a_keyboard_interrupt_inside_a_chunk_is_a_failure_keeping_the_checkpoints(
    built, tmp_path, monkeypatch
):
    engine = built[1]
    chunk = jre.Driver._chunk

    def interrupted_after_compiled_call(self, engine, state, run, hooks, stop=None):
        out = chunk(self, engine, state, run, hooks, stop)  # (donates `state`)
        if run.done >= 4:
            raise KeyboardInterrupt
        return out

    monkeypatch.setattr(jre.Driver, "_chunk", interrupted_after_compiled_call)
    with pytest.raises(KeyboardInterrupt) as stopped:
        engine.run(engine.init(jax.random.key(0)), run_dir=tmp_path / "lost")
    assert not isinstance(stopped.value, jre.TrainingInterrupted)  # no state to give back
    summary = json.loads((tmp_path / "lost" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"] == "KeyboardInterrupt"
    lines = (tmp_path / "lost" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [1, 2]  # the chunk before it


def test_a_host_hook_method_named_almost_as_the_drivers_is_warned_about(built):
    cfg = built[0]

    class Typo(jre.HostHook):
        def on_record(self, run, records):  # (on_records)
            pass

        def my_helper(self):
            pass

    with pytest.warns(UserWarning, match=r"method 'on_record'.*did you mean 'on_records'"):
        jre.Driver(cfg, host_hooks=[Typo()])

    class Fine(jre.HostHook):  # names like the driver's that are not hook methods
        records: list = []  # noqa: RUF012

        def closed(self):
            pass

        def restart(self):
            pass

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jre.Driver(cfg, host_hooks=[Fine()])


def test_a_hook_that_returns_no_phase_and_a_phase_with_list_metrics_are_named(built):
    cfg, engine, state, _ = built

    def my_phase(s):  # a phase, given where a hook belongs
        return s, {}

    for hook, name in ((my_phase, "my_phase"), (lambda phase: None, "<lambda>")):
        with pytest.raises(TypeError, match=rf"hook {name} returned \w+, not a phase"):
            jre.build(cfg, env=engine.env, algorithm=engine.algo, hooks={"train": [hook]})

    def listed(phase):
        return lambda s: (phase(s)[0], [1.0])

    with pytest.raises(ValueError, match=r"phase 'train' returned \(state, list\): its metrics"):
        jax.eval_shape(engine_with(cfg, engine, {"train": [listed]}).pure_epoch, state)


def test_a_policy_whose_actions_the_env_cannot_take_is_refused_at_build(built):
    cfg, engine, _, _ = built
    algo = engine.algo

    def floats(params, obs, key, deterministic):
        action, extras = algo.act(params, obs, key, deterministic)
        return action.astype(jnp.float32), extras

    def column(params, obs, key, deterministic):
        action, extras = algo.act(params, obs, key, deterministic)
        return action[:, None], extras

    for act, message in (
        (floats, r"returns float32 actions but the env's are discrete"),
        (column, r"returns actions of shape \(4, 1\) but the env takes \(4,\)"),
    ):
        with pytest.raises(jre.ShapeMismatchError, match=message):
            jre.build(cfg, env=engine.env, algorithm=algo._replace(act=act))


def test_a_bundle_function_failing_while_traced_is_named_by_its_phase(built):
    cfg, engine, _, _ = built
    algo = engine.algo

    def update_dataset(train_state, buffer, key, hparams):  # two values, not three
        return algo.update_dataset(train_state, buffer, key, hparams)[:2]

    bad = jre.build(cfg, env=engine.env, algorithm=algo._replace(update_dataset=update_dataset))
    with pytest.raises(jre.ShapeMismatchError, match=r"raised in phase 'update_da"):
        bad.warm_up(bad.init(jax.random.key(0)), phases=["epochs"])


def test_make_train_checks_its_key_and_hparams_when_traced(built):
    # Inside the user's jit they are tracers: checked by shape and dtype, named as train's.
    cfg = built[0]
    train = jre.make_train(cfg)
    hp = jre.hparams(cfg)
    with pytest.raises(TypeError, match=r"train\(key, hparams\): key is int32\[\]; give a PRNG"):
        jax.eval_shape(train, 0)
    with pytest.raises(ValueError, match=r"hparams\.lr has shape \(2,\): one setting takes"):
        jax.eval_shape(train, jax.random.key(0), hp.replace(lr=jnp.ones(2)))
    with pytest.raises(ValueError, match=r"hparams must be a PPOHParams .* not a dict"):
        jax.eval_shape(train, jax.random.key(0), {"lr": 1.0})
    keys = jax.vmap(jax.random.key)(jnp.arange(2))
    stacked = jax.tree.map(lambda x: jnp.full((2,), x, jnp.float32), hp)
    _, metrics = jax.eval_shape(jax.vmap(train), keys, stacked)  # one setting per member
    assert metrics["train/loss"].shape[0] == 2
    jax.eval_shape(train, jax.random.PRNGKey(0))  # a raw key is a key


def test_epochs_moves_its_epoch_count_explicitly(built):
    # Under jax.transfer_guard("disallow") (a user making sure nothing syncs by accident) the
    # engine's own calls transfer nothing implicitly.
    _, engine, _, _ = built
    state = engine.init(jax.random.key(3))
    state = engine.warm_up(state)  # (compiling moves gymnax's numpy constants: not guarded)
    with jax.transfer_guard("disallow"):
        state, _ = engine.epoch(state)
        state, _, done = engine.epochs(state, 2)
    assert int(done) == 2


def test_init_compiles_once_for_the_default_and_a_users_hyperparameters(built):
    """`engine.init(key)` and `engine.init(key, hp.replace(lr=...))` share one compiled init
    (the default's Python floats become f32 as a user's do), and an integer given for a float
    hyperparameter is a float leaf in the state, through `init` and through `make_train`."""
    cfg, engine, _, _ = built
    engine.init(jax.random.key(1))
    before = engine._init_jit._cache_size()
    state = engine.init(jax.random.key(1), engine.hparams.replace(lr=2e-3, gamma=1))
    assert engine._init_jit._cache_size() == before
    assert state.hparams.gamma.dtype == jnp.float32
    train = jre.make_train(cfg)
    traced = jax.eval_shape(train, jax.random.key(0), jre.hparams(cfg).replace(gamma=1))[0]
    assert traced.hparams.gamma.dtype == jnp.float32


def test_a_hook_may_set_hparams_to_python_numbers_but_not_a_float_into_an_int(built):
    cfg, engine, _, _ = built

    def low_lr(phase):  # as `engine.with_hparams` takes them: plain numbers
        def wrapped(state):
            state, metrics = phase(state)
            return state.replace(hparams=state.hparams.replace(lr=1e-4, gamma=1)), metrics

        return wrapped

    hooked = jre.build(cfg, env=engine.env, algorithm=engine.algo, hooks={"train": [low_lr]})
    after, _ = hooked.epoch(hooked.init(jax.random.key(0)))
    assert after.hparams.lr.dtype == jnp.float32 and float(after.hparams.lr) == pytest.approx(1e-4)
    assert after.hparams.gamma.dtype == jnp.float32 and float(after.hparams.gamma) == 1.0

    def half_epoch(phase):
        def wrapped(state):
            state, metrics = phase(state)
            return state.replace(counters=state.counters.replace(epoch=1.5)), metrics

        return wrapped

    with pytest.raises(ValueError, match=r"phase 'train' returned state\.counters\.epoch as float"):
        jre.build(cfg, env=engine.env, algorithm=engine.algo, hooks={"train": [half_epoch]})


def test_a_python_int_in_an_algorithms_default_hparams_is_a_float_hyperparameter(built):
    # An algorithm of the user's declaring `gamma=1, ent_coef=0`: an int32 leaf would cast
    # every value given later (0.99 to 0)
    cfg, engine, _, _ = built
    algo = engine.algo._replace(hparams=engine.algo.hparams.replace(gamma=1, ent_coef=0))
    own = jre.build(cfg, env=engine.env, algorithm=algo)
    assert type(own.hparams.gamma) is float and own.hparams.gamma == 1.0
    state = own.init(jax.random.key(0), own.hparams.replace(gamma=0.99, ent_coef=0.01))
    assert state.hparams.gamma.dtype == jnp.float32
    assert float(state.hparams.gamma) == pytest.approx(0.99)
    assert float(state.hparams.ent_coef) == pytest.approx(0.01)
    again = own.with_hparams(state, own.hparams.replace(ent_coef=0.5))
    assert float(again.hparams.ent_coef) == 0.5


def test_a_replaced_sync_weights_that_does_not_count_epochs_fails_the_run_naming_it(
    built, tmp_path
):
    # (else: checkpoints all saved as epoch 0, every() and evaluation off their cadence)
    cfg, engine, _, _ = built

    def sync_weights(state):  # forgets `counters.epoch + 1`
        acting = engine.algo.acting_params(state.train, state.hparams)
        return state.replace(eval_params=acting), {}

    own = jre.build(
        cfg, env=engine.env, algorithm=engine.algo, phases={"sync_weights": sync_weights}
    )
    with pytest.raises(
        ValueError, match=r"after epochs 1\.\.2, state\.counters\.epoch is 0, not 2"
    ):
        own.run(own.init(jax.random.key(0)), run_dir=tmp_path / "uncounted")
    summary = json.loads((tmp_path / "uncounted" / "summary.json").read_text())
    assert summary["status"] == "failed" and "counters.epoch" in summary["error"]


def test_an_algorithm_returning_the_wrong_tuple_is_named_before_training(built):
    cfg, engine, _, _ = built
    algo = engine.algo

    def train(*args):  # (train_state, metrics, extra): one too many
        return (*algo.train(*args), 0)

    def update_dataset(*args):  # metrics forgotten
        return algo.update_dataset(*args)[:2]

    for method, wrong, returned in [
        ("train", {"train": train}, 3),
        ("update_dataset", {"update_dataset": update_dataset}, 2),
    ]:
        own = jre.build(cfg, env=engine.env, algorithm=algo._replace(**wrong))
        with pytest.raises(
            jre.ShapeMismatchError,
            match=rf"'ppo': its {method} returned a tuple of {returned}; Algorithm\.{method} ret",
        ):
            own.warm_up(own.init(jax.random.key(0)), phases=[method])
