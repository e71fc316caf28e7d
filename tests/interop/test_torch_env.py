"""Torch batch simulators: the torch CartPole matches gymnax, the host rollout feeds the engine."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import jaxrl_engine as jre  # noqa: E402
from jaxrl_engine.envs.gymnax_env import make_env  # noqa: E402
from jaxrl_engine.interop.torch_env import TorchCartPole, TorchSimRollout  # noqa: E402
from tests.conftest import small_config  # noqa: E402


def test_torch_cartpole_steps_like_gymnax():
    env = make_env("CartPole-v1")
    sim = TorchCartPole(8, seed=0)
    obs_t = sim.reset()
    _, gym_state = jax.vmap(env.reset, (0, None))(
        jax.random.split(jax.random.key(0), 8), env.params
    )
    gym_state = gym_state.replace(
        x=jnp.asarray(obs_t[:, 0].numpy()),
        x_dot=jnp.asarray(obs_t[:, 1].numpy()),
        theta=jnp.asarray(obs_t[:, 2].numpy()),
        theta_dot=jnp.asarray(obs_t[:, 3].numpy()),
    )
    rng = np.random.default_rng(0)
    for _ in range(30):
        actions = rng.integers(0, 2, size=8)
        sim_step = sim.step(torch.from_numpy(actions))
        terminated = sim_step[2]
        out = jax.vmap(env.step, (0, 0, 0, None))(
            jax.random.split(jax.random.key(1), 8), gym_state, jnp.asarray(actions), env.params
        )
        _, gym_state, _, gym_term, _, gym_info = out
        np.testing.assert_allclose(
            sim_step[4]["final_observation"].numpy(),
            np.asarray(gym_info["final_observation"]),
            atol=1e-5,
        )
        np.testing.assert_array_equal(terminated.numpy(), np.asarray(gym_term))
        # continue both from the torch sim's (auto-reset) state
        s = sim.state
        gym_state = gym_state.replace(
            x=jnp.asarray(s[:, 0].numpy()),
            x_dot=jnp.asarray(s[:, 1].numpy()),
            theta=jnp.asarray(s[:, 2].numpy()),
            theta_dot=jnp.asarray(s[:, 3].numpy()),
        )


def test_torch_cartpole_truncates_at_max_steps():
    sim = TorchCartPole(2, max_steps=5, seed=0)
    sim.reset()
    sim.state.zero_()
    truncated = []
    for t in range(5):
        _, _, term, trunc, _ = sim.step(torch.tensor([t % 2, (t + 1) % 2]))
        truncated.append(bool(trunc.all()))
        assert not bool(term.any())
    assert truncated == [False, False, False, False, True]


def test_host_rollout_crosses_by_dlpack_and_feeds_the_engine_phases(tmp_path):
    cfg = small_config("algo.torch_policy={}", tmp_path=tmp_path)
    engine = jre.build(cfg)
    rollout = TorchSimRollout(engine, TorchCartPole(cfg.env.num_envs, seed=0))
    state = engine.init(jax.random.key(0))
    state, metrics = rollout.epoch(state)
    n, T = cfg.env.num_envs, cfg.algo.num_steps
    assert state.buffer.obs.shape == (T, n, 4) and state.buffer.action.shape == (T, n)
    assert int(state.counters.env_steps) == T * n and int(state.counters.epoch) == 1
    assert np.isfinite(float(metrics["train/loss"]))
    # The engine's hooks and timer cover the host rollout too.
    assert int(metrics["guard/rollout"]) == -1
    jax_metrics = jax.eval_shape(engine.rollout, state)[1]
    assert set(metrics) & set(jax_metrics) == set(jax_metrics)  # nan_guard names line up
    assert "rollout" in engine.timer.table()
    assert state.env.obs.shape == (n, 4)
    # Observations and actions crossed zero-copy; only the kept reward/done/next_obs were copied.
    per_step_zero = n * 4 * 4 + n * 4  # obs f32[n, 4] in, actions i32[n] out
    assert rollout.report.zero_copy_bytes == T * per_step_zero
    assert rollout.report.copied_bytes == T * (n * 4 + n + n + n * 16) + n * 16  # + last obs
    ret = rollout.evaluate(state, TorchCartPole(4, seed=1), max_steps=20)
    assert 1.0 <= ret <= 20.0


class StridedObs(TorchCartPole):
    """Observations as a strided view (every other column of a wider buffer, as a simulator
    that keeps several quantities per env in one tensor gives them): DLPack cannot alias it."""

    def reset(self):
        return self._view(super().reset())

    @staticmethod
    def _view(obs):
        return torch.stack([obs, -obs], 2).reshape(len(obs), -1)[:, ::2]  # strides (8, 2)

    def step(self, action):
        obs, *rest = super().step(action)
        return (self._view(obs), *rest)


def test_a_strided_observation_view_crosses_as_one_counted_copy(tiny_engine):
    """`TorchSimRollout` takes no `copy=` argument, so a view DLPack cannot alias crosses as
    a copy, which the report counts; the stored observations equal a compact simulator's."""
    n, T = tiny_engine.num_envs, tiny_engine.num_steps
    rollout = TorchSimRollout(tiny_engine, StridedObs(n, seed=0))
    state, _ = rollout.epoch(tiny_engine.init(jax.random.key(0)))
    plain = TorchSimRollout(tiny_engine, TorchCartPole(n, seed=0))
    want, _ = plain.epoch(tiny_engine.init(jax.random.key(0)))
    np.testing.assert_array_equal(np.asarray(state.buffer.obs), np.asarray(want.buffer.obs))
    obs_bytes = n * 4 * 4
    assert rollout.report.copied_bytes == plain.report.copied_bytes + T * obs_bytes
    assert rollout.report.zero_copy_bytes == plain.report.zero_copy_bytes - T * obs_bytes


