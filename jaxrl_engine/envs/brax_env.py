"""Adapter from Brax's JAX physics envs (`env.suite: brax`, the `brax` extra) to the engine's
env protocol (gymnax 1.0).

Brax envs are JAX, so they are stepped inside the compiled rollout scan and vmapped over envs,
as gymnax envs are (not on the host). Brax's own `step(state, action)` has no episode limit and
no auto-reset; this adapter adds both with the engine's semantics:

- `terminated` is Brax's `done` (e.g. the pendulum fell), `truncated` is reaching
  `max_steps_in_episode` (the config's `env.params.max_steps_in_episode`, default 1000, Brax's
  training default) without terminating;
- when either is set, the returned observation is that of a fresh `reset` (a new key: a new
  initial state each episode) and `info["final_observation"]` the last one of the ended episode,
  so truncated steps bootstrap from it.

`env.params` takes `backend` (Brax's physics pipeline: spring | positional | generalized | mjx;
default spring, the fastest of them on CPU in `benchmarks/RESULTS.md`), `max_steps_in_episode`,
and any other keyword argument of the Brax env's constructor (e.g. `reset_noise_scale`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl_engine.core.protocols import ActionSpec, EnvSpec

INSTALL_HINT = "pip install 'jaxrl-engine[brax]'"
BACKENDS = ("spring", "positional", "generalized", "mjx")
DEFAULT_BACKEND = "spring"


def _brax_envs() -> Any:
    try:
        # brax warns on import that it is in maintenance mode, and mujoco.mjx prints "Failed to
        # import warp" to stdout when its optional GPU backend is absent: the CLI's stdout is
        # its JSON summary, so both are kept out.
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            from brax import envs
    except ImportError as e:
        raise ImportError(f"env.suite=brax needs brax: {INSTALL_HINT} ({e})") from None
    return envs


def brax_env_ids() -> list[str]:
    """The env names Brax registers (`brax.envs.get_environment` takes them)."""
    return sorted(_brax_envs()._envs)


@struct.dataclass
class BraxParams:
    """The adapter's env params: the episode limit (what `eval.env_params` can change)."""

    max_steps_in_episode: int = 1000


@struct.dataclass
class BraxState:
    inner: Any  # brax.envs.base.State
    time: jax.Array  # steps since the episode began


@contextlib.contextmanager
def _mujoco_warnings_as_python_warnings() -> Any:
    """MuJoCo's warnings as Python warnings while Brax compiles its model.

    MuJoCo's default warning handler prints the warning and appends it to MUJOCO_LOG.TXT in the
    working directory (Brax's halfcheetah model triggers a deprecation warning on every make): a
    file the user did not ask for, wherever they run. Here they go through `warnings` instead
    (which the caller filters), and the previous handler is put back afterwards."""
    import mujoco  # a dependency of brax, imported with it (brax is the optional extra)

    previous = mujoco.get_mju_user_warning()
    mujoco.set_mju_user_warning(lambda message: warnings.warn(f"MuJoCo: {message}", stacklevel=1))
    try:
        yield
    finally:
        mujoco.set_mju_user_warning(previous)


class BraxEnv:
    """A Brax env by name (`brax.envs.get_environment`), with an episode limit and auto-reset."""

    engine_adapter = True  # its protocol is tested, not traced at each build

    def __init__(self, env_id: str, params: dict[str, Any] | None = None):
        envs = _brax_envs()
        if env_id not in envs._envs:
            raise ValueError(
                f"unknown Brax env {env_id!r}; valid choices: {', '.join(brax_env_ids())}"
            )
        kwargs = dict(params or {})
        backend = kwargs.pop("backend", DEFAULT_BACKEND)
        if backend not in BACKENDS:
            raise ValueError(
                f"env.params.backend={backend!r}: Brax backends are {', '.join(BACKENDS)}"
            )
        limit = {f.name for f in dataclasses.fields(BraxParams)} & set(kwargs)
        self.params = self.with_params(BraxParams(), {k: kwargs.pop(k) for k in limit})
        with warnings.catch_warnings(), _mujoco_warnings_as_python_warnings():
            warnings.simplefilter("ignore")  # the maintenance-mode warning, again on make
            try:
                self.env = envs.get_environment(env_id, backend=backend, **kwargs)
            except TypeError as e:
                raise ValueError(
                    f"env.params {sorted(kwargs)}: not keyword arguments of Brax env {env_id!r} "
                    f"({e})"
                ) from None
        self.env_id = env_id
        self.backend = backend

    @staticmethod
    def with_params(params: BraxParams, overrides: dict[str, Any], key: str = "params") -> Any:
        """`params` with `overrides` (`max_steps_in_episode`: a positive integer)."""
        unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(BraxParams)})
        if unknown:
            raise ValueError(f"{key}: unknown env param(s) {unknown}; valid: max_steps_in_episode")
        for name, value in overrides.items():
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{key}.{name}={value!r}: must be a positive integer")
        return dataclasses.replace(params, **overrides)

    def reset(self, key: jax.Array, params: Any) -> tuple[jax.Array, BraxState]:
        inner = self.env.reset(key)
        return inner.obs, BraxState(inner, jnp.int32(0))

    def step(self, key: jax.Array, state: BraxState, action: jax.Array, params: Any):
        nxt = self.env.step(state.inner, action)
        time = state.time + 1
        terminated = nxt.done > 0.5
        truncated = (time >= params.max_steps_in_episode) & ~terminated
        done = terminated | truncated
        fresh = self.env.reset(key)
        # As Brax's AutoResetWrapper does: the physics state and the observation restart, the
        # metrics and info dicts (same keys after step and reset) are carried over.
        inner = nxt.replace(
            pipeline_state=jax.tree.map(
                lambda a, b: jnp.where(done, a, b), fresh.pipeline_state, nxt.pipeline_state
            ),
            obs=jnp.where(done, fresh.obs, nxt.obs),
            done=jnp.zeros_like(nxt.done),
        )
        new_state = BraxState(inner, jnp.where(done, 0, time).astype(jnp.int32))
        info = {"final_observation": nxt.obs}
        return inner.obs, new_state, nxt.reward, terminated, truncated, info

    def spec(self, params: Any) -> EnvSpec:
        params = params if params is not None else self.params
        size = int(self.env.action_size)
        return EnvSpec(
            env_id=self.env_id,
            obs_shape=(int(self.env.observation_size),),
            obs_dtype=np.dtype(np.float32),
            action=ActionSpec(
                shape=(size,),
                dtype=np.dtype(np.float32),
                low=(-1.0,) * size,
                high=(1.0,) * size,
            ),
            max_episode_steps=int(params.max_steps_in_episode),
        )
