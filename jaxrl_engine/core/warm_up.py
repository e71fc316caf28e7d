"""Warm-up: AOT-compile phases along the real data flow, check shapes, report compile cost.

RLightning's `warm_up` runs a dummy epoch to build the dataflow and then reseeds; here nothing
runs: `jit(...).lower(...).compile()` of each phase, chaining each phase's output shardings
into the next, so the state is untouched and nothing needs reseeding.
"""

from __future__ import annotations

import re
import time
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_engine.core.offload import host_subtrees
from jaxrl_engine.core.phases import env_keys, reset_batch, step_batch
from jaxrl_engine.core.protocols import Algorithm, EnvSpec
from jaxrl_engine.core.state import EngineState


class ShapeMismatchError(ValueError):
    """Env and policy (or network) disagree on shapes, or an env lacks the `Env` protocol.

    Raised before anything runs: when the engine is built (`jre.build`, `Engine(...)`: the
    env's methods and `reset`/`step` outputs, the policy's actions, and a network head or value
    output of the wrong width, checked when the algorithm is traced), and by `warm_up` (the
    state's observations and policy, and a phase that fails to compile).
    """


def compile_phase(name: str, fn: Any, *args: Any) -> tuple[Any, dict[str, float]]:
    """(compiled executable, report) of a jitted `fn` for `args` (shapes/shardings).

    report: compile seconds and XLA's cost and memory analysis. A failure to compile is a
    `ShapeMismatchError` naming the phase.
    """
    start = time.perf_counter()
    try:
        compiled = fn.lower(*args).compile()
    except Exception as e:
        notes = "".join(
            f" ({note})"
            for note in dict.fromkeys(getattr(e, "__notes__", []))
            if note.startswith("raised in phase")  # (not JAX's traceback notes)
        )
        where = ""
        if "memory_space" in str(e) and (host := host_subtrees(args[0])):
            # A user's `offload_after` left them there and a phase computes with them.
            inner = re.findall(r"raised in phase '(\w+)'", notes)
            reader = f"phase '{inner[-1]}'" if inner else "the phase that reads them"
            where = (
                f"; the state's {', '.join(host)} are in host memory when '{name}' starts "
                "(put there by offload: true, whose placement reloads them only for the phases "
                "of the built-in algorithms that read them, or by an offload_after hook of "
                f"yours): add jre.reload_before({host!r}, engine.mesh) to the hooks of {reader}"
            )
        raise ShapeMismatchError(
            f"warm_up: phase '{name}' failed to compile: {type(e).__name__}: {e}{notes}{where}"
        ) from e
    cost = compiled.cost_analysis() or {}
    memory = compiled.memory_analysis()
    return compiled, {
        "compile_s": time.perf_counter() - start,
        "flops": float(cost.get("flops", 0.0)),
        "bytes_accessed": float(cost.get("bytes accessed", 0.0)),
        "temp_bytes": float(getattr(memory, "temp_size_in_bytes", 0)),
        "argument_bytes": float(getattr(memory, "argument_size_in_bytes", 0)),
        "output_bytes": float(getattr(memory, "output_size_in_bytes", 0)),
    }


def check_shapes(state: EngineState, spec: EnvSpec, algorithm: Algorithm) -> None:
    """Env and policy shapes agree, or `ShapeMismatchError` naming phase and both shapes."""
    env_obs = tuple(state.env.obs.shape[1:])
    if env_obs != spec.obs_shape:
        raise ShapeMismatchError(
            f"phase 'rollout': the env's observations have shape {env_obs} but its "
            f"observation space (what the policy was built for) says {spec.obs_shape}"
        )
    check_policy(state.eval_params, state.env.obs, spec, algorithm)


