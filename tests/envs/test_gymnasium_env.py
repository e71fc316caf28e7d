"""gymnasium envs as batched host envs (`env.suite: gymnasium`): the same transitions as
gymnasium's own SAME_STEP vector env, spaces mapped or refused by name, the whole driver
(checkpoints, evaluation, resume, export) around them, and env errors that stop the run."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnasium.envs.classic_control import CartPoleEnv
from gymnasium.vector import AutoresetMode

import jaxrl_engine as jre
from jaxrl_engine import cli
from jaxrl_engine.compose import make_configured_env
from jaxrl_engine.envs.gymnasium_env import GymnasiumEnv
from jaxrl_engine.io.checkpoint import Checkpointer
from tests.conftest import SMALL

GYM = ["env.suite=gymnasium"]


def test_steps_equal_gymnasiums_own_same_step_vector_env():
    env = GymnasiumEnv("CartPole-v1", num_envs=4, eval_envs=2)
    key = jax.random.key(3)
    actions = np.random.default_rng(0).integers(0, 2, size=(120, 4)).astype(np.int32)

    @jax.jit
    def run(key, actions):
        obs, state = env.reset(key, env.params)

        def step(carry, action):
            state, _ = carry
            out = env.step(key, state, action, env.params)
            return (out[1], out[0]), (out[0], *out[2:5], out[5]["final_observation"])

        return obs, jax.lax.scan(step, (state, obs), actions)[1]

    first, (obs, reward, terminated, truncated, final) = jax.device_get(run(key, actions))
    reference = gymnasium.make_vec(
        "CartPole-v1",
        4,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
    )
    ref_obs, _ = reference.reset(seed=int(jax.random.key_data(key)[-1]))
    np.testing.assert_array_equal(first, ref_obs)
    ends = 0
    for t, action in enumerate(actions):
        o, r, te, tr, info = reference.step(action.astype(np.int64))
        np.testing.assert_array_equal(obs[t], o)
        np.testing.assert_array_equal(reward[t], r.astype(np.float32))
        np.testing.assert_array_equal(terminated[t], te)
        np.testing.assert_array_equal(truncated[t], tr)
        for i in range(4):  # the ended episode's last observation; else the next one
            expected = info["final_obs"][i] if te[i] or tr[i] else o[i]
            np.testing.assert_array_equal(final[t, i], expected)
        ends += int((te | tr).sum())
    assert ends > 0  # random actions end CartPole episodes within 120 steps


def test_spaces_map_to_the_engine_spec():
    cartpole = GymnasiumEnv("CartPole-v1", 2, 2).spec(None)
    assert cartpole.obs_shape == (4,) and cartpole.action.num_actions == 2
    assert cartpole.max_episode_steps == 500
    pendulum = GymnasiumEnv("Pendulum-v1", 2, 2).spec(None)
    assert pendulum.action.shape == (1,) and pendulum.action.low == (-2.0,)
    assert pendulum.action.high == (2.0,) and pendulum.obs_dtype == np.float32


def test_64_bit_integer_observations_become_int32_when_their_bounds_fit():
    from gymnasium import spaces

    from jaxrl_engine.envs.gymnasium_env import _space_spec

    counts = spaces.Box(0, 100, (2,), np.int64)
    shape, dtype, _ = _space_spec("my:Counts-v0", counts, spaces.Discrete(2))
    assert shape == (2,) and dtype == np.int32  # (JAX runs without 64-bit types)
    unbounded = spaces.Box(0, 2**40, (2,), np.int64)
    with pytest.raises(ValueError, match=r"env.id=my:Counts-v0: observation space .* 64-bit"):
        _space_spec("my:Counts-v0", unbounded, spaces.Discrete(2))


@pytest.mark.parametrize(
    "overrides, fragments",
    [
        (["env.id=Blackjack-v1"], ["Blackjack-v1", "observation space Tuple", "Box only"]),
        (["env.id=CartPole-v9"], ["'CartPole-v9' is not a registered gymnasium id", "CartPole-v1"]),
        (["env.id=CartPole-v1", "env.params={bogus: 1}"], ["cannot be made", "bogus"]),
        (["env.id=Pendulum-v1", "algo.name=dqn"], ["needs a discrete action space"]),
    ],
)
def test_unsupported_envs_exit_2_naming_the_problem(overrides, fragments, capsys, tmp_path):
    base = [] if any(o.startswith("algo.name") for o in overrides) else SMALL  # (PPO keys)
    status = cli.main(["train", *base, *GYM, f"run_dir={tmp_path}", *overrides])
    err = capsys.readouterr().err
    assert status == cli.EXIT_BAD_INPUT and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


@pytest.mark.skipif(
    importlib.util.find_spec("mujoco") is not None, reason="mujoco is installed here"
)
def test_a_mujoco_env_without_the_extra_exits_2(capsys, tmp_path):
    status = cli.main(["train", *SMALL, *GYM, "env.id=HalfCheetah-v5", f"run_dir={tmp_path}"])
    err = capsys.readouterr().err
    assert status == cli.EXIT_BAD_INPUT and "cannot be made" in err and "mujoco" in err.lower()


@pytest.fixture(scope="module")
def host_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("gym")
    cfg = jre.load_config(
        None, [*SMALL, *GYM, f"run_dir={root}", "name=g", "save_interval=2", "loggers=[jsonl]"]
    )
    engine = jre.build(cfg)
    state, summary = engine.run(engine.init(jax.random.key(0)))
    return root / "g", state, summary


def test_the_driver_runs_host_envs_with_checkpoints_evaluation_and_export(host_run):
    run, _, summary = host_run
    assert summary["status"] == "completed" and summary["epochs"] == 4
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2, 3, 4]
    assert all(np.isfinite(r["evaluate/episode_return"]) for r in records if r["epoch"] % 2 == 0)
    assert (run / "policy" / "act.jaxexport").is_file()
    assert jre.make_policy(run)(jnp.zeros((3, 4))).shape == (3,)
    assert cli.main(["eval", str(run), "--episodes", "3"]) == 0


def test_a_host_env_run_resumes_from_its_checkpoint(host_run, tmp_path):
    import shutil

    run = tmp_path / "g"
    shutil.copytree(host_run[0], run)
    engine, state = jre.resume(run, ["total_env_steps=384"])  # 6 epochs now
    assert int(state.counters.epoch) == 4
    state, summary = engine.run(state)  # new episodes (the envs' own state is not saved)
    assert summary["epochs"] == 6 and int(state.counters.epoch) == 6


class FlakyCartPole(CartPoleEnv):
    """CartPole whose `step` raises on its `fail_at`-th call."""

    def __init__(self, fail_at: int):
        super().__init__()
        self.calls, self.fail_at = 0, fail_at

    def step(self, action):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError(f"simulator crashed at step {self.calls}")
        return super().step(action)


gymnasium.register("FlakyCartPole-v0", entry_point=FlakyCartPole, max_episode_steps=500)


@pytest.mark.parametrize("fail_at", [150, 205])
def test_an_env_that_raises_in_step_stops_the_run_with_that_error_and_keeps_the_checkpoint(
    fail_at, tmp_path
):
    # 4 envs x 16 steps an epoch: step 150 of env 0 falls in epoch 10, 205 in epoch 13.
    cfg = jre.load_config(
        None,
        [
            *SMALL,
            *GYM,
            "env.id=FlakyCartPole-v0",
            "total_env_steps=1280",
            f"env.params={{fail_at: {fail_at}}}",
            "eval.env_params={fail_at: 0}",  # the evaluation envs never fail
            f"run_dir={tmp_path}",
            "save_interval=4",
            "eval.interval=4",
            "loggers=[jsonl]",
        ],
    )
    engine = jre.build(cfg)
    with pytest.raises(RuntimeError, match=f"simulator crashed at step {fail_at}"):
        engine.run(engine.init(jax.random.key(0)))
    checkpoints = Checkpointer(tmp_path / cfg.name / "checkpoints", read_only=True)
    try:
        last = 8 if fail_at == 150 else 12
        assert checkpoints.epochs()[-1] == last
        state, _ = checkpoints.restore(jre.build(cfg))  # intact
        assert int(state.counters.epoch) == last
    finally:
        checkpoints.close()


class CountedCartPole(CartPoleEnv):
    """CartPole that counts its open instances (made, not yet closed)."""

    live = 0
    most = 0

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        CountedCartPole.live += 1
        CountedCartPole.most = max(CountedCartPole.most, CountedCartPole.live)

    def close(self):
        CountedCartPole.live -= 1
        super().close()


gymnasium.register("CountedCartPole-v0", entry_point=CountedCartPole, max_episode_steps=500)
gymnasium.register("ShortCartPole-v0", entry_point=CartPoleEnv, max_episode_steps=5)


class WideCartPole(CartPoleEnv):
    """CartPole whose `wide=True` doubles the observation (a make kwarg that changes a space)."""

    def __init__(self, wide: bool = False):
        super().__init__()
        if wide:
            high = np.concatenate([self.observation_space.high] * 2)
            self.observation_space = gymnasium.spaces.Box(-high, high, dtype=np.float32)


gymnasium.register("WideCartPole-v0", entry_point=WideCartPole, max_episode_steps=500)


@pytest.mark.parametrize("offload", [False, True])
def test_offload_closes_the_idle_env_set_and_rebuilds_it(offload, tmp_path):
    """RLightning's env offload: with `offload: true` the training (4 envs) and evaluation
    (6 envs) sets never exist at once; each evaluation closes the training set, and training
    after it makes it again. Without offload both stay open for the whole run."""
    CountedCartPole.live = CountedCartPole.most = 0
    cfg = jre.load_config(
        None,
        [
            *SMALL,
            *GYM,
            "env.id=CountedCartPole-v0",
            "eval.num_envs=6",
            f"offload={str(offload).lower()}",
            f"run_dir={tmp_path}",
            "loggers=[jsonl]",
        ],
    )
    env = make_configured_env(cfg)
    engine = jre.build(cfg, env=env)
    _, summary = engine.run(engine.init(jax.random.key(0)))
    assert summary["status"] == "completed" and summary["epochs"] == 4
    assert np.isfinite(summary["final_eval_return"])
    # Evaluations after epochs 2 and 4: the training set is made again after the first, the
    # evaluation set again for the second.
    assert env.rebuilds == (2 if offload else 0)
    assert CountedCartPole.most == (6 if offload else 4 + 6)
    env.close()
    assert CountedCartPole.live == 0


def test_evaluation_runs_in_the_env_eval_env_id_names(tmp_path):
    """`eval.env_id`: the evaluation env set is another env with the same spaces (here
    CartPole cut at 5 steps, which an untrained policy always survives)."""
    returns = {}
    for eval_id in ("CartPole-v1", "ShortCartPole-v0"):
        cfg = jre.load_config(
            None,
            [*SMALL, *GYM, f"eval.env_id={eval_id}", f"run_dir={tmp_path}", f"name={eval_id}"],
        )
        engine = jre.build(cfg)
        _, metrics = engine.evaluate(engine.init(jax.random.key(0)))
        returns[eval_id] = float(metrics["evaluate/episode_return"])
        lengths = float(metrics["evaluate/episode_length"])
        assert lengths == (5.0 if eval_id.startswith("Short") else returns[eval_id])
    assert returns["ShortCartPole-v0"] == 5.0 < returns["CartPole-v1"]
    # Made with eval.env_params alone (the training env's kwargs may not fit another env).
    env = GymnasiumEnv("CartPole-v1", 2, 2, {"render_mode": None}, eval_id="ShortCartPole-v0")
    assert env.eval_set({"sutton_barto_reward": True}).kwargs == (("sutton_barto_reward", True),)
    same = GymnasiumEnv("CartPole-v1", 2, 2, {"render_mode": None})
    assert dict(same.eval_set({"sutton_barto_reward": True}).kwargs) == {
        "render_mode": None,
        "sutton_barto_reward": True,
    }


@pytest.mark.parametrize(
    "overrides, fragments",
    [
        (
            ["eval.env_id=Pendulum-v1"],
            ["eval.env_id: the evaluation env Pendulum-v1 has other spaces", "Discrete(2)"],
        ),
        (
            ["env.id=WideCartPole-v0", "eval.env_params={wide: true}"],
            ["eval.env_params: the evaluation env WideCartPole-v0 with {'wide': True}", "(8,)"],
        ),
        (["eval.env_id=Nope-v1"], ["eval.env_id=Nope-v1", "cannot be made"]),
    ],
)
def test_an_eval_env_the_policy_cannot_act_in_exits_2(overrides, fragments, capsys, tmp_path):
    status = cli.main(["train", *SMALL, *GYM, f"run_dir={tmp_path}", *overrides])
    err = capsys.readouterr().err
    assert status == cli.EXIT_BAD_INPUT and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    assert not list(tmp_path.iterdir())  # refused before the run directory was made


class TinyImageEnv(gymnasium.Env):
    """A 6x6 RGB image observation (uint8) whose bright column is to the left or right; the
    action that names the side earns 1. Episodes last 8 steps."""

    observation_space = gymnasium.spaces.Box(0, 255, (6, 6, 3), np.uint8)
    action_space = gymnasium.spaces.Discrete(2)

    def _obs(self):
        image = np.zeros((6, 6, 3), np.uint8)
        image[:, 0 if self.side == 0 else 5, :] = 255
        return image

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.side, self.t = int(self.np_random.integers(2)), 0
        return self._obs(), {}

    def step(self, action):
        reward = float(action == self.side)
        self.side, self.t = int(self.np_random.integers(2)), self.t + 1
        return self._obs(), reward, False, self.t >= 8, {}


gymnasium.register("TinyImage-v0", entry_point=TinyImageEnv)


def test_image_observations_train_through_the_host_path(tmp_path):
    """A Box uint8 image observation: mapped to the spec, stored as given, and PPO learns to
    read it (the untrained policy earns about half of the 8 available)."""
    spec = GymnasiumEnv("TinyImage-v0", 2, 2).spec(None)
    assert spec.obs_shape == (6, 6, 3) and spec.obs_dtype == np.uint8
    cfg = jre.load_config(
        None,
        [
            *SMALL,
            *GYM,
            "env.id=TinyImage-v0",
            "total_env_steps=8192",
            "eval.interval=32",
            "algo.lr=3e-3",
            f"run_dir={tmp_path}",
            "loggers=[jsonl]",
        ],
    )
    engine = jre.build(cfg)
    state, summary = engine.run(engine.init(jax.random.key(0)))
    assert state.buffer.obs.dtype == jnp.uint8 and state.buffer.obs.shape[2:] == (6, 6, 3)
    assert summary["status"] == "completed" and summary["final_eval_return"] >= 7.5
    # The exported policy takes the env's uint8 images, and refuses what uint8 cannot hold
    # (scaled floats, 256) instead of acting on their wrapped or truncated values.
    policy_dir = Path(summary["run_dir"]) / "policy"
    spec_ = importlib.util.spec_from_file_location("tiny_image_policy", policy_dir / "policy.py")
    module = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(module)
    act, params = module.load(policy_dir)
    images = np.asarray(state.env.obs)
    np.testing.assert_array_equal(
        np.asarray(act(params, images)), np.asarray(jre.make_policy((engine, state))(images))
    )
    np.testing.assert_array_equal(  # (integral values of another dtype are taken)
        np.asarray(act(params, images.astype(np.float32))), np.asarray(act(params, images))
    )
    for bad in (images / 255.0 * 0.9, images.astype(np.int32) + 256):
        with pytest.raises(ValueError, match=r"values that uint8 cannot hold exactly"):
            act(params, bad)


def test_async_vectorization_gives_the_same_transitions_as_sync():
    """`env.vectorization: async` (a subprocess per env): the same steps as the sync envs."""
    actions = np.random.default_rng(1).integers(0, 2, size=(40, 2)).astype(np.int32)
    key = jax.random.key(4)
    outs = []
    for mode in ("sync", "async"):
        env = GymnasiumEnv("CartPole-v1", 2, 2, vectorization=mode)

        @jax.jit
        def run(key, actions, env=env):
            obs, state = env.reset(key, env.params)

            def step(state, action):
                out = env.step(key, state, action, env.params)
                return out[1], (out[0], *out[2:5])

            return obs, jax.lax.scan(step, state, actions)[1]

        outs.append(jax.device_get(run(key, actions)))
        env.close()
    for a, b in zip(jax.tree.leaves(outs[0]), jax.tree.leaves(outs[1]), strict=True):
        np.testing.assert_array_equal(a, b)
