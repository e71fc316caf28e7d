"""`jaxrl-engine eval`: run a run directory's exported policy for N episodes; statistics.

The policy is the artefact in `runs/<name>/policy/` (`act.jaxexport` + `params.npz`), called as
is inside a jitted `lax.scan` over the env (vmapped over episodes): what is evaluated is what a
user deploys, not the training code. The env is the run's evaluation env (`env.id` with
`env.params` and `eval.env_params` from its `config.yaml`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_engine.envs.gymnax_env import GymnaxEnv
from jaxrl_engine.export import POLICY_DIR, ExportError
from jaxrl_engine.io.config import load_config


def episode_returns(
    env: GymnaxEnv,
    env_params: Any,
    act: Callable[[Any, jax.Array], jax.Array],
    params: Any,
    episodes: int,
    key: jax.Array,
) -> tuple[np.ndarray, np.ndarray]:
    """Returns and lengths of `episodes` episodes, one per env, each to its end or the time
    limit. act: `act(params, obs[batch, ...]) -> action[batch, ...]` (deterministic)."""
    max_steps = env.spec(env_params).max_episode_steps
    step_env = jax.vmap(env.step, (0, 0, 0, None))

    @jax.jit
    def run(params: Any, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        k_reset, k_steps = jax.random.split(key)
        obs, state = jax.vmap(env.reset, (0, None))(jax.random.split(k_reset, episodes), env_params)

        def step(carry, key):
            state, obs, ret, length, active = carry
            obs, state, reward, terminated, truncated, _ = step_env(
                jax.random.split(key, episodes), state, act(params, obs), env_params
            )
            ret = ret + jnp.where(active, reward, 0.0)
            length = length + active
            return (state, obs, ret, length, active & ~(terminated | truncated)), None

        init = (
            state,
            obs,
            jnp.zeros((episodes,)),
            jnp.zeros((episodes,), jnp.int32),
            jnp.ones((episodes,), bool),
        )
        (_, _, ret, length, _), _ = jax.lax.scan(step, init, jax.random.split(k_steps, max_steps))
        return ret, length

    ret, length = run(params, key)
    return np.asarray(ret), np.asarray(length)


def evaluate_run(run_dir: str | Path, episodes: int = 100, seed: int = 0) -> dict[str, Any]:
    """Statistics of the run's exported policy over `episodes` evaluation episodes."""
    run_dir = Path(run_dir)
    policy = run_dir / POLICY_DIR
    if not (policy / "act.jaxexport").is_file():
        raise ExportError(
            f"{run_dir} has no exported policy ({policy}/act.jaxexport): runs trained with "
            "`jaxrl-engine train` export it at the end; `jaxrl_engine.export.export_policy` "
            "writes one for a state in hand"
        )
    if episodes <= 0:
        raise ValueError(f"episodes={episodes}: need at least one")
    # `loggers` may name wandb, which evaluating does not need installed.
    cfg = load_config(run_dir / "config.yaml", ["loggers=[jsonl]", "progress=false"])
    env = GymnaxEnv(cfg.env.id, cfg.env.params)
    env_params = GymnaxEnv.with_params(env.params, cfg.eval.env_params)
    exported = jax.export.deserialize(bytearray((policy / "act.jaxexport").read_bytes()))
    with np.load(policy / "params.npz") as data:
        params = {name: data[name] for name in data.files}
    returns, lengths = episode_returns(
        env, env_params, exported.call, params, episodes, jax.random.key(seed)
    )
    return {
        "run_dir": str(run_dir),
        "env_id": cfg.env.id,
        "episodes": episodes,
        "seed": seed,
        "return_mean": float(returns.mean()),
        "return_std": float(returns.std()),
        "return_min": float(returns.min()),
        "return_median": float(np.median(returns)),
        "return_max": float(returns.max()),
        "length_mean": float(lengths.mean()),
    }