def check_state_layout(state: EngineState, expected: Any, where: str) -> None:
    """`ShapeMismatchError` naming the first leaf (path, shape, dtype) where `state` differs
    from `expected` (an engine's `state_shape`): a state another engine made (another
    `env.num_envs`, env or network) otherwise fails inside jit with a bare vmap or
    "Mismatch details" error."""
    got = jax.tree_util.tree_flatten_with_path(state)[0]
    want = jax.tree_util.tree_flatten_with_path(expected)[0]
    got_by = {jax.tree_util.keystr(p): x for p, x in got}
    want_by = {jax.tree_util.keystr(p): x for p, x in want}
    problem = None
    # Observations first: they say which env or env.num_envs the state was made for.
    for path, x in sorted(want_by.items(), key=lambda item: not item[0].startswith(".env.obs")):
        if path not in got_by:
            problem = f"it has no {path}"
            break
        y = got_by[path]
        if (tuple(y.shape), y.dtype) != (tuple(x.shape), x.dtype):
            problem = (
                f"{path} is {y.dtype}{list(y.shape)} in it and {x.dtype}{list(x.shape)} in this "
                "engine's state"
            )
            break
    if problem is None:
        extra = sorted(set(got_by) - set(want_by))
        problem = f"it has {extra[0]}, which this engine's state has not" if extra else None
    if problem is not None:
        raise ShapeMismatchError(
            f"{where}: the state does not fit this engine ({problem}): was it made by another "
            "engine (another env.num_envs, env or network)? Use this engine's `init`, or a "
            "checkpoint of its config"
        )


def check_policy(params: Any, obs: Any, spec: EnvSpec, algorithm: Algorithm) -> None:
    """The policy acts on `obs` (`[num_envs, *obs_shape]`) with actions of the env's shape and
    kind, or `ShapeMismatchError` naming both (before a rollout feeds them to the env)."""
    env_obs = tuple(obs.shape[1:])
    obs = jax.ShapeDtypeStruct(obs.shape, obs.dtype)
    # Shapes only: offloaded (pinned_host) params would fail eval_shape on memory spaces.
    params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
    try:
        action = jax.eval_shape(
            lambda p, o: algorithm.act(p, o, jax.random.key(0), False)[0], params, obs
        )
    except ShapeMismatchError:
        raise  # (the algorithm's own, naming what does not fit)
    except Exception as e:
        guess = " (were its params built for another shape?)" if "shape" in str(e) else ""
        raise ShapeMismatchError(
            f"phase 'rollout': the policy cannot act on env observations of shape "
            f"{env_obs}{guess}: {type(e).__name__}: {e}"
        ) from e
    want = (obs.shape[0], *spec.action.shape)
    if tuple(action.shape) != want:
        raise ShapeMismatchError(
            f"phase 'rollout': the policy returns actions of shape {tuple(action.shape)} "
            f"but the env takes {want} (num_envs, *action_shape)"
        )
    kind = jnp.integer if spec.action.discrete else jnp.floating
    if not jnp.issubdtype(action.dtype, kind):
        raise ShapeMismatchError(
            f"phase 'rollout': the policy returns {action.dtype} actions but the env's are "
            + ("discrete (integers)" if spec.action.discrete else "continuous (floats)")
        )


def check_env_methods(env: Any, params: bool = False) -> None:
    """`env` has the `Env` protocol's methods (and `params` when asked), or
    `ShapeMismatchError` naming what it lacks."""
    for method in ("reset", "step", "spec"):
        if not callable(getattr(env, method, None)):
            raise ShapeMismatchError(
                f"env {type(env).__name__} has no {method}() method (an env has reset, step "
                "and spec, and params: jaxrl_engine.core.protocols.Env)"
            )
    if params and not hasattr(env, "params"):
        raise ShapeMismatchError(
            f"env {type(env).__name__} has no params attribute (its default parameters, "
            "which reset, step and spec take; jaxrl_engine.core.protocols.Env)"
        )


