"""The on-policy rollout buffer: one epoch's trajectory, `[num_steps, num_envs, ...]`."""

from __future__ import annotations

from typing import NamedTuple

import jax


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
