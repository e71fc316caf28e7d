"""PPO pieces a user relies on: GAE bootstrapping, action shapes, loss behaviour."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxrl_engine.algos.ppo import gae


def reference_gae(reward, value, next_value, terminated, truncated, gamma, lam):
    T, N = reward.shape
    adv = np.zeros((T, N))
    for n in range(N):
        running = 0.0
        for t in reversed(range(T)):
            bootstrap = 0.0 if terminated[t, n] else next_value[t, n]
            delta = reward[t, n] + gamma * bootstrap - value[t, n]
            if terminated[t, n] or truncated[t, n]:
                running = 0.0
            running = delta + gamma * lam * running
            adv[t, n] = running
    return adv, adv + value


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    T=st.integers(1, 12),
    N=st.integers(1, 4),
    gamma=st.floats(0.5, 1.0),
    lam=st.floats(0.0, 1.0),
)
def test_gae_matches_reference_with_terminated_and_truncated(seed, T, N, gamma, lam):
    rng = np.random.default_rng(seed)
    reward, value, next_value = (rng.normal(size=(T, N)).astype(np.float32) for _ in range(3))
    terminated = rng.random((T, N)) < 0.2
    truncated = (rng.random((T, N)) < 0.2) & ~terminated
    adv, ret = gae(
        jnp.asarray(reward),
        jnp.asarray(value),
        jnp.asarray(next_value),
        jnp.asarray(terminated, jnp.float32),
        jnp.asarray(truncated, jnp.float32),
        gamma,
        lam,
    )
    want_adv, want_ret = reference_gae(reward, value, next_value, terminated, truncated, gamma, lam)
    np.testing.assert_allclose(adv, want_adv, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ret, want_ret, rtol=1e-4, atol=1e-4)


def test_truncation_bootstraps_and_termination_does_not():
    one = jnp.ones((1, 1))
    zero = jnp.zeros((1, 1))
    kwargs = dict(reward=one, value=zero, next_value=10 * one, gamma=0.9, gae_lambda=0.95)
    adv_trunc, _ = gae(terminated=zero, truncated=one, **kwargs)
    adv_term, _ = gae(terminated=one, truncated=zero, **kwargs)
    assert float(adv_trunc[0, 0]) == np.float32(1 + 0.9 * 10)
    assert float(adv_term[0, 0]) == 1.0


def test_continuous_actions_have_env_shape_and_are_clipped_for_the_env(tmp_path):
    import jaxrl_engine as jre
    from tests.conftest import small_config

    engine = jre.build(small_config("env.id=Pendulum-v1", tmp_path=tmp_path))
    state = engine.init(jax.random.key(0))
    action, extras = engine.algo.act(state.eval_params, state.env.obs, jax.random.key(1), False)
    assert action.shape == (4, 1)
    assert extras["log_prob"].shape == (4,)
    big = jnp.full((4, 1), 100.0)
    assert float(engine.spec.action.clip(big).max()) == 2.0


def test_minibatches_of_one_sample_keep_their_advantage_and_learn(tmp_path):
    # Normalising one sample's advantage gives 0 (its own mean): the policy never moved.
    import jaxrl_engine as jre
    from tests.conftest import small_config

    cfg = small_config(
        "algo.num_steps=4", "algo.num_minibatches=16", "algo.update_epochs=1", tmp_path=tmp_path
    )  # 4 envs x 4 steps: 16 minibatches of one sample
    engine = jre.build(cfg)
    state = engine.init(jax.random.key(0))
    before = jax.device_get(state.train.params)
    state, metrics = engine.epoch(state)
    assert float(metrics["train/policy_loss"]) != 0.0
    actor_head = ("params", "MLP_0", "Dense_2", "kernel")  # the logits layer
    old, new = before, jax.device_get(state.train.params)
    for key in actor_head:
        old, new = old[key], new[key]
    assert not np.array_equal(old, new), "the policy did not move"
