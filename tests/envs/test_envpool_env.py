"""EnvPool envs as batched host envs (`env.suite: envpool`): EnvPool's next-step autoreset
turned into the engine's same-step view (checked against EnvPool itself stepped by hand and
against gymnasium's SAME_STEP vector env), spaces mapped or refused by name, and the driver
(checkpoints, evaluation, export, resume) around them."""

from __future__ import annotations

import json
import sys

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import jaxrl_engine as jre
from jaxrl_engine import cli
from jaxrl_engine.envs.envpool_env import SEED_RANGE, EnvPoolEnv  # imports envpool lazily
from tests.conftest import SMALL

envpool = pytest.importorskip(
    "envpool", reason="EnvPool is an optional extra: pip install 'jaxrl-engine[envpool]'"
)

POOL = ["env.suite=envpool"]
N = 4


def _run(env: EnvPoolEnv, key: jax.Array, actions: np.ndarray):
    """First observations, then per step (obs, reward, terminated, truncated, final
    observation), through the engine's traced `reset`/`step` in one jitted scan."""

    @jax.jit
    def run(key, actions):
        obs, state = env.reset(key, env.params)

        def step(state, action):
            out = env.step(key, state, action, env.params)
            return out[1], (out[0], *out[2:5], out[5]["final_observation"])

        return obs, jax.lax.scan(step, state, actions)[1]

    return jax.device_get(run(key, actions))


@pytest.mark.filterwarnings("ignore:.*precision lowered by casting:UserWarning")  # (EnvPool's Box)
def test_same_step_view_equals_envpool_itself_stepped_by_hand_with_its_next_step_autoreset():
    # A 20-step limit: episodes end both ways (the pole falls; the limit truncates).
    env = EnvPoolEnv("CartPole-v1", N, 2, {"max_episode_steps": 20})
    key = jax.random.key(3)
    actions = np.random.default_rng(0).integers(0, 2, size=(150, N)).astype(np.int32)
    first, (obs, reward, terminated, truncated, final) = _run(env, key, actions)
    # The reference: env i alone in its own pool (EnvPool seeds env i with seed + i), stepped
    # by hand in EnvPool's own mode: the step after an episode's end is the reset step.
    seed = int(jax.random.key_data(key)[-1]) % SEED_RANGE
    pools = [
        envpool.make(
            "CartPole-v1", env_type="gymnasium", num_envs=1, seed=seed + i, max_episode_steps=20
        )
        for i in range(N)
    ]
    for i, pool in enumerate(pools):
        np.testing.assert_array_equal(first[i], pool.reset()[0][0])
    kinds = {"terminated": 0, "truncated": 0}
    for t, action in enumerate(actions):
        for i, pool in enumerate(pools):
            o, r, te, tr, _ = pool.step(action[i : i + 1])
            assert (reward[t, i], terminated[t, i], truncated[t, i]) == (r[0], te[0], tr[0])
            np.testing.assert_array_equal(final[t, i], o[0])  # the step's own observation
            if te[0] or tr[0]:
                kinds["terminated" if te[0] else "truncated"] += 1
                o, r, te, tr, info = pool.step(np.zeros(1, np.int32))  # EnvPool's reset step
                assert (r[0], te[0], tr[0], info["elapsed_step"][0]) == (0, False, False, 0)
            np.testing.assert_array_equal(obs[t, i], o[0])  # the next episode's first obs
    assert kinds["terminated"] > 0 and kinds["truncated"] > 0, kinds


def test_transitions_follow_gymnasiums_same_step_vector_env_from_the_same_states():
    # EnvPool's CartPole is its own C++ port with its own RNG, so the episodes start elsewhere:
    # each step, gymnasium's envs are put in the adapter's state and must step to its results.
    env = EnvPoolEnv("CartPole-v1", N, 2)
    actions = np.random.default_rng(1).integers(0, 2, size=(120, N)).astype(np.int32)
    first, (obs, reward, terminated, truncated, final) = _run(env, jax.random.key(0), actions)
    reference = gymnasium.make_vec(
        "CartPole-v1",
        N,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
    )
    reference.reset(seed=0)
    before, ends = first, 0
    for t, action in enumerate(actions):
        for i, sub in enumerate(reference.envs):
            sub.unwrapped.state = np.asarray(before[i], np.float64)
        o, r, te, tr, info = reference.step(action.astype(np.int64))
        np.testing.assert_array_equal(reward[t], r.astype(np.float32))
        np.testing.assert_array_equal(terminated[t], te)
        np.testing.assert_array_equal(truncated[t], tr)
        for i in range(N):
            if te[i] or tr[i]:  # the ended episode's last obs; the new one's is EnvPool's own
                np.testing.assert_allclose(final[t, i], info["final_obs"][i], atol=1e-5)
                assert not np.array_equal(obs[t, i], final[t, i])
                assert np.all(np.abs(obs[t, i]) <= 0.05)  # a fresh CartPole state
            else:
                np.testing.assert_allclose(obs[t, i], o[i], atol=1e-5)
                np.testing.assert_array_equal(final[t, i], obs[t, i])
        ends += int((te | tr).sum())
        before = obs[t]
    assert ends > 0