def test_a_mismatched_simulator_is_refused(tmp_path):
    engine = jre.build(small_config(tmp_path=tmp_path))
    with pytest.raises(ValueError, match="num_envs"):
        TorchSimRollout(engine, TorchCartPole(engine.num_envs + 1))


def test_a_rollout_hook_that_traces_its_phase_is_named_before_the_simulator_moves(tmp_path):
    """`jre.every` takes `lax.cond` over the phase it wraps: around the eager host rollout it
    would trace the simulator loop (was a DLPack "traced value" error after a reset)."""
    cfg = small_config(tmp_path=tmp_path)
    engine = jre.build(cfg, hooks={"rollout": [jre.every(2, lambda phase: phase)]})
    sim = TorchCartPole(cfg.env.num_envs, seed=0)
    rollout = TorchSimRollout(engine, sim)
    with pytest.raises(TypeError, match=r"a rollout hook traced the host rollout \(jre.every"):
        rollout.epoch(engine.init(jax.random.key(0)))
    assert rollout._obs is None  # the simulator was not reset while tracing


class FloatDone(TorchCartPole):
    def step(self, actions):
        obs, reward, terminated, truncated, info = super().step(actions)
        return obs, reward, terminated.float(), truncated, info


class DoubleObs(TorchCartPole):
    def reset(self):
        return super().reset().double()


class NoFinal(TorchCartPole):
    def step(self, actions):
        obs, reward, terminated, truncated, _ = super().step(actions)
        return obs, reward, terminated, truncated, {}


@pytest.mark.parametrize(
    "sim, message",
    [
        (FloatDone, r"FloatDone: step\(\) gives terminated of shape \[4\] and dtype torch.float32"),
        (NoFinal, r"info is a dict of \[\], without 'final_observation': it must hold"),
        (DoubleObs, r"reset\(\) gives observations of shape \[4, 4\] and dtype torch.float64; "),
    ],
)
def test_a_simulator_output_the_engine_cannot_take_is_named(tmp_path, sim, message):
    cfg = small_config(tmp_path=tmp_path)
    engine = jre.build(cfg)
    state = engine.init(jax.random.key(0))
    with pytest.raises(ValueError, match=message):
        TorchSimRollout(engine, sim(cfg.env.num_envs)).epoch(state)
    with pytest.raises(ValueError, match=message):  # a fresh simulator for evaluation too
        TorchSimRollout(engine, TorchCartPole(cfg.env.num_envs)).evaluate(state, sim(4), 10)


