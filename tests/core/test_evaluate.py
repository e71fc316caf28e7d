"""Evaluation options: `eval.episodes` (rounds of fresh episodes when more than the envs),
`eval.deterministic` (greedy or sampled actions), mean/std/IQM, and what the summary says."""

from __future__ import annotations

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_engine as jre
from jaxrl_engine.core.phases import evaluate_episodes, interquartile_mean
from jaxrl_engine.envs.gymnax_env import make_env
from tests.conftest import small_config, subprocess_env


@pytest.mark.parametrize("n", [1, 2, 4, 7, 8, 16, 41])
def test_interquartile_mean_is_rliables(n):
    x = np.random.default_rng(n).normal(size=n).astype(np.float32)
    cut = n // 4
    expected = np.sort(x)[cut : n - cut].mean()
    assert float(interquartile_mean(jnp.asarray(x))) == pytest.approx(expected, rel=1e-6)


def test_more_episodes_than_envs_run_in_rounds_of_fresh_episodes():
    env = make_env("CartPole-v1", None)

    def policy(obs, key):
        return jax.random.randint(key, (obs.shape[0],), 0, 2)

    def run(key, episodes):
        return jax.jit(lambda k: evaluate_episodes(env, env.params, policy, 8, k, episodes))(key)

    key = jax.random.key(3)
    ret, length = run(key, 20)
    assert ret.shape == length.shape == (20,)
    assert bool(jnp.all(length >= 1)) and bool(jnp.all(ret == length))  # reward 1 per step
    # The rounds are different episodes (the second round is not the first one again).
    assert not np.array_equal(np.asarray(ret[:8]), np.asarray(ret[8:16]))
    one, _ = run(key, None)
    assert one.shape == (8,)


def test_stochastic_evaluation_samples_and_the_summary_says_which(tmp_path):
    common = ["eval.episodes=24", "eval.num_envs=8", "total_env_steps=256", "save_interval=0"]
    greedy = jre.build(small_config(*common, tmp_path=tmp_path))
    cfg = small_config(*common, "eval.deterministic=false", "progress=false", tmp_path=tmp_path)
    sampled = jre.build(cfg)
    assert (greedy.eval_episodes, greedy.eval_deterministic) == (24, True)
    state = greedy.init(jax.random.key(0))
    _, g = greedy.evaluate(state)
    _, s = sampled.evaluate(state)
    assert {"evaluate/episode_return_iqm", "evaluate/episode_return_std"} <= set(g)
    # An untrained policy: greedy and sampled actions give other episodes.
    assert float(g["evaluate/episode_return"]) != float(s["evaluate/episode_return"])
    _, summary = sampled.run(sampled.init(jax.random.key(0)))
    assert (summary["eval_episodes"], summary["eval_policy"]) == (24, "stochastic")


def test_eval_episodes_must_be_positive():
    with pytest.raises(jre.ConfigError, match=r"eval\.episodes"):
        jre.load_config(None, ["eval.episodes=0"])


def test_env_keys_drawn_before_the_loop_are_the_keys_split_inside_it():
    """`env_keys` (one batched PRNG call before a loop) gives each step's envs the keys that
    `jax.random.split(step_key, n)` inside the loop gave them, so evaluation and rollouts are
    bitwise what they were when each step split its own key."""
    from jaxrl_engine.core.phases import env_keys

    env = make_env("CartPole-v1", None)
    keys = jax.random.split(jax.random.key(5), 7)
    drawn = env_keys(env, keys, 4)
    assert drawn.shape == (7, 4)
    for t in range(7):
        expected = jax.random.key_data(jax.random.split(keys[t], 4))
        np.testing.assert_array_equal(jax.random.key_data(drawn[t]), expected)

    class Batched:  # a host env steps its whole batch with one key
        batched = True

    assert env_keys(Batched(), keys, 4) is keys


# In a fresh process at XLA's default compile flags, as a user's run compiles: the two programs
# differ in where the keys are split, and whether XLA then fuses their float math alike is the
# compiler's choice (with the suite's flags, tests/conftest.py, one CartPole coordinate of the
# two differed by 1 ulp).
KEYS_SCRIPT = """
import json, sys
import jax, numpy as np
import jaxrl_engine as jre
import jaxrl_engine.core.phases as phases

base = ["progress=false", "env.num_envs=4", "eval.num_envs=4", "algo.num_steps=64"]
cfg = jre.load_config(None, [*base, "total_env_steps=1024", *json.loads(sys.argv[1])])
leaves = {}
for before in (True, False):
    phases.KEYS_BEFORE_LOOP = before
    engine = jre.build(cfg)
    state = engine.init(jax.random.key(7))
    for _ in range(4):
        state, _ = jax.jit(engine.rollout)(state)
    leaves[before] = [
        np.asarray(
            jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x
        )
        for x in jax.tree.leaves((state.env, state.buffer, state.stats, state.rng))
    ]
assert len(leaves[True]) == len(leaves[False])
for a, b in zip(leaves[True], leaves[False], strict=True):
    np.testing.assert_array_equal(a, b)
print(len(leaves[True]))
"""


