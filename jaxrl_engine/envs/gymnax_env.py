"""Adapter from any gymnax environment id to the engine's env protocol."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from jaxrl_engine.core.protocols import ActionSpec, EnvSpec
from jaxrl_engine.envs.deferred import deferred_imports

with deferred_imports("matplotlib.pyplot", "seaborn"):  # gymnax's renderers' imports
    import gymnax
    from gymnax.environments import spaces

# Envs that fetch data at run time (the engine never downloads at run time).
_EXCLUDED = {"MNISTBandit-bsuite": "it downloads MNIST when created"}


def available_env_ids() -> list[str]:
    """Every gymnax id the adapter accepts."""
    return [e for e in gymnax.registered_envs if e not in _EXCLUDED]


# name -> (the params it is computed from, how): gymnax computes them once, in the defaults.
DERIVED_PARAMS: dict[str, tuple[tuple[str, ...], Any]] = {
    "total_mass": (("masspole", "masscart"), lambda p: p["masspole"] + p["masscart"]),
    "polemass_length": (("masspole", "length"), lambda p: p["masspole"] * p["length"]),
}


class GymnaxEnv:
    """A gymnax env with its params bound; `step`/`reset` follow gymnax 1.0 exactly."""

    engine_adapter = True  # its protocol is tested, not traced at each build

    def __init__(self, env_id: str, param_overrides: dict[str, Any] | None = None):
        if env_id in _EXCLUDED:
            raise ValueError(f"env id {env_id!r} is not supported: {_EXCLUDED[env_id]}")
        if env_id not in gymnax.registered_envs:
            raise ValueError(
                f"unknown env id {env_id!r}; valid choices: {', '.join(available_env_ids())}"
            )
        self.env_id = env_id
        self.env, default = gymnax.make(env_id)
        self.params = self.with_params(default, param_overrides or {})

    @staticmethod
    def with_params(params: Any, overrides: dict[str, Any], key: str = "params") -> Any:
        """Env params with `overrides` applied (`key`: the config key named in errors).

        Each value must have its default's type: an int param takes an int, a bool param a
        bool, a float param a number; an int param whose default is positive must stay
        positive (e.g. `max_steps_in_episode`); array params cannot be overridden.
        """
        fields = {f.name for f in dataclasses.fields(params)}
        unknown = sorted(set(overrides) - fields)
        if unknown:
            raise ValueError(
                f"{key}: unknown env param(s) {unknown}; valid choices: {', '.join(sorted(fields))}"
            )
        values = {}
        for name, value in overrides.items():
            default = getattr(params, name)
            where = f"{key}.{name}={value!r}"
            if isinstance(default, bool | np.bool_):
                if not isinstance(value, bool):
                    raise ValueError(f"{where}: must be true or false (its default is {default})")
            elif isinstance(default, int | np.integer):
                if isinstance(value, bool) or not isinstance(value, int):
                    raise ValueError(f"{where}: must be an integer (its default is {default})")
                if default > 0 and value <= 0:
                    raise ValueError(
                        f"{where}: must be a positive integer (its default is {default}; an int "
                        "param with a positive default stays positive)"
                    )
            elif isinstance(default, float | np.floating):
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise ValueError(f"{where}: must be a number (its default is {default})")
                value = float(value)
            else:
                shape = tuple(getattr(default, "shape", ()))
                raise ValueError(
                    f"{where}: this param is an array of shape {shape}; it cannot be overridden"
                )
            values[name] = value
        # Params gymnax's step reads as stored but that are derived from others (CartPole's
        # total_mass, polemass_length): follow their sources unless given themselves.
        merged = {f: values.get(f, getattr(params, f)) for f in fields}
        for name, (sources, derive) in DERIVED_PARAMS.items():
            if name in fields and name not in values and any(s in values for s in sources):
                values[name] = float(derive(merged))
        return params.replace(**values)

    def reset(self, key: jax.Array, params: Any) -> tuple[jax.Array, Any]:
        return self.env.reset(key, params)

    def step(self, key: jax.Array, state: Any, action: jax.Array, params: Any):
        return self.env.step(key, state, action, params)

    def spec(self, params: Any) -> EnvSpec:
        # Concrete even when called while a phase is traced (the misc envs compute their
        # action bounds with jnp, which a trace would stage).
        with jax.ensure_compile_time_eval():
            return self._spec(params)

    def _spec(self, params: Any) -> EnvSpec:
        obs_space = self.env.observation_space(params)
        act_space = self.env.action_space(params)
        if isinstance(act_space, spaces.Discrete):
            action = ActionSpec(shape=(), dtype=act_space.dtype, num_actions=int(act_space.n))
        elif isinstance(act_space, spaces.Box):
            low = np.broadcast_to(np.asarray(act_space.low, np.float32), act_space.shape)
            high = np.broadcast_to(np.asarray(act_space.high, np.float32), act_space.shape)
            action = ActionSpec(
                shape=tuple(act_space.shape),
                dtype=act_space.dtype,
                low=tuple(low.ravel().tolist()),
                high=tuple(high.ravel().tolist()),
            )
        else:
            raise ValueError(
                f"env {self.env_id!r}: action space {type(act_space).__name__} is not supported "
                "(Discrete and Box are)"
            )
        # The observations' dtype as reset returns them: a space may say another (bsuite's
        # Catch: int32 space, float32 observations).
        obs = jax.eval_shape(lambda k: self.env.reset(k, params)[0], jax.random.key(0))
        return EnvSpec(
            env_id=self.env_id,
            obs_shape=tuple(obs_space.shape),
            obs_dtype=obs.dtype,
            action=action,
            max_episode_steps=int(params.max_steps_in_episode),
            obs_layout="hwc" if len(obs_space.shape) == 3 else None,  # MinAtar: [10, 10, C]
        )


def make_env(env_id: str, param_overrides: dict[str, Any] | None = None) -> GymnaxEnv:
    """The env for a gymnax id, e.g. `make_env("CartPole-v1")`."""
    return GymnaxEnv(env_id, param_overrides)
