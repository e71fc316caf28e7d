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
from tests.conftest import NaNRewardsFrom, small_config

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


DQN = ["algo.name=dqn", "algo.learning_starts=64", "algo.buffer_size=512"]
PPO_SMALL = ["algo.num_minibatches=2", "algo.update_epochs=2", "algo.hidden_sizes=[16,16]"]


@pytest.mark.parametrize("algo", [PPO_SMALL, DQN], ids=["ppo", "dqn"])
def test_an_overlapped_gymnax_run_resumes_exactly(algo, tmp_path):
    """The schedule drains at each chunk's end, so training 4 epochs equals training 2,
    stopping, and resuming for 2 more, bitwise (a JAX env's state is in the checkpoint)."""
    base = [
        "env.num_envs=4",
        "eval.num_envs=4",
        "eval.interval=2",
        "algo.num_steps=16",
        "progress=false",
        "save_interval=2",
        *OVERLAP,
        *algo,
        f"run_dir={tmp_path}",
    ]
    straight = jre.build(jre.load_config(None, [*base, "total_env_steps=256", "name=a"]))
    want, summary = straight.run(straight.init(jax.random.key(2)))
    assert summary["epochs"] == 4
    lags = [r["rollout/policy_lag"] for r in summary["records"]]
    assert lags == [0, 1, 0, 1]  # one lag per chunk start, then one version behind

    half = jre.build(jre.load_config(None, [*base, "total_env_steps=256", "name=b"]))
    half.run(half.init(jax.random.key(2)), num_epochs=2)  # (same schedules: lr, epsilon)
    engine, state = jre.resume(tmp_path / "b")
    got, summary = engine.run(state)
    assert summary["epochs"] == 4 and int(got.counters.epoch) == 4
    leaves_equal(got, want)


@pytest.mark.parametrize(
    "algo, said",
    [
        (DQN, "hooked rollout phase would not run"),
        # (the actor's copy of the state: `every` would fire on every rollout of a chunk)
        ([], "would see that chunk's counters and hyperparameters"),
    ],
)
def test_overlap_with_a_hooked_or_replaced_rollout_is_refused(tmp_path, algo, said):
    cfg = jre.load_config(None, ["total_env_steps=2048", *algo, *OVERLAP, f"run_dir={tmp_path}"])
    with pytest.raises(jre.ConfigError, match=said):
        jre.build(cfg, hooks={"rollout": [lambda phase: phase]})
    with pytest.raises(jre.ConfigError, match=said):
        jre.build(cfg, phases={"rollout": lambda state: (state, {})})
    jre.build(cfg, hooks={"train": [lambda phase: phase]})  # (the learner's phases: theirs)


def test_overlap_by_default_gives_way_to_a_hooked_rollout(tmp_path):
    """On by default for a host env with PPO; off (not refused) when the user hooks the
    rollout, which the actor could not run."""
    cfg = jre.load_config(None, ["env.suite=gymnasium", "loggers=[jsonl]", f"run_dir={tmp_path}"])
    assert jre.build(cfg).driver.overlap
    assert not jre.build(cfg, hooks={"rollout": [lambda phase: phase]}).driver.overlap


TWO_DEVICES = """
import json, jax, numpy as np
import jaxrl_engine as jre
from jaxrl_engine.core.sharding import data_mesh
from jaxrl_engine.run.overlap import Pipeline
base = ["env.num_envs=6", "eval.num_envs=6", "eval.interval=2", "algo.num_steps=16",
        "total_env_steps=384", "progress=false", "loggers=[jsonl]", "save_interval=2"]
algos = {"ppo": ["algo.hidden_sizes=[16,16]"],
         "dqn": ["algo.name=dqn", "algo.learning_starts=96", "algo.buffer_size=576"],
         "ppo_gym": ["algo.hidden_sizes=[16,16]", "env.suite=gymnasium"]}
d = jax.devices()
out = {}
def plain(s):
    return [np.asarray(x) for x in jax.tree.leaves(s.replace(rng=jax.random.key_data(s.rng)))]
for name, algo in algos.items():
    cfg = lambda *extra: jre.load_config(None, [*base, *algo, *extra])
    # By default the learner's data mesh takes every device but the actor's.
    default_mesh = jre.build(cfg("env.actor_device=3")).mesh
    # The actor on device 3, the learner on device 0.
    split = jre.build(cfg("env.actor_device=3", "run_dir=" + __import__("sys").argv[1],
                          "name=" + name), mesh=data_mesh(d[:1]))
    pipeline = Pipeline(split, d[3])
    pipeline.start(split.init(jax.random.key(5)), 1)
    (data, env, stats, _), _, _ = pipeline.next()
    pipeline.stop()
    actor_devices = sorted({str(x.device) for x in jax.tree.leaves((data, env))})
    got, summary = split.run(split.init(jax.random.key(5)))
    # The same schedule with actor and learner on the learner's mesh.
    same = jre.build(cfg("env.overlap=true", "run_dir=" + __import__("sys").argv[1],
                         "name=" + name + "1"), mesh=data_mesh(d[:1]))
    want, _ = same.run(same.init(jax.random.key(5)))
    out[name] = {
        "equal": all(np.array_equal(a, b) for a, b in zip(plain(got), plain(want), strict=True)),
        "mesh": sorted(str(x) for x in default_mesh.devices.flat),
        "learner": sorted({str(x.device) for x in jax.tree.leaves(got.train)}
                          | {str(s) for x in jax.tree.leaves(got.train)
                             for s in x.sharding.device_set}),
        "actor": actor_devices,
        "status": summary["status"], "epochs": summary["epochs"],
        "checkpoint": summary["checkpoint"],
        "lags": [r["rollout/policy_lag"] for r in summary["records"]],
    }
ppo = lambda *extra: jre.load_config(None, [*base, *algos["ppo"], "env.actor_device=3", *extra])
out["mesh_data_1"] = [str(x) for x in jre.build(ppo("mesh.data=1")).mesh.devices.flat]
try:
    jre.build(ppo("mesh.data=4"))
except jre.ConfigError as e:
    out["mesh_data_4"] = str(e)
print(json.dumps(out))
"""


