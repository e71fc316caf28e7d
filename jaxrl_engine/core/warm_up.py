"""Warm-up: AOT-compile phases along the real data flow, check shapes, report compile cost.

RLightning's `warm_up` runs a dummy epoch to build the dataflow and then reseeds; here nothing
runs: `jit(...).lower(...).compile()` of each phase, chaining each phase's output shardings
into the next, so the state is untouched and nothing needs reseeding.
"""

from __future__ import annotations

import time
from typing import Any

import jax

from jaxrl_engine.core.protocols import Algorithm, EnvSpec
from jaxrl_engine.core.state import EngineState


class ShapeMismatchError(ValueError):
    """Env and policy disagree on shapes; raised by `warm_up` before training."""


def compile_phase(name: str, fn: Any, *args: Any) -> tuple[Any, dict[str, float]]:
    """(compiled executable, report) of a jitted `fn` for `args` (shapes/shardings).

    report: compile seconds and XLA's cost and memory analysis. A failure to compile is a
    `ShapeMismatchError` naming the phase.
    """
    start = time.perf_counter()
    try:
        compiled = fn.lower(*args).compile()
    except Exception as e:
        raise ShapeMismatchError(f"warm_up: phase '{name}' failed to compile: {e}") from e
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
    obs = jax.ShapeDtypeStruct(state.env.obs.shape, state.env.obs.dtype)
    # Shapes only: offloaded (pinned_host) params would fail eval_shape on memory spaces.
    params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state.eval_params)
    try:
        action = jax.eval_shape(
            lambda p, o: algorithm.act(p, o, jax.random.key(0), False)[0], params, obs
        )
    except Exception as e:
        raise ShapeMismatchError(
            f"phase 'rollout': the policy cannot act on env observations of shape "
            f"{env_obs} (policy params were built for another shape): {e}"
        ) from e
    want = (state.env.obs.shape[0], *spec.action.shape)
    if tuple(action.shape) != want:
        raise ShapeMismatchError(
            f"phase 'rollout': the policy returns actions of shape {tuple(action.shape)} "
            f"but the env takes {want} (num_envs, *action_shape)"
        )