class Countdown:
    """Env i's episodes last `lengths[i]` steps, reward `i + 1 + t` at its step t (0-based);
    terminated, or truncated for the envs in `truncate`. Auto-resets, gymnax style."""

    obs_shape = (4,)
    num_actions = 2

    def __init__(self, lengths, truncate=()):
        self.num_envs = len(lengths)
        self.lengths = torch.tensor(lengths)
        self.truncate = torch.tensor([i in truncate for i in range(self.num_envs)])
        self.t = torch.zeros(self.num_envs, dtype=torch.int64)

    def _obs(self):
        return torch.stack([self.t.float(), *[torch.zeros(self.num_envs)] * 3], -1)

    def reset(self):
        self.t.zero_()
        return self._obs()

    def step(self, actions):
        reward = (torch.arange(self.num_envs) + 1 + self.t).float()
        self.t += 1
        end = self.t >= self.lengths
        final = self._obs()
        self.t = torch.where(end, 0, self.t)
        return (
            self._obs(),
            reward,
            end & ~self.truncate,
            end & self.truncate,
            {"final_observation": final},
        )


def reference_stats(lengths, steps_per_epoch, epochs):
    """Per epoch (mean return, mean length, episodes ended), NaN before the first end and the
    last value again in an epoch without one; and the per-env running return and length."""
    ret, length, last, rows = [0.0] * len(lengths), [0] * len(lengths), (np.nan, np.nan), []
    for _ in range(epochs):
        ended = []
        for _ in range(steps_per_epoch):
            for i, n in enumerate(lengths):
                ret[i] += i + 1 + length[i]
                length[i] += 1
                if length[i] == n:
                    ended.append((ret[i], length[i]))
                    ret[i], length[i] = 0.0, 0
        if ended:
            last = (np.mean([r for r, _ in ended]), np.mean([n for _, n in ended]))
        rows.append((*last, len(ended)))
    return rows, ret, length


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory):
    cfg = small_config(
        "env.num_envs=2",
        "algo.num_steps=2",
        "algo.num_minibatches=1",
        "algo.update_epochs=1",
        tmp_path=tmp_path_factory.mktemp("tiny"),
    )
    return jre.build(cfg)


def test_host_rollout_episode_statistics_are_the_jax_rollouts_and_live_in_the_state(tiny_engine):
    """Were host-side: NaN in every epoch where no episode ended (README: the last value again),
    `state.stats` never advanced, and the running return was not in the state (a checkpoint
    lost the partial episodes)."""
    lengths, epochs = [3, 5], 6
    rollout = TorchSimRollout(tiny_engine, Countdown(lengths, truncate=(1,)))
    state = tiny_engine.init(jax.random.key(0))
    rows, ret, length = reference_stats(lengths, tiny_engine.num_steps, epochs)
    got: list[tuple[float, float, int]] = []
    for _ in range(epochs):
        state, m = rollout.rollout(state)  # the hooked host rollout: no training
        ended = int(m["rollout/episodes"])
        got.append((float(m["rollout/episode_return"]), float(m["rollout/episode_length"]), ended))
        assert float(state.stats.last_return) == pytest.approx(got[-1][0], nan_ok=True)
    np.testing.assert_allclose(np.array(got), np.array(rows), equal_nan=True)
    assert np.isnan(got[0][:2]).all() and got[0][2] == 0  # NaN before the first end
    assert got[3] == (*got[2][:2], 0)  # none ended in epoch 4: epoch 3's values again
    assert int(state.stats.episodes) == sum(row[2] for row in rows)
    np.testing.assert_allclose(np.asarray(state.stats.current_return), ret)
    np.testing.assert_array_equal(np.asarray(state.stats.current_length), length)


def test_a_fresh_simulator_starts_the_running_episode_statistics_again(tiny_engine):
    """A state carried (or resumed) into a new TorchSimRollout: its simulator is reset, so the
    carried running return and length restart with its episodes."""
    state = tiny_engine.init(jax.random.key(0))
    state, _ = TorchSimRollout(tiny_engine, Countdown([3, 5])).rollout(state)  # 2 steps, no end
    assert np.asarray(state.stats.current_length).tolist() == [2, 2]
    state, metrics = TorchSimRollout(tiny_engine, Countdown([3, 5])).rollout(state)
    assert int(metrics["rollout/episodes"]) == 0  # would be env 0 ending at a carried step 3
    assert np.asarray(state.stats.current_length).tolist() == [2, 2]
    np.testing.assert_allclose(np.asarray(state.stats.current_return), [1 + 2, 2 + 3])