@pytest.mark.multidevice
def test_the_actor_runs_on_its_own_device_with_the_same_results(tmp_path):
    """`env.actor_device`: the actor's rollouts live on that device, the learner's state on
    another (gymnax and host envs), and the run (checkpoints, evaluation, policy lag) equals
    the same schedule on the learner's device alone, bitwise; by default the learner's mesh
    is every other device."""
    from tests.conftest import run_on_four_devices

    out = run_on_four_devices(TWO_DEVICES, str(tmp_path))
    for name in ("ppo", "dqn", "ppo_gym"):  # ppo_gym: a host env, its steps in the actor thread
        got = out[name]
        assert got["equal"], name
        # A host env's learner takes one device (its envs step on the host).
        mesh = ["cpu:0"] if name == "ppo_gym" else ["cpu:0", "cpu:1", "cpu:2"]
        assert got["mesh"] == mesh, got
        assert got["actor"] == ["cpu:3"], got
        assert got["learner"] == ["cpu:0"], got
        assert got["status"] == "completed" and got["epochs"] == 4
        assert got["checkpoint"].endswith("epoch_4") and got["lags"] == [0, 1, 0, 1]
    # mesh.data sizes the learner's mesh from the devices besides the actor's.
    assert out["mesh_data_1"] == ["cpu:0"]
    assert (
        "'mesh.data': 4 learner devices asked, 3 are left besides the actor's" in out["mesh_data_4"]
    )


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (["env.actor_device=1"], "not one of this process's 1 device(s)"),
        (["env.actor_device=0", "env.overlap=false"], "env.overlap, which is false"),
    ],
)
def test_an_actor_device_that_cannot_be_used_exits_2(overrides, fragment, capsys, tmp_path):
    from jaxrl_engine import cli
    from tests.conftest import SMALL

    status = cli.main(["train", *SMALL, f"run_dir={tmp_path}", *overrides])
    err = capsys.readouterr().err
    assert status == cli.EXIT_BAD_INPUT and fragment in err and "'env.actor_device'" in err, err


def test_off_policy_overlap_keeps_the_rollout_nan_guard(tmp_path):
    """The actor's collection (off-policy overlap) runs the rollout phase's nan_guard: NaN
    rewards from epoch 3 stop the run naming phase rollout, epoch 3, checkpoint 2 kept."""

    cfg = jre.load_config(
        None,
        [
            "env.num_envs=4",
            "eval.num_envs=4",
            "eval.interval=10",
            "algo.num_steps=4",
            "total_env_steps=96",
            "save_interval=1",
            "progress=false",
            *DQN[:1],
            "algo.learning_starts=16",
            "algo.buffer_size=64",
            "algo.batch_size=32",
            *OVERLAP,
            f"run_dir={tmp_path}",
        ],
    )
    engine = jre.build(cfg, env=NaNRewardsFrom(start=2 * 4))
    with pytest.raises(jre.NonFiniteError) as info:
        engine.run(engine.init(jax.random.key(0)))
    assert (info.value.phase, info.value.quantity, info.value.epoch) == (
        "rollout",
        "rollout/reward_mean",
        3,
    )
    assert "epoch_2" in " ".join(info.value.__notes__)
