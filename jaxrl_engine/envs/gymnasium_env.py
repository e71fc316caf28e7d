"""gymnasium environments (any registered id, MuJoCo's included) as a batched host env.

A gymnasium env steps on the host, in Python/C, so it cannot be traced. `GymnasiumEnv` is an
engine `Env` with `batched = True`: its `reset` and `step` take the whole env batch and call a
gymnasium vector env through one ordered host callback per step (`host_callback.py`), so the
engine's jitted phases, fused epochs, hooks, nan_guard, checkpoints, evaluation and driver run
unchanged around it (the acting network runs in XLA, the env on the host; one device).

Two vector envs, as RLightning keeps train and eval object sets: the training envs
(`env.num_envs`, `env.params` as `gymnasium.make` kwargs) and the evaluation envs
(`eval.num_envs`, with `eval.env_params` on top); the env `params` of a call say which.

Autoreset: gymnasium 1.x `AutoresetMode.SAME_STEP` exactly: the step that ends an episode
returns the first observation of the next one and `info["final_obs"]` the last observation of
the ended one (the engine's `final_observation`), as gymnax does. The other modes
(NEXT_STEP, gymnasium's default, and DISABLED) would put a reset step into the trajectory; the
adapter always builds its vector envs in SAME_STEP mode.

Limits: the envs' own state is not part of `EngineState`, so a resumed run starts new
episodes (the learner state is restored exactly; the episodes in flight are not); sweeps
(`jax.vmap(train)`) and multi-device meshes are not supported with host envs.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_engine.core.protocols import ActionSpec, EnvSpec
from jaxrl_engine.envs.host_callback import ordered_host_call
from jaxrl_engine.io.user_code import found_modules_on_path, import_env_module

Vectorization = Literal["sync", "async"]
DEFAULT_MAX_STEPS = 1000  # evaluation horizon of an env without a registered step limit


@dataclasses.dataclass(frozen=True)
class HostEnvParams:
    """Which env set a call is for ("train" or "eval") and that set's `gymnasium.make`
    kwargs (hashable: params are static in the compiled phases)."""

    role: str
    kwargs: tuple[tuple[str, Any], ...] = ()

    def replace(self, **changes: Any) -> HostEnvParams:
        """`eval.env_params` overrides: kwargs on top of the training set's."""
        merged = {**dict(self.kwargs), **changes}
        return dataclasses.replace(self, role="eval", kwargs=tuple(sorted(merged.items())))


def _space_spec(
    env_id: str, obs_space: Any, action_space: Any, key: str = "env.id"
) -> tuple[Any, ...]:
    """(obs shape, obs dtype, ActionSpec) of gymnasium spaces; ValueError naming the config
    `key` (and its value `env_id`) for a space the engine does not take."""
    from gymnasium import spaces

    if not isinstance(obs_space, spaces.Box):
        raise ValueError(
            f"{key}={env_id}: observation space {obs_space} is not supported (Box only: "
            "arrays, images included)"
        )
    obs_dtype = np.float32 if np.issubdtype(obs_space.dtype, np.floating) else obs_space.dtype
    if np.dtype(obs_dtype).itemsize > 4:  # JAX runs without 64-bit types: int32 if it fits
        narrow = np.dtype(np.int32 if np.issubdtype(obs_dtype, np.signedinteger) else np.uint32)
        if not (
            np.issubdtype(obs_dtype, np.integer)
            and np.all(obs_space.low >= np.iinfo(narrow).min)
            and np.all(obs_space.high <= np.iinfo(narrow).max)
        ):
            raise ValueError(
                f"{key}={env_id}: observation space {obs_space} has 64-bit values beyond "
                f"{narrow.name}'s range, and JAX runs without 64-bit types (bound the space, or "
                "give float32 observations)"
            )
        obs_dtype = narrow
    if isinstance(action_space, spaces.Discrete):
        if action_space.start != 0:
            raise ValueError(f"{key}={env_id}: Discrete actions must start at 0 ({action_space})")
        action = ActionSpec(shape=(), dtype=jnp.int32, num_actions=int(action_space.n))
    elif isinstance(action_space, spaces.Box) and np.issubdtype(action_space.dtype, np.floating):
        if not (np.isfinite(action_space.low).all() and np.isfinite(action_space.high).all()):
            raise ValueError(f"{key}={env_id}: action space {action_space} is unbounded")
        action = ActionSpec(
            shape=tuple(action_space.shape),
            dtype=jnp.float32,
            low=tuple(float(x) for x in np.ravel(action_space.low)),
            high=tuple(float(x) for x in np.ravel(action_space.high)),
        )
    else:
        raise ValueError(
            f"{key}={env_id}: action space {action_space} is not supported (Discrete or a "
            "float Box)"
        )
    return tuple(obs_space.shape), np.dtype(obs_dtype), action


