"""The engine's five phases, each `state -> (state, metrics)`, built from an env and an algorithm.

RLightning's `BaseEngine` order, per epoch: rollout -> update_dataset -> train -> sync_weights,
with evaluate every `eval.interval` epochs. Every phase is pure; `Engine` jits and hooks them,
and any of them can be replaced by a user's own (`Engine(..., phases={...})`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_engine.buffers.rollout import Transition
from jaxrl_engine.core.protocols import Algorithm, Env, EnvSpec, Metrics
from jaxrl_engine.core.state import EngineState, EnvCarry, EpisodeStats, Phase

PHASES = ("rollout", "evaluate", "update_dataset", "train", "sync_weights")
EPOCH_PHASES = ("rollout", "update_dataset", "train", "sync_weights")
EVAL_STREAM = 0x0E7A1  # fold_in constant: evaluation never advances the training key
# The rollout's per-step keys (acting, env) are drawn before its loop, in batched PRNG calls
# (`env_keys`), not split inside the loop body (same keys; `benchmarks/ppo_throughput.py`
# switches it off in an ablation row).
KEYS_BEFORE_LOOP = True
# The metric a train call that may idle reports (`core.nan_guard.working_key("train")`): 1 when
# it took its gradient steps, 0 when it took none (off-policy, before `learning_starts`).
TRAIN_LEARNING = "train/learning"


def episode_stats(
    stats: EpisodeStats, reward: jax.Array, done: jax.Array
) -> tuple[EpisodeStats, Metrics]:
    """Advance the running episode statistics over a rollout's `[T, N]` rewards and ends.

    Vectorised, no loop: per env, the returns of the episodes that ended in the rollout sum to
    the carried-in return plus the reward up to its last end (the sums between ends telescope);
    likewise their lengths. What follows the last end is carried out.
    """
    T = reward.shape[0]
    last = jnp.max(jnp.where(done, jnp.arange(T)[:, None], -1), axis=0)  # [N], -1: no end
    ended = last >= 0
    cumulative = jnp.cumsum(reward, axis=0)
    upto_last = jnp.take_along_axis(cumulative, jnp.maximum(last, 0)[None], axis=0)[0]
    count = done.sum(dtype=jnp.int32)
    total = jnp.where(ended, stats.current_return + upto_last, 0.0).sum()
    length_total = jnp.where(ended, stats.current_length + last + 1, 0).sum()
    finished = count > 0
    mean_return = jnp.where(finished, total / jnp.maximum(count, 1), stats.last_return)
    mean_length = jnp.where(
        finished, length_total / jnp.maximum(count, 1), stats.last_length
    ).astype(jnp.float32)
    new = EpisodeStats(
        current_return=jnp.where(
            ended, cumulative[-1] - upto_last, stats.current_return + cumulative[-1]
        ),
        current_length=jnp.where(ended, T - 1 - last, stats.current_length + T).astype(jnp.int32),
        last_return=mean_return,
        last_length=mean_length,
        episodes=stats.episodes + count,
    )
    return new, {
        "rollout/episode_return": mean_return,
        "rollout/episode_length": mean_length,
        "rollout/episodes": count,
        "rollout/reward_mean": reward.mean(),
    }


def interquartile_mean(x: jax.Array) -> jax.Array:
    """The mean of the middle 50% of `x` (rliable's IQM: `len(x) // 4` dropped at each end)."""
    cut = x.shape[0] // 4
    return jnp.sort(x)[cut : x.shape[0] - cut].mean()


def reset_batch(env: Env, key: jax.Array, params: Any, n: int) -> tuple[jax.Array, Any]:
    """`n` envs reset: vmapped over `n` keys, or one call for a `batched` env (a host env
    steps its whole batch at once)."""
    if getattr(env, "batched", False):
        return env.reset(key, params)
    return jax.vmap(env.reset, (0, None))(jax.random.split(key, n), params)


def env_keys(env: Env, keys: jax.Array, n: int) -> jax.Array:
    """The keys `step_batch` takes for each of `keys` (one per loop step): `[steps, n]`, one per
    env, or `keys` themselves for a `batched` env. Drawn before a loop, in one batched PRNG call
    (on CPU a PRNG call in a loop body is a small loop of its own, run at every step); the same
    keys as splitting each step's key inside the loop."""
    if getattr(env, "batched", False):
        return keys
    return jax.vmap(lambda k: jax.random.split(k, n))(keys)


def step_batch(env: Env, keys: jax.Array, state: Any, action: jax.Array, params: Any):
    """The batch of envs stepped with `keys` (`env_keys`: one per env, or one key for a
    `batched` env, see `reset_batch`): the gymnax 6-tuple with a leading env axis."""
    if getattr(env, "batched", False):
        return env.step(keys, state, action, params)
    return jax.vmap(env.step, (0, 0, 0, None))(keys, state, action, params)


def evaluate_episodes(
    env: Env,
    env_params: Any,
    policy: Callable[[jax.Array, jax.Array], jax.Array],
    num_episodes: int,
    key: jax.Array,
    episodes: int | None = None,
    until_all_ended: bool | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Returns and lengths (`[episodes]`) of evaluation episodes, each to its end or the env's
    step limit, on `num_episodes` envs: one round of one episode per env, or (`episodes` more
    than the envs) `ceil(episodes / num_episodes)` rounds of fresh episodes, the first
    `episodes` kept. policy: `policy(obs [n, *obs_shape], key) -> action` as the env takes it.

    The one evaluation loop: the engine's `evaluate` phase and `jaxrl-engine eval` (an
    exported policy) both run it. until_all_ended: stop stepping once every episode has ended
    (a `while_loop`) instead of stepping to the env's step limit (a `scan`); the returns and
    lengths are the same. None: for a `batched` env (a host simulator, whose every step is the
    whole batch's Python or C work), not for a JAX env (its fixed scan is vectorised and
    cheap, and on an accelerator a data-dependent loop waits on the device at every step).
    """
    if episodes is not None and episodes != num_episodes:
        rounds = -(-episodes // num_episodes)
        keys = jax.random.split(key, rounds)
        ret, length = jax.lax.map(
            lambda k: evaluate_episodes(
                env, env_params, policy, num_episodes, k, until_all_ended=until_all_ended
            ),
            keys,
        )
        return ret.reshape(-1)[:episodes], length.reshape(-1)[:episodes]
    max_steps = env.spec(env_params).max_episode_steps
    k_reset, k_steps = jax.random.split(key)
    obs, env_state = reset_batch(env, k_reset, env_params, num_episodes)

    def step(carry, keys):
        key, keys_env = keys
        env_state, obs, ret, length, active = carry
        obs, env_state, reward, terminated, truncated, _ = step_batch(
            env, keys_env, env_state, policy(obs, key), env_params
        )
        ret = ret + jnp.where(active, reward, 0.0)
        length = length + active
        active = active & ~(terminated | truncated)
        return (env_state, obs, ret, length, active), None

    n = num_episodes
    init = (env_state, obs, jnp.zeros((n,)), jnp.zeros((n,), jnp.int32), jnp.ones((n,), bool))
    keys = jax.random.split(k_steps, max_steps)
    step_keys = (keys, env_keys(env, keys, n))
    if until_all_ended is None:
        until_all_ended = getattr(env, "batched", False)
    if not until_all_ended:
        (_, _, ret, length, _), _ = jax.lax.scan(step, init, step_keys)
        return ret, length

    def running(carry: tuple[jax.Array, Any]) -> jax.Array:
        i, (*_, active) = carry
        return (i < max_steps) & active.any()

    def next_step(carry: tuple[jax.Array, Any]) -> tuple[jax.Array, Any]:
        i, state = carry
        return i + 1, step(state, jax.tree.map(lambda k: k[i], step_keys))[0]

    _, (_, _, ret, length, _) = jax.lax.while_loop(running, next_step, (jnp.int32(0), init))
    return ret, length


@dataclass(frozen=True)
class PhaseBuilder:
    """The default phases of an env + algorithm pair (static sizes fixed here)."""

    env: Env
    algorithm: Algorithm
    env_params: Any
    eval_env_params: Any
    num_envs: int
    num_steps: int
    eval_envs: int
    eval_episodes: int | None = None  # (None: eval_envs)
    eval_deterministic: bool = True

    @property
    def spec(self) -> EnvSpec:
        return self.env.spec(self.env_params)

    @property
    def steps_per_epoch(self) -> int:
        return self.num_steps * self.num_envs

    def collect(self, params: Any, env: EnvCarry, stats: EpisodeStats, key: jax.Array):
        """`num_steps` of (policy step, env step), vmapped over envs.

        Returns (env, stats, trajectory, metrics). The scan carries only the env state and the
        observation (and, for an algorithm with an `Explore`, its state and the last step's
        episode ends): on CPU each operation in the loop body costs a dispatch per step, so the
        episode statistics are computed after it, vectorised over the trajectory.
        """
        algo, spec, explore = self.algorithm, self.spec, self.algorithm.explore

        def step(carry, keys: Any):
            if KEYS_BEFORE_LOOP:
                k_act, keys_env = keys
            else:
                k_act, k_env = jax.random.split(keys)
                keys_env = env_keys(self.env, k_env[None], self.num_envs)[0]
            env_state, last_obs, *acting = carry
            if explore is None:
                action, extras = algo.act(params, last_obs, k_act, False)
            else:
                explore_state, first = acting
                action, extras, explore_state = explore.act(
                    params, explore_state, last_obs, first, k_act
                )
            obs, env_state, reward, terminated, truncated, info = step_batch(
                self.env, keys_env, env_state, spec.action.clip(action), self.env_params
            )
            transition = Transition(
                obs=last_obs,
                action=action,
                reward=reward.astype(jnp.float32),
                terminated=terminated,
                truncated=truncated,
                next_obs=info["final_observation"],
                extras=extras,
            )
            if explore is None:
                return (env_state, obs), transition
            return (env_state, obs, explore_state, terminated | truncated), transition

        keys: Any = jax.random.split(key, self.num_steps)
        if KEYS_BEFORE_LOOP:  # each step's (act, env) keys, drawn before the loop
            pairs = jax.vmap(jax.random.split)(keys)
            keys = (pairs[:, 0], env_keys(self.env, pairs[:, 1], self.num_envs))
        init = (
            (env.state, env.obs) if explore is None else (env.state, env.obs, env.explore, env.done)
        )
        (env_state, obs, *acting), trajectory = jax.lax.scan(step, init, keys)
        done = trajectory.terminated | trajectory.truncated  # [T, N]
        stats, metrics = episode_stats(stats, trajectory.reward, done)
        env = EnvCarry(env_state, obs, done[-1], acting[0] if acting else None)
        return env, stats, algo.complete_trajectory(params, trajectory), metrics

    def store(self, state: EngineState, trajectory: Any) -> EngineState:
        """The trajectory written to the buffer and counted in `counters.env_steps`."""
        return state.replace(
            buffer=self.algorithm.add_to_buffer(state.buffer, trajectory),
            counters=state.counters.replace(
                env_steps=state.counters.env_steps + self.steps_per_epoch
            ),
        )

    def rollout(self, state: EngineState) -> tuple[EngineState, Metrics]:
        rng, key = jax.random.split(state.rng)
        env, stats, traj, metrics = self.collect(state.eval_params, state.env, state.stats, key)
        state = self.store(state.replace(env=env, stats=stats, rng=rng), traj)
        return state, metrics

    def evaluate(self, state: EngineState) -> tuple[EngineState, Metrics]:
        """`eval_episodes` episodes on fresh eval envs (own env params), greedy actions unless
        `eval_deterministic` is off; the state is not advanced. Returns mean, std and IQM."""
        algo, spec, greedy = self.algorithm, self.spec, self.eval_deterministic

        def policy(obs: jax.Array, key: jax.Array) -> jax.Array:
            return spec.action.clip(algo.act(state.eval_params, obs, key, greedy)[0])

        key = jax.random.fold_in(state.rng, EVAL_STREAM)
        ret, length = evaluate_episodes(
            self.env, self.eval_env_params, policy, self.eval_envs, key, self.eval_episodes
        )
        return state, {
            "evaluate/episode_return": ret.mean(),
            "evaluate/episode_return_std": ret.std(),
            "evaluate/episode_return_iqm": interquartile_mean(ret),
            "evaluate/episode_length": length.mean().astype(jnp.float32),
        }

    def update_dataset(self, state: EngineState) -> tuple[EngineState, Metrics]:
        rng, key = jax.random.split(state.rng)
        out = self.algorithm.update_dataset(state.train, state.buffer, key, state.hparams)
        train_state, batch, metrics = self._returned(out, "update_dataset", 3)
        return state.replace(train=train_state, batch=batch, rng=rng), metrics

    def train(self, state: EngineState) -> tuple[EngineState, Metrics]:
        """The algorithm's train call; counts the gradient steps it took in
        `counters.grad_steps`: `grad_steps_per_epoch`, or none when the call idled (its
        `train/learning` metric is 0: off-policy before `learning_starts`)."""
        rng, key = jax.random.split(state.rng)
        out = self.algorithm.train(state.train, state.buffer, state.batch, key, state.hparams)
        train_state, metrics = self._returned(out, "train", 2)
        taken = jnp.int32(self.algorithm.grad_steps_per_epoch)
        learning = metrics.get(TRAIN_LEARNING)
        if learning is not None:
            taken = jnp.where(learning > 0, taken, jnp.int32(0))
        counters = state.counters.replace(grad_steps=state.counters.grad_steps + taken)
        return state.replace(train=train_state, rng=rng, counters=counters), metrics

    def _returned(self, out: Any, method: str, size: int) -> Any:
        """`out` when it is the tuple `Algorithm.<method>` returns, else a TypeError naming
        the algorithm's method and what it returns (not an unpacking error)."""
        if isinstance(out, tuple) and len(out) == size and isinstance(out[-1], Mapping):
            return out
        what = {
            "train": "(train_state, metrics)",
            "update_dataset": "(train_state, batch, metrics)",
        }
        got = f"a tuple of {len(out)}" if isinstance(out, tuple) else type(out).__name__
        raise TypeError(
            f"algorithm {getattr(self.algorithm, 'name', '?')!r}: its {method} returned {got}; "
            f"Algorithm.{method} returns {what[method]}, metrics a dict of scalars"
        )

    def sync_weights(self, state: EngineState) -> tuple[EngineState, Metrics]:
        """Train params -> acting params; closes the epoch (`counters.epoch += 1`)."""
        state = state.replace(
            eval_params=self.algorithm.acting_params(state.train, state.hparams),
            eval_version=state.eval_version + 1,
            counters=state.counters.replace(epoch=state.counters.epoch + 1),
        )
        return state, {"sync_weights/version": state.eval_version}

    def phases(self) -> dict[str, Phase]:
        return {name: getattr(self, name) for name in PHASES}


def merge_metrics(metrics: dict[str, Any], new: Mapping[str, Any], phase: str) -> None:
    """`metrics` updated with phase `phase`'s; a key an earlier phase of the epoch returned is
    a ValueError (one would silently replace the other in the epoch's logged metrics)."""
    for key in new:
        if key in metrics:
            raise ValueError(
                f"phase '{phase}' returned metric {key!r}, which an earlier phase of the epoch "
                f"also returned: give each phase's metrics its own prefix ('{phase}/...')"
            )
    metrics.update(new)
