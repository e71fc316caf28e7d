"""The two protocols the core is written against: `Env` (gymnax 1.0) and `Algorithm`.

An env steps one instance; the engine vmaps it over `num_envs`. `step` auto-resets: when
`terminated | truncated`, the returned observation is the first of a new episode and
`info["final_observation"]` is the last observation of the finished one.

An algorithm is a bundle of pure functions (the way optax builds a `GradientTransformation`):
no config object, numeric hyperparameters passed in as a traced `hparams` pytree, shapes fixed
when the bundle is built.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np

# `typing.Dict`, not `dict`: only a `typing` alias takes a docstring (what `help(jre.Metrics)`
# shows; `dict[...]` would show dict's).
Metrics = typing.Dict[str, jax.Array]  # noqa: UP006
Metrics.__doc__ = """What a phase returns beside the state: a flat dict of scalar arrays, named
`<phase>/<name>` (`"rollout/episode_return"`, `"train/loss"`).

An epoch's phases' metrics are merged into one record per epoch (metrics.jsonl, the loggers);
a float metric is NaN (logged as null) where nothing was computed, e.g. an off-policy loss
before `learning_starts` (the phase's `<phase>/learning` metric is then 0).
"""


@dataclass(frozen=True)
class ActionSpec:
    """Discrete (`num_actions` set) or continuous (`low`/`high` set) actions of one env."""

    shape: tuple[int, ...]
    dtype: Any
    num_actions: int | None = None
    low: float | tuple[float, ...] | None = None
    high: float | tuple[float, ...] | None = None

    def __post_init__(self) -> None:  # a list given for the shape is taken as a tuple
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if self.num_actions is not None and int(self.num_actions) < 1:
            raise ValueError(f"ActionSpec: num_actions={self.num_actions}: at least 1")
        if self.num_actions is not None or self.low is None or self.high is None:
            return
        # Continuous bounds: one value per action dimension (a scalar is every dimension's),
        # kept flat; bounds that would clip every action to one value are refused.
        size = int(np.prod(self.shape))
        bounds = []
        for name, value in (("low", self.low), ("high", self.high)):
            flat = np.ravel(np.asarray(value, np.float64))
            if flat.size not in (1, size):
                raise ValueError(
                    f"ActionSpec: {name} has {flat.size} values for the action shape "
                    f"{self.shape} ({size}): give one per dimension, or one for all"
                )
            if np.isnan(flat).any():
                raise ValueError(f"ActionSpec: {name} {tuple(flat.tolist())} holds NaN")
            bounds.append(np.broadcast_to(flat, (size,)))
        low, high = bounds
        if (low > high).any():
            i = int(np.argmax(low > high))
            raise ValueError(
                f"ActionSpec: low[{i}]={low[i]:g} > high[{i}]={high[i]:g}: every action would "
                "be clipped to one value (are low and high swapped?)"
            )
        object.__setattr__(self, "low", tuple(low.tolist()))
        object.__setattr__(self, "high", tuple(high.tolist()))

    @property
    def discrete(self) -> bool:
        return self.num_actions is not None

    def clip(self, action: jax.Array) -> jax.Array:
        """What the env receives: continuous actions clipped to [low, high]."""
        if self.discrete:
            return action
        low = jnp.asarray(self.low, jnp.float32).reshape(self.shape)
        high = jnp.asarray(self.high, jnp.float32).reshape(self.shape)
        # (explicit broadcasts over the batch: no rank promotion)
        return jnp.clip(
            action, jnp.broadcast_to(low, action.shape), jnp.broadcast_to(high, action.shape)
        )


@dataclass(frozen=True)
class EnvSpec:
    """Shapes and dtypes of one env instance, read from the env itself."""

    env_id: str
    obs_shape: tuple[int, ...]
    obs_dtype: Any
    action: ActionSpec
    max_episode_steps: int
    # Axis order of image (rank-3) observations: "hwc" (gymnax, gymnasium) or "chw" (EnvPool);
    # None: not declared, read as "hwc".
    obs_layout: str | None = None

    def __post_init__(self) -> None:  # a list given for the shape is taken as a tuple
        object.__setattr__(self, "obs_shape", tuple(int(d) for d in self.obs_shape))


class Env(Protocol):
    """gymnax 1.0: `reset(key, params)`, `step(key, state, action, params)` (6-tuple).

    params: the env's default parameters (a dataclass with `replace`); `spec(params)` reads
    observation and action spaces and the episode limit for those parameters.

    An env may set `batched = True`: then `reset(key, params)` and `step(key, state, action,
    params)` take and return the whole env batch (leading axis) in one call, and the engine
    does not vmap them; host simulators are such envs (`envs/gymnasium_env.py`: one host
    callback per step for all envs). Their params say which env set a call is for (the
    training envs or the evaluation envs).
    """

    params: Any

    def reset(self, key: jax.Array, params: Any) -> tuple[jax.Array, Any]: ...

    def step(
        self, key: jax.Array, state: Any, action: jax.Array, params: Any
    ) -> tuple[jax.Array, Any, jax.Array, jax.Array, jax.Array, dict[str, Any]]: ...

    def spec(self, params: Any) -> EnvSpec: ...


class Explore(NamedTuple):
    """Exploration that carries a per-env state through the rollout (temporally correlated
    action noise such as Ornstein-Uhlenbeck; RLightning's and SB3's `action_noise`).

    init(key, num_envs) -> state, leading axis `num_envs` (the engine keeps it in
        `EnvCarry.explore`, so it is checkpointed and resumed with the env it belongs to)
    act(params, state, obs [num_envs, *obs_shape], first bool[num_envs], key)
        -> (action, extras per env, state); `first`: the observation starts an episode
        (the algorithm resets that env's state)
    When an algorithm has one, rollout acts with it in place of `act(..., deterministic=False)`;
    evaluation and export use `act` (deterministic by default) and need no state.
    """

    init: Callable[[jax.Array, int], Any]
    act: Callable[
        [Any, Any, jax.Array, jax.Array, jax.Array], tuple[jax.Array, dict[str, jax.Array], Any]
    ]


class Algorithm(NamedTuple):
    """What an algorithm supplies to the engine; every function is pure and jittable.

    The engine supplies the rest: rollout loop, env batching, the buffer's place in the state,
    hooks, evaluation, sync and the driver. `hparams` is the default numeric-hyperparameter
    pytree; the engine carries the one in use in `EngineState.hparams` and passes it in.

    init(key, hparams) -> train_state: params, optimizer state, normalisers
    acting_params(train_state, hparams) -> what `sync_weights` copies into `eval_params`
    act(params, obs [num_envs, *obs_shape], key, deterministic)
        -> (action [num_envs, *action_shape], extras per env)
    init_buffer(trajectory [num_steps, num_envs, ...]) -> an empty buffer for such trajectories
    complete_trajectory(params, trajectory) -> trajectory (end of rollout, acting params)
    add_to_buffer(buffer, trajectory) -> buffer
    update_dataset(train_state, buffer, key, hparams) -> (train_state, batch, metrics)
    train(train_state, buffer, batch, key, hparams) -> (train_state, metrics)
    grad_steps_per_epoch: gradient steps one `train` call makes, counted in
        `counters.grad_steps` (not for a call whose `train/learning` metric is 0: it idled)
    on_policy: whether `train` needs the data of the current acting params (PPO) or any
        stored data (off-policy; the actor-learner split accepts only these)
    static: static facts other layers read (e.g. `network` for export); never traced
    explore: optional stateful rollout acting (`Explore`); None: rollout calls `act`
    """

    name: str
    hparams: Any
    init: Callable[[jax.Array, Any], Any]
    acting_params: Callable[[Any, Any], Any]
    act: Callable[[Any, jax.Array, jax.Array, bool], tuple[jax.Array, dict[str, jax.Array]]]
    init_buffer: Callable[[Any], Any]
    complete_trajectory: Callable[[Any, Any], Any]
    add_to_buffer: Callable[[Any, Any], Any]
    update_dataset: Callable[[Any, Any, jax.Array, Any], tuple[Any, Any, Metrics]]
    train: Callable[[Any, Any, Any, jax.Array, Any], tuple[Any, Metrics]]
    grad_steps_per_epoch: int
    on_policy: bool
    static: Mapping[str, Any] = {}
    explore: Explore | None = None