def _actions(action: ActionSpec) -> str:
    if action.discrete:
        return f"Discrete({action.num_actions})"
    low, high = np.asarray(action.low, float), np.asarray(action.high, float)
    return f"Box{action.shape} in [{low.min()}, {high.max()}]"


class GymnasiumEnv:
    """gymnasium `env_id` as a batched host env of `num_envs` training and `eval_envs`
    evaluation envs (see the module docstring). kwargs: `gymnasium.make` keyword arguments;
    vectorization: "sync" (one process) or "async" (a spawned subprocess per env: a custom env
    must be importable there, e.g. registered by a module the child imports)."""

    engine_adapter = True  # its protocol is tested, not traced at each build

    batched = True
    image_layout = "hwc"  # gymnasium's image observations are [H, W, C]

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        eval_envs: int,
        kwargs: dict[str, Any] | None = None,
        vectorization: Vectorization = "sync",
        *,
        eval_id: str | None = None,
        eval_kwargs: dict[str, Any] | None = None,
        offload: bool = False,
    ):
        self.env_id, self.vectorization = env_id, vectorization
        self.sizes = {"train": num_envs, "eval": eval_envs}
        self.params = HostEnvParams("train", tuple(sorted((kwargs or {}).items())))
        self.obs_shape, self.obs_dtype, self.action, self.max_episode_steps = self._probe(
            env_id, self.params, "env.id"
        )
        self._host_init(eval_id, offload, eval_kwargs)

    def _probe(self, env_id: str, params: HostEnvParams, key: str) -> tuple[Any, ...]:
        """(obs shape, obs dtype, action spec, step limit) of one env made with `params`;
        ValueError naming config `key` (env.id or eval.env_id) when it cannot be made."""
        import gymnasium

        import_env_module(env_id, key)  # gymnasium's "module:EnvName-v0", found from the cwd too
        try:
            probe = gymnasium.make(env_id, **dict(params.kwargs))
        except Exception as e:  # not registered, a missing extra (mujoco), bad kwargs
            raise ValueError(
                f"{key}={env_id} (suite gymnasium) cannot be made: {type(e).__name__}: "
                f"{(str(e).splitlines() or [''])[0][:300]}"
            ) from None
        try:
            limit = probe.spec.max_episode_steps if probe.spec is not None else None
            return (
                *_space_spec(env_id, probe.observation_space, probe.action_space, key),
                int(limit or DEFAULT_MAX_STEPS),
            )
        finally:
            probe.close()

    def _host_init(
        self, eval_id: str | None, offload: bool, eval_kwargs: dict[str, Any] | None
    ) -> None:
        """The state every host env keeps: its open env sets, the evaluation env's id and kwargs
        (checked to give the training env's spaces), offload, restarts, the host error."""
        self._vec: dict[HostEnvParams, Any] = {}
        self._needs_reset: dict[HostEnvParams, bool] = {}
        # The exception an env raised inside a callback: XLA reports it as a JaxRuntimeError
        # holding its traceback as text; the driver raises this original instead.
        self.host_error: BaseException | None = None
        self.offload = offload
        self.rebuilds = 0  # env sets made again after offload closed them
        self._released: set[HostEnvParams] = set()
        self._restarts = -1  # episodes started outside `reset` (`_restart_seed`)
        self.eval_id = eval_id if eval_id not in (None, self.env_id) else None
        self.eval_max_episode_steps = self.max_episode_steps
        evaluation = self.eval_set(eval_kwargs or {})
        if self.eval_id is not None or evaluation.kwargs != self.params.kwargs:
            # The evaluation set as it will be made (its id and kwargs): same spaces, its limit.
            key = "eval.env_id" if self.eval_id is not None else "eval.env_params"
            *spaces, limit = self._probe(self.id_of(evaluation), evaluation, key)
            if tuple(spaces) != (self.obs_shape, self.obs_dtype, self.action):
                made = self.id_of(evaluation) + (
                    f" with {dict(evaluation.kwargs)}" if evaluation.kwargs else ""
                )
                raise ValueError(
                    f"{key}: the evaluation env {made} has other spaces than env.id={self.env_id} "
                    f"(observations {spaces[0]} {spaces[1]}, actions {_actions(spaces[2])}; "
                    f"training: {self.obs_shape} {self.obs_dtype}, {_actions(self.action)}): "
                    "the policy cannot act in it"
                )
            self.eval_max_episode_steps = limit

    def _restart_seed(self) -> np.ndarray:
        """The seed of a set's episodes started outside `reset` (a resumed run, a set made
        again after offload): 0, 1, 2, ... so that each restart plays new episodes."""
        self._restarts += 1
        return np.array([self._restarts], np.uint32)

    def eval_set(self, overrides: dict[str, Any]) -> HostEnvParams:
        """The evaluation env set's params: `eval.env_params` on top of the training kwargs,
        or alone when `eval.env_id` names another env (whose make kwargs may differ)."""
        if self.eval_id is not None:
            return HostEnvParams("eval", tuple(sorted(overrides.items())))
        return self.params.replace(**overrides)

    def id_of(self, params: HostEnvParams) -> str:
        return self.eval_id if params.role == "eval" and self.eval_id else self.env_id

    def _release_others(self, params: HostEnvParams) -> None:
        """With offload: close every env set but `params`'s (made again, with new episodes,
        when next used), so that the training and evaluation sets never exist at once."""
        for other in [p for p in self._vec if p != params]:
            self._vec.pop(other).close()
            self._needs_reset[other] = True
            self._released.add(other)

    def _guarded(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except BaseException as e:
            self.host_error = e
            raise

    def spec(self, params: Any) -> EnvSpec:
        evaluating = isinstance(params, HostEnvParams) and params.role == "eval"
        return EnvSpec(
            env_id=self.id_of(params) if evaluating else self.env_id,
            obs_shape=self.obs_shape,
            obs_dtype=self.obs_dtype,
            action=self.action,
            max_episode_steps=self.eval_max_episode_steps if evaluating else self.max_episode_steps,
            obs_layout=self.image_layout if len(self.obs_shape) == 3 else None,
        )

    # ------------------------------------------------------------------------- host side
    def vector_env(self, params: HostEnvParams) -> Any:
        """The gymnasium vector env of an env set (made on first use, SAME_STEP autoreset)."""
        if self.offload:
            self._release_others(params)
        if params not in self._vec:
            import gymnasium
            from gymnasium.vector import AutoresetMode

            if self.vectorization == "async":
                _literal_gymnasium_errors()
            self.rebuilds += params in self._released
            self._released.discard(params)
            with found_modules_on_path():  # (a spawned worker imports the env's module)
                self._vec[params] = gymnasium.make_vec(
                    self.id_of(params),
                    num_envs=self.sizes[params.role],
                    vectorization_mode=self.vectorization,
                    vector_kwargs={
                        "autoreset_mode": AutoresetMode.SAME_STEP,
                        # Spawned workers: forking a process running JAX's threads can deadlock.
                        **({"context": "spawn"} if self.vectorization == "async" else {}),
                    },
                    **dict(params.kwargs),
                )
            self._needs_reset[params] = True
        return self._vec[params]

    def _vec_call(
        self, vec: Any, params: HostEnvParams, method: str, *args: Any, **kwargs: Any
    ) -> Any:
        """`vec.<method>(...)`, its failures named: a worker that died (async), observations
        that do not fit the env's space (gymnasium stacks them with a bare numpy error)."""
        where = f"env {self.id_of(params)!r} (env.vectorization={self.vectorization})"
        try:
            return getattr(vec, method)(*args, **kwargs)
        except (EOFError, BrokenPipeError, ConnectionResetError) as e:
            processes = getattr(vec, "processes", [])
            for _ in range(20):  # its pipe closes a moment before it is reaped: up to 1 s
                if any(p.exitcode for p in processes):
                    break
                time.sleep(0.05)
            codes = [p.exitcode for p in processes]
            dead = ", ".join(f"worker {i}: exit code {c}" for i, c in enumerate(codes) if c)
            raise RuntimeError(
                f"{where}: a worker process died during {method}() ({dead or type(e).__name__}); "
                "its env ended the process (os._exit, a crash, the OOM killer)"
            ) from e
        except ValueError as e:
            if not any(m in str(e) for m in ("wrong shape", "could not broadcast")):
                raise
            raise ValueError(
                f"{where}: {method}() returned observations that do not fit its observation "
                f"space (shape {list(self.obs_shape)}): {e}"
            ) from e

    def _host_reset(self, params: HostEnvParams, key_data: np.ndarray) -> tuple[Any, Any]:
        vec = self.vector_env(params)
        obs, _ = self._vec_call(vec, params, "reset", seed=int(np.asarray(key_data).ravel()[-1]))
        self._needs_reset[params] = False
        return self._obs(obs), np.zeros((self.sizes[params.role],), np.int32)

    def _host_step(self, params: HostEnvParams, action: np.ndarray) -> tuple[Any, ...]:
        vec = self.vector_env(params)
        n = self.sizes[params.role]
        if self._needs_reset[params]:  # e.g. a resumed run: its episodes start afresh
            self._host_reset(params, self._restart_seed())
        action = np.asarray(action)
        obs, reward, terminated, truncated, info = self._vec_call(
            vec, params, "step", action.astype(np.int64) if self.action.discrete else action
        )
        final = np.array(obs, copy=True)
        if "_final_obs" in info:
            ended = np.flatnonzero(info["_final_obs"])
            if ended.size:
                final[ended] = np.stack([info["final_obs"][i] for i in ended])
        return (
            self._obs(obs),
            np.zeros((n,), np.int32),
            np.asarray(reward, np.float32),
            np.asarray(terminated, bool),
            np.asarray(truncated, bool),
            self._obs(final),
        )

    def _obs(self, obs: Any) -> np.ndarray:
        return np.asarray(obs, self.obs_dtype)

    def close(self) -> None:
        for vec in self._vec.values():
            try:
                vec.close()
            except (EOFError, BrokenPipeError, ConnectionResetError):  # a worker died (async):
                for process in getattr(vec, "processes", []):  # gymnasium waits on its pipe
                    if process.is_alive():
                        process.terminate()
                    process.join()
                vec.closed = True
        self._vec.clear()

    # ---------------------------------------------------------------------- traced side
    def _shapes(self, n: int) -> tuple[jax.ShapeDtypeStruct, ...]:
        obs = jax.ShapeDtypeStruct((n, *self.obs_shape), self.obs_dtype)
        return obs, jax.ShapeDtypeStruct((n,), np.int32)

    def reset(self, key: jax.Array, params: HostEnvParams) -> tuple[jax.Array, jax.Array]:
        n = self.sizes[params.role]
        obs, state = ordered_host_call(
            lambda k: self._guarded(self._host_reset, params, k),
            self._shapes(n),
            jax.random.key_data(key),
        )
        return obs, state

    def step(
        self, key: jax.Array, state: jax.Array, action: jax.Array, params: HostEnvParams
    ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array, dict[str, Any]]:
        n = self.sizes[params.role]
        obs, counter = self._shapes(n)
        flags = jax.ShapeDtypeStruct((n,), np.bool_)
        out = ordered_host_call(
            lambda a: self._guarded(self._host_step, params, a),
            (obs, counter, jax.ShapeDtypeStruct((n,), np.float32), flags, flags, obs),
            action,
        )
        obs, state, reward, terminated, truncated, final = out
        return obs, state, reward, terminated, truncated, {"final_observation": final}


def steps_per_second_of_random_policy(env: GymnasiumEnv, steps: int = 2000) -> float:
    """The host envs' own stepping rate under uniformly random actions (the limit of any
    engine built on them); for benchmarks."""
    import time

    vec = env.vector_env(env.params)
    vec.reset(seed=0)
    n = env.sizes["train"]
    start = time.perf_counter()
    for _ in range(math.ceil(steps / n)):
        vec.step(vec.action_space.sample())
    return math.ceil(steps / n) * n / (time.perf_counter() - start)


def _literal_gymnasium_errors() -> None:
    """gymnasium's async vector env logs a worker's traceback as `logger.error(f"{trace}")`,
    which formats it again with `%`: a `%` in the traceback raised a TypeError in place of
    the worker's exception. Its error messages are taken literally (installed once)."""
    from gymnasium import logger

    if getattr(logger.error, "literal", False):
        return
    error = logger.error

    def literal(msg: str, *args: object) -> None:
        error(msg, *args) if args else error("%s", msg)

    literal.literal = True  # type: ignore[attr-defined]
    logger.error = literal
