"""The on-policy rollout buffer: one epoch's trajectory, `[num_steps, num_envs, ...]`."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class Transition(NamedTuple):
    """One env step for a batch of envs (a trajectory stacks these on a leading time axis).

    next_obs is the observation the step produced *before* auto-reset (gymnax's
    `final_observation`), so a truncated step can bootstrap from it; terminated and truncated
    stay apart.
    """

    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    next_obs: jax.Array
    extras: dict[str, jax.Array]


PERMUTATION_BITS = 64  # random key bits per element over all rounds (as jax.random.permutation)


def permutation(key: jax.Array, n: int) -> jax.Array:
    """A uniformly random permutation of `range(n)` (int32), as `jax.random.permutation`,
    several times cheaper to run on CPU (2.7x for n = 2048, see benchmarks/RESULTS.md).

    `jax.random.permutation` sorts (random key, value) pairs, two rounds of 32-bit keys; XLA's
    CPU sort of two operands calls a compiled comparator per comparison. Here each round
    sorts a single uint32 operand, random bits above the element's current position, which
    XLA sorts natively: ties in the random bits keep the previous round's (random) order, as
    in jax's rounds. Rounds are added until the random bits reach 64 per element, so a
    pair's order is decided by its current position only if it tied in every round (expected
    pairs: n^2 / 2^65, jax's bound). Past 2^24 elements this defers to
    `jax.random.permutation`.
    """
    index_bits = max(1, (n - 1).bit_length())
    random_bits = 32 - index_bits
    if random_bits < 8:
        return jax.random.permutation(key, n)
    low = jnp.uint32((1 << index_bits) - 1)
    position = jax.lax.iota(jnp.uint32, n)
    perm = jax.lax.iota(jnp.int32, n)
    round_keys = jax.random.split(key, -(-PERMUTATION_BITS // random_bits))
    # Every round's bits in one batched PRNG call: the same bits as one call per round key
    # (on CPU each PRNG call compiles to a loop of its own).
    bits = jax.vmap(lambda k: jax.random.bits(k, (n,), jnp.uint32))(round_keys)
    for round_bits in bits:
        packed = (round_bits & ~low) | position
        perm = perm[(jnp.sort(packed) & low).astype(jnp.int32)]
    return perm
