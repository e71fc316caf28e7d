"""Replay buffer behaviours: wrap-around, fixed-mode overflow, sampling, flags, priorities."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxrl_engine.buffers import replay
from jaxrl_engine.buffers.rollout import Transition

NUM_ENVS = 3


def trajectory(start: int, steps: int, num_envs: int = NUM_ENVS) -> Transition:
    """Transitions whose obs encode (global step, env): obs = 1000 * step + env."""
    t = np.arange(start, start + steps)[:, None]
    e = np.arange(num_envs)[None, :]
    ids = (1000 * t + e).astype(np.float32)
    terminated = (t % 3 == 0) & (e == 0)
    truncated = (t % 4 == 1) & (e == 1)
    return Transition(
        obs=jnp.asarray(ids[..., None].repeat(2, -1)),
        action=jnp.asarray((t + e) % 2, jnp.int32) * jnp.ones_like(jnp.asarray(ids), jnp.int32),
        reward=jnp.asarray(ids),
        terminated=jnp.asarray(np.broadcast_to(terminated, ids.shape)),
        truncated=jnp.asarray(np.broadcast_to(truncated, ids.shape)),
        next_obs=jnp.asarray(ids[..., None].repeat(2, -1) + 0.5),
        extras={},
    )


def empty(capacity_per_env: int, mode: str = "circular") -> replay.ReplayBuffer:
    item = jax.tree.map(lambda x: x[0], trajectory(0, 1))
    return replay.init(item, capacity_per_env, mode)  # type: ignore[arg-type]


add = jax.jit(replay.add, donate_argnums=0)


def test_layout_is_capacity_per_env_by_num_envs():
    buf = empty(10)
    assert buf.data.obs.shape == (10, NUM_ENVS, 2)
    assert buf.data.reward.shape == (10, NUM_ENVS)
    assert buf.capacity == 30 and int(buf.size()) == 0


@settings(max_examples=20, deadline=None)
@given(cap=st.integers(1, 12), chunks=st.lists(st.integers(1, 7), min_size=1, max_size=6))
def test_circular_wraps_around_keeping_the_newest_rows_in_ring_order(cap, chunks):
    buf, step = empty(cap), 0
    for n in chunks:
        buf = replay.add(buf, trajectory(step, n))
        step += n
    assert int(buf.count) == step and int(buf.position) == step % cap
    assert int(buf.size()) == min(step, cap) * NUM_ENVS
    # Row r holds the newest step s with s % cap == r; rows never written stay zero.
    stored = np.asarray(buf.data.reward)[:, 0] // 1000
    for row in range(cap):
        written = [s for s in range(step) if s % cap == row]
        if written:
            assert stored[row] == max(written)
        else:
            assert np.asarray(buf.data.reward)[row].sum() == 0


def test_wrap_around_order_oldest_first_from_position():
    buf = replay.add(empty(5), trajectory(0, 7))  # steps 0..6 into 5 rows
    order = (int(buf.position) + np.arange(5)) % 5
    oldest_first = np.asarray(buf.data.reward)[order, 1] // 1000
    np.testing.assert_array_equal(oldest_first, [2, 3, 4, 5, 6])


def test_fixed_mode_overflow_drops_rows_overwrites_nothing_and_raises_on_the_host():
    buf = replay.add(empty(5, "fixed"), trajectory(0, 4))
    replay.check_not_overflowed(buf)  # 4 of 5 rows: fine
    before = np.asarray(buf.data.reward).copy()
    buf = replay.add(buf, trajectory(4, 3))  # only step 4 fits
    assert bool(buf.overflowed) and int(buf.size()) == 5 * NUM_ENVS
    np.testing.assert_array_equal(np.asarray(buf.data.reward)[:4], before[:4])
    assert np.asarray(buf.data.reward)[4, 0] == 4000
    with pytest.raises(replay.BufferOverflowError, match=r"algo.buffer_size"):
        replay.check_not_overflowed(buf)
    buf = replay.add(buf, trajectory(7, 2))
    np.testing.assert_array_equal(np.asarray(buf.data.reward)[:, 0], [0, 1000, 2000, 3000, 4000])


def test_fixed_mode_overflow_is_flagged_inside_jit_too():
    buf = add(empty(2, "fixed"), trajectory(0, 3))
    assert bool(buf.overflowed)


@settings(max_examples=15, deadline=None)
@given(cap=st.integers(2, 20), steps=st.integers(1, 19), seed=st.integers(0, 2**16))
def test_sampling_never_returns_unwritten_slots(cap, steps, seed):
    buf = replay.add(empty(cap), trajectory(1, steps))  # written rewards are >= 1000
    rows, envs = replay.sample_uniform(buf, jax.random.key(seed), (64,))
    got = replay.gather(buf, rows, envs)
    assert np.all(np.asarray(got.reward) >= 1000)
    assert np.all(np.asarray(rows) < min(steps, cap))
    prio = jnp.ones((cap, NUM_ENVS)).at[-1].set(1e6)  # huge priority on a row maybe unwritten
    rows, envs, w = replay.sample_prioritized(buf, prio, jax.random.key(seed), (64,), 1.0, 0.4)
    assert np.all(np.asarray(replay.gather(buf, rows, envs).reward) >= 1000)
    assert np.all((np.asarray(w) > 0) & (np.asarray(w) <= 1))


def test_terminated_and_truncated_are_stored_apart_and_sampled_with_their_transition():
    traj = trajectory(0, 12)
    buf = replay.add(empty(16), traj)
    rows, envs = replay.sample_uniform(buf, jax.random.key(0), (500,))
    got = replay.gather(buf, rows, envs)
    step = np.asarray(got.reward) // 1000
    env = np.asarray(got.reward) % 1000
    np.testing.assert_array_equal(np.asarray(got.terminated), (step % 3 == 0) & (env == 0))
    np.testing.assert_array_equal(np.asarray(got.truncated), (step % 4 == 1) & (env == 1))
    assert np.asarray(got.terminated).any() and np.asarray(got.truncated).any()
    assert not (np.asarray(got.terminated) & np.asarray(got.truncated)).any()
    np.testing.assert_array_equal(np.asarray(got.next_obs)[:, 0], np.asarray(got.reward) + 0.5)
    assert got.terminated.dtype == jnp.bool_ and got.truncated.dtype == jnp.bool_


def test_prioritized_sampling_frequencies_match_priorities():
    """200,000 draws over 12 slots with P(i) = p_i**alpha / sum; each observed frequency must be
    within 5 standard errors (sqrt(P(1 - P) / n)) of P(i): a false failure has probability
    < 1e-5 per slot, and the key is fixed, so the test is deterministic."""
    buf = replay.add(empty(4), trajectory(0, 4))  # 4 rows x 3 envs, all written
    prio = jnp.asarray(np.arange(1, 13, dtype=np.float32).reshape(4, 3))
    alpha, n = 0.7, 200_000
    rows, envs, weights = replay.sample_prioritized(
        buf, prio, jax.random.key(42), (n,), alpha, beta=0.5
    )
    flat = np.asarray(rows) * NUM_ENVS + np.asarray(envs)
    freq = np.bincount(flat, minlength=12) / n
    want = np.arange(1, 13) ** alpha / (np.arange(1, 13) ** alpha).sum()
    tolerance = 5 * np.sqrt(want * (1 - want) / n)
    assert np.all(np.abs(freq - want) <= tolerance), (freq, want)
    # Importance weights: (N P(i))^-beta over the max; the least likely slot has weight 1.
    w = np.asarray(weights)
    expected = (12 * want[flat]) ** -0.5
    np.testing.assert_allclose(w, expected / expected.max(), rtol=1e-4)


def test_prioritized_weights_are_normalised_in_each_minibatch():
    """Schaul et al.: each minibatch's weights are divided by that minibatch's largest, so
    every gradient step's largest weight is 1 (not only the epoch's luckiest minibatch)."""
    buf = replay.add(empty(4), trajectory(0, 4))
    prio = jnp.asarray(np.geomspace(1, 1e3, 12, dtype=np.float32).reshape(4, 3))
    rows, envs, weights = replay.sample_prioritized(
        buf, prio, jax.random.key(3), (64, 8), 1.0, beta=1.0
    )
    w = np.asarray(weights)
    np.testing.assert_allclose(w.max(axis=1), 1.0, rtol=1e-6)
    p = np.asarray(prio).reshape(-1) / np.asarray(prio).sum()
    raw = (12 * p[np.asarray(rows) * NUM_ENVS + np.asarray(envs)]) ** -1.0
    np.testing.assert_allclose(w, raw / raw.max(axis=1, keepdims=True), rtol=1e-4)
    assert len(np.unique(np.round(raw.max(axis=1), 3))) > 1  # the minibatches' maxima differ


def test_adding_inside_a_donating_jit_reuses_the_buffer():
    buf = empty(1000)
    leaf = buf.data.obs
    out = add(buf, trajectory(0, 8))
    assert leaf.is_deleted()
    assert int(out.count) == 8