@pytest.mark.parametrize(
    "overrides",
    [[], ["algo.name=td3", "env.id=Pendulum-v1", "algo.noise=ou", "algo.learning_starts=0"]],
    ids=["ppo_cartpole", "td3_ou_pendulum"],
)
def test_rollout_keys_before_the_loop_give_the_same_trajectory(overrides):
    """`KEYS_BEFORE_LOOP` (the default) against splitting each step's key inside the rollout's
    loop: the same states, observations (auto-resets included: they use the env keys),
    actions and explore states, bitwise, over rollouts long enough for episodes to end."""
    proc = subprocess.run(
        [sys.executable, "-c", KEYS_SCRIPT, json.dumps(overrides)],
        env=subprocess_env(default_level=True),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(proc.stdout.strip().splitlines()[-1]) > 0


def test_evaluation_returns_equal_a_loop_that_splits_each_steps_key_inside():
    """The policy's keys (CartPole's step uses its env keys only to reset after an episode
    ends, which the evaluation's mask hides; the rollout test above covers the env keys)."""
    env = make_env("CartPole-v1", None)

    def policy(obs, key):
        return jax.random.randint(key, (obs.shape[0],), 0, 2)

    def reference(key, n=8):  # each step splits its own key for the envs inside the loop
        k_reset, k_steps = jax.random.split(key)
        obs, state = jax.vmap(env.reset, (0, None))(jax.random.split(k_reset, n), env.params)

        def step(carry, k):
            state, obs, ret, active = carry
            step_env = jax.vmap(env.step, (0, 0, 0, None))
            obs, state, r, term, trunc, _ = step_env(
                jax.random.split(k, n), state, policy(obs, k), env.params
            )
            ret = ret + jnp.where(active, r, 0.0)
            return (state, obs, ret, active & ~(term | trunc)), None

        init = (state, obs, jnp.zeros((n,)), jnp.ones((n,), bool))
        steps = env.spec(env.params).max_episode_steps
        return jax.lax.scan(step, init, jax.random.split(k_steps, steps))[0][2]

    key = jax.random.key(11)
    ret, _ = jax.jit(lambda k: evaluate_episodes(env, env.params, policy, 8, k))(key)
    np.testing.assert_array_equal(np.asarray(ret), np.asarray(jax.jit(reference)(key)))


@pytest.mark.parametrize("episodes", [None, 20])
def test_stopping_once_every_episode_ended_gives_the_same_returns(episodes):
    """The loop that stops when all episodes have ended (host envs' default) against the one
    that steps to the limit (JAX envs' default), on a JAX env where both run."""
    env = make_env("CartPole-v1", None)

    def policy(obs, key):
        return jax.random.randint(key, (obs.shape[0],), 0, 2)

    def run(key, until):
        return jax.jit(lambda k: evaluate_episodes(env, env.params, policy, 8, k, episodes, until))(
            key
        )

    for seed in range(3):
        key = jax.random.key(seed)
        ret, length = run(key, True)
        ref_ret, ref_length = run(key, False)
        np.testing.assert_array_equal(np.asarray(ret), np.asarray(ref_ret))
        np.testing.assert_array_equal(np.asarray(length), np.asarray(ref_length))
        assert int(length.max()) < env.spec(env.params).max_episode_steps  # random: short


def test_a_host_env_is_stepped_only_until_its_evaluation_episodes_ended():
    """A host env's evaluation stops stepping the simulator when every episode has ended
    (not at the step limit, 500 for CartPole), with the returns of the full-length loop."""
    pytest.importorskip("gymnasium")
    from jaxrl_engine.envs.gymnasium_env import GymnasiumEnv

    env = GymnasiumEnv("CartPole-v1", 4, 8)
    params = env.eval_set({})
    calls = []
    host_step = env._host_step

    def counted(*args):
        calls.append(1)
        return host_step(*args)

    env._host_step = counted

    def policy(obs, key):
        return jax.random.randint(key, (obs.shape[0],), 0, 2)

    try:
        key = jax.random.key(5)
        ret, length = jax.jit(lambda k: evaluate_episodes(env, params, policy, 8, k))(key)
        assert len(calls) == int(length.max()) < 500
        calls.clear()
        ref_ret, ref_length = jax.jit(
            lambda k: evaluate_episodes(env, params, policy, 8, k, until_all_ended=False)
        )(key)
        assert len(calls) == 500
        np.testing.assert_array_equal(np.asarray(ret), np.asarray(ref_ret))
        np.testing.assert_array_equal(np.asarray(length), np.asarray(ref_length))
    finally:
        env.close()