def check_env(env: Any, params: Any, spec: EnvSpec, n: int) -> None:
    """`env` keeps the `Env` protocol (`core/protocols.py`) for `spec`, or `ShapeMismatchError`
    naming the env, the method and the output: `reset` and `step` traced once for `n` envs
    (nothing runs), before the engine traces its phases (whose errors would name a scan
    carry or a layer instead). The engine builds do not call it for its own adapters
    (`engine_adapter = True`: gymnax, Brax, gymnasium, EnvPool), which tests check with it: a
    Brax step takes seconds to trace."""
    check_env_methods(env)
    name = f"env {type(env).__name__} ({spec.env_id})"
    # (float64 in a spec is float32 with JAX's 64-bit mode off, as the env's arrays are)
    want = jax.ShapeDtypeStruct((n, *spec.obs_shape), jax.dtypes.canonicalize_dtype(spec.obs_dtype))

    def traced(method: str, fn: Any, *args: Any) -> Any:
        try:
            return jax.eval_shape(fn, *args)
        except Exception as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
            raise ShapeMismatchError(
                f"{name}: {method} fails when traced for {n} envs: {type(e).__name__}: {first}"
            ) from e

    def check_obs(where: str, obs: Any) -> None:
        got = getattr(obs, "shape", None), getattr(obs, "dtype", None)
        if got != (want.shape, want.dtype):
            raise ShapeMismatchError(
                f"{name}: {where} gives observations of shape {got[0]} and dtype {got[1]}; its "
                f"spec says {want.shape} {want.dtype} ({n} envs x spec.obs_shape, obs_dtype)"
            )

    out = traced("reset(key, params)", lambda k: reset_batch(env, k, params, n), jax.random.key(0))
    if not (isinstance(out, tuple) and len(out) == 2):
        raise ShapeMismatchError(f"{name}: reset(key, params) returns (obs, state), not {out}")
    check_obs("reset()", out[0])
    state = out[1]
    action = jax.ShapeDtypeStruct((n, *spec.action.shape), spec.action.dtype)
    keys = jax.eval_shape(lambda: env_keys(env, jax.random.split(jax.random.key(0), 1), n)[0])
    out = traced(
        "step(key, state, action, params)",
        lambda k, s, a: step_batch(env, k, s, a, params),
        keys,
        state,
        action,
    )
    if not (isinstance(out, tuple) and len(out) == 6):
        got = f"{len(out)} values" if isinstance(out, tuple) else type(out).__name__
        raise ShapeMismatchError(
            f"{name}: step(key, state, action, params) must return 6 values (obs, state, "
            f"reward, terminated, truncated, info); it returns {got}"
            + (
                " (gymnax before 1.0: one `done`, not terminated and truncated)"
                if got == "5 values"
                else ""
            )
        )
    obs, new_state, reward, terminated, truncated, info = out
    check_obs("step()", obs)
    before = jax.tree_util.tree_flatten_with_path(state)
    after = jax.tree_util.tree_flatten_with_path(new_state)
    if before[1] != after[1]:  # type: ignore[operator]
        raise ShapeMismatchError(
            f"{name}: step() returns a state of another structure than reset()'s: "
            f"{after[1]} vs {before[1]}"
        )
    for (path, old), (_, new) in zip(before[0], after[0], strict=True):
        if (old.shape, old.dtype) != (new.shape, new.dtype):
            raise ShapeMismatchError(
                f"{name}: step() returns state{jax.tree_util.keystr(path)} of shape "
                f"{new.shape} {new.dtype}; reset() returned {old.shape} {old.dtype} (the state "
                "keeps its shapes and dtypes)"
            )
    for what, value, kinds, kind in (
        ("reward", reward, (jnp.floating, jnp.integer), "a number"),
        ("terminated", terminated, (jnp.bool_,), "bool"),
        ("truncated", truncated, (jnp.bool_,), "bool"),
    ):
        shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
        if shape != (n,) or dtype is None or not any(jnp.issubdtype(dtype, k) for k in kinds):
            raise ShapeMismatchError(
                f"{name}: step() returns {what} of shape {shape} and dtype {dtype}; each env's "
                f"{what} is {kind} of shape () ({n} envs: ({n},))"
            )
    if not isinstance(info, dict) or "final_observation" not in info:
        held = f"keys {sorted(map(str, info))}" if isinstance(info, dict) else type(info).__name__
        raise ShapeMismatchError(
            f"{name}: step()'s info must be a dict holding 'final_observation' (the "
            f"observation that ended an episode, before the auto-reset; else the next obs); it "
            f"is {held}"
        )
    check_obs("step()'s info['final_observation']", info["final_observation"])
