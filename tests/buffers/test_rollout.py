"""The minibatch shuffle PPO uses: a uniformly random permutation, cheaper than jax's."""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_engine.buffers.rollout import PERMUTATION_BITS, permutation


@pytest.mark.parametrize("n", [1, 2, 3, 7, 512, 2048, 3000])
def test_every_index_appears_once(n):
    perm = np.asarray(jax.jit(permutation, static_argnums=1)(jax.random.key(n), n))
    assert perm.dtype == np.int32 and perm.shape == (n,)
    np.testing.assert_array_equal(np.sort(perm), np.arange(n))


def test_same_key_same_permutation_other_key_another():
    a, b, c = (np.asarray(permutation(jax.random.key(k), 2048)) for k in (0, 0, 1))
    np.testing.assert_array_equal(a, b)
    assert (a != c).any()


def test_all_orders_of_four_are_equally_likely():
    """24,000 draws of a permutation of 4: each of the 24 orders within 5 sigma of 1,000
    (a biased tie-break, e.g. too few random bits, shows as orders drawn too often)."""
    draws = np.asarray(
        jax.jit(jax.vmap(permutation, (0, None)), static_argnums=1)(
            jax.random.split(jax.random.key(7), 24_000), 4
        )
    )
    counts = {order: 0 for order in itertools.permutations(range(4))}
    for row in map(tuple, draws.tolist()):
        counts[row] += 1
    expected, sigma = 1000, math.sqrt(1000 * (1 - 1 / 24))
    assert all(abs(c - expected) < 5 * sigma for c in counts.values()), counts


def test_positions_are_uniform_for_a_rollout_sized_batch():
    """Over 400 shuffles of 2048 indices, where index 0 lands is uniform over the 4 minibatch
    quarters, and so is where the last index lands (chi-square at 4 sigma)."""
    draws = np.asarray(
        jax.jit(jax.vmap(permutation, (0, None)), static_argnums=1)(
            jax.random.split(jax.random.key(3), 400), 2048
        )
    )
    for index in (0, 2047):
        quarter = np.argmax(draws == index, axis=1) // 512
        counts = np.bincount(quarter, minlength=4)
        chi2 = ((counts - 100) ** 2 / 100).sum()
        assert chi2 < 3 + 4 * math.sqrt(6), (index, counts)


def test_rounds_drawn_in_one_call_are_the_per_round_draws():
    """The rounds' random bits come from one batched PRNG call (one loop to compile on CPU,
    not one per round): the permutation is the one a call per round key gives."""

    def per_round(key, n):
        index_bits = (n - 1).bit_length()
        low = jnp.uint32((1 << index_bits) - 1)
        perm = jax.lax.iota(jnp.int32, n)
        for round_key in jax.random.split(key, -(-PERMUTATION_BITS // (32 - index_bits))):
            packed = (jax.random.bits(round_key, (n,), jnp.uint32) & ~low) | jnp.arange(
                n, dtype=jnp.uint32
            )
            perm = perm[(jnp.sort(packed) & low).astype(jnp.int32)]
        return perm

    keys = jax.random.split(jax.random.key(11), 4)
    for n in (100, 2048):
        np.testing.assert_array_equal(
            jax.vmap(permutation, (0, None))(keys, n), jax.vmap(per_round, (0, None))(keys, n)
        )