def test_the_same_key_gives_the_same_episodes():
    env = EnvPoolEnv("CartPole-v1", N, 2)
    actions = np.ones((30, N), np.int32)
    a, b = _run(env, jax.random.key(7), actions), _run(env, jax.random.key(7), actions)
    jax.tree.map(np.testing.assert_array_equal, a, b)
    assert not np.array_equal(a[0], _run(env, jax.random.key(8), actions)[0])


def test_spaces_map_to_the_engine_spec():
    cartpole = EnvPoolEnv("CartPole-v1", 2, 2).spec(None)
    assert cartpole.obs_shape == (4,) and cartpole.action.num_actions == 2
    assert cartpole.max_episode_steps == 500 and cartpole.obs_dtype == np.float32
    pendulum = EnvPoolEnv("Pendulum-v1", 2, 2).spec(None)
    assert pendulum.action.shape == (1,) and pendulum.action.low == (-2.0,)
    assert pendulum.action.high == (2.0,) and pendulum.max_episode_steps == 200
    ant = EnvPoolEnv("Ant-v5", 2, 2).spec(None)  # float64 MuJoCo observations -> float32
    assert ant.obs_shape == (105,) and ant.obs_dtype == np.float32 and ant.action.shape == (8,)
    racing = EnvPoolEnv("CarRacing-v3", 2, 2).spec(None)  # an image
    assert racing.obs_shape == (96, 96, 3) and racing.obs_dtype == np.uint8
    assert racing.action.low == (-1.0, 0.0, 0.0)
    blackjack = EnvPoolEnv("Blackjack-v1", 2, 2).spec(None)  # EnvPool: no step limit
    assert blackjack.max_episode_steps == 1000


def test_image_observations_step_through_the_engine():
    env = EnvPoolEnv("CarRacing-v3", 2, 2)
    actions = np.zeros((3, 2, 3), np.float32)
    first, (obs, reward, *_) = _run(env, jax.random.key(0), actions)
    assert first.shape == (2, 96, 96, 3) and obs.shape == (3, 2, 96, 96, 3)
    assert first.dtype == np.uint8 and first.any() and reward.dtype == np.float32


@pytest.mark.parametrize(
    "overrides, fragments",
    [
        (["env.id=MiniGrid-Empty-5x5-v0"], ["MiniGrid-Empty-5x5-v0", "observation space Dict"]),
        (["env.id=FrozenLake-v1"], ["observation space Discrete(16)", "Box only"]),
        (["env.id=CartPole-v9"], ["'CartPole-v9' is not an EnvPool id", "CartPole-v1"]),
        (["env.id=CartPole-v1", "env.params={bogus: 1}"], ["cannot be made", "bogus"]),
        (["env.id=Pendulum-v1", "algo.name=dqn"], ["needs a discrete action space"]),
    ],
)
def test_unsupported_envs_exit_2_naming_the_problem(overrides, fragments, capsys, tmp_path):
    base = [] if any(o.startswith("algo.name") for o in overrides) else SMALL  # (PPO keys)
    status = cli.main(["train", *base, *POOL, f"run_dir={tmp_path}", *overrides])
    err = capsys.readouterr().err
    assert status == cli.EXIT_BAD_INPUT and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


def test_without_envpool_the_config_names_the_extra(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "envpool", None)  # `import envpool` raises ImportError
    status = cli.main(["train", *SMALL, *POOL, f"run_dir={tmp_path}"])
    err = capsys.readouterr().err
    assert status == cli.EXIT_BAD_INPUT and "pip install 'jaxrl-engine[envpool]'" in err, err


@pytest.fixture(scope="module")
def pool_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("envpool")
    cfg = jre.load_config(
        None, [*SMALL, *POOL, f"run_dir={root}", "name=p", "save_interval=2", "loggers=[jsonl]"]
    )
    engine = jre.build(cfg)
    state, summary = engine.run(engine.init(jax.random.key(0)))
    return root / "p", state, summary


def test_the_driver_runs_envpool_envs_with_checkpoints_evaluation_and_export(pool_run):
    run, _, summary = pool_run
    assert summary["status"] == "completed" and summary["epochs"] == 4
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2, 3, 4]
    assert all(np.isfinite(r["evaluate/episode_return"]) for r in records if r["epoch"] % 2 == 0)
    assert sum(r["rollout/episodes"] for r in records) > 0  # episodes ended and restarted
    assert (run / "checkpoints" / "epoch_4").is_dir()
    assert jre.make_policy(run)(jnp.zeros((3, 4))).shape == (3,)


def test_an_envpool_run_resumes_from_its_checkpoint(pool_run, tmp_path):
    import shutil

    run = tmp_path / "p"
    shutil.copytree(pool_run[0], run)
    engine, state = jre.resume(run, ["total_env_steps=384"])  # 6 epochs now
    assert int(state.counters.epoch) == 4
    state, summary = engine.run(state)  # new episodes (the pools' own state is not saved)
    assert summary["epochs"] == 6 and int(state.counters.epoch) == 6
