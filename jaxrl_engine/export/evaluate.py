"""`jaxrl-engine eval`: run a run directory's exported policy for N episodes; statistics.

The policy is the artefact in `runs/<name>/policy/` (`act.jaxexport` + `params.npz`), called as
is inside a jitted `lax.scan` over the env (vmapped over episodes): what is evaluated is what a
user deploys, not the training code. The env is the run's evaluation env (`env.id` with
`env.params` and `eval.env_params` from its `config.yaml`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxrl_engine.core.phases import evaluate_episodes
from jaxrl_engine.envs import make_jax_env
from jaxrl_engine.envs.host import host_env
from jaxrl_engine.export.policy import POLICY_DIR, ExportError, load_exported
from jaxrl_engine.io.config import (
    Config,
    ConfigError,
    check_env_modules,
    config_from_dict,
    read_config,
)
from jaxrl_engine.io.schema import check_eval_request

EVAL_BATCH = 1024  # episodes stepped at once; more run in rounds


def _run_config(run_dir: Path) -> Config:
    """The run's config; what it names is imported only where this process already has it
    (`check_env_modules`). `loggers` may name wandb, which evaluating does not need installed."""
    stored = read_config(run_dir / "config.yaml")
    check_env_modules(stored, [], str(run_dir / "config.yaml"))
    try:
        return config_from_dict(stored, ["loggers=[jsonl]", "progress=false"])
    except ConfigError as e:  # (the overrides above are valid: the file's values are not)
        raise ConfigError(
            f"{run_dir / 'config.yaml'} holds a config this version refuses: {e}"
        ) from None


def never_exported(run_dir: str | Path) -> str | None:
    """Why the run has no exported policy to expect, when its config acts through the
    universal torch path (a host callback: no StableHLO form); None otherwise or unreadable."""
    try:
        cfg = _run_config(Path(run_dir))
    except (OSError, ValueError):
        return None
    torch_policy = getattr(cfg.algo, "torch_policy", None)
    if torch_policy is None or torch_policy.path != "universal":
        return None
    return (
        f"{run_dir} has no exported policy: a policy acting through a host callback "
        "(algo.torch_policy.path=universal) has no StableHLO form to export; act with "
        f"jre.make_policy({str(run_dir)!r}, checkpoint=True, factory=...) instead"
    )


def _check_observations(exported: Any, spec: Any, run_dir: Path) -> None:
    """ExportError when the env gives observations the exported policy does not take (the
    env changed since training: a user's env module edited, another package version)."""
    obs = exported.in_avals[-1]  # (params..., obs[batch, ...])
    want = tuple(int(d) for d in obs.shape[1:])
    if want != tuple(spec.obs_shape) or np.dtype(obs.dtype) != np.dtype(spec.obs_dtype):
        trained = _exported_env_id(run_dir)
        cause = (
            f"{run_dir / 'config.yaml'} names env {spec.env_id!r}, the policy was exported "
            f"for {trained!r} ({run_dir / POLICY_DIR / 'meta.json'}): the config was edited"
            if trained is not None and trained != spec.env_id
            else "the env changed since training (its module or package)"
        )
        raise ExportError(
            f"{run_dir}: env {spec.env_id!r} now gives observations of shape "
            f"{list(spec.obs_shape)} {np.dtype(spec.obs_dtype).name}, but the run's exported "
            f"policy takes {list(want)} {np.dtype(obs.dtype).name}: {cause}, so this policy "
            "cannot be evaluated on it"
        )


def _exported_env_id(run_dir: Path) -> str | None:
    """The env id the run's `policy/meta.json` records (None: unreadable)."""
    try:
        env_id = json.loads((run_dir / POLICY_DIR / "meta.json").read_text()).get("env_id")
    except (OSError, ValueError, AttributeError):
        return None
    return env_id if isinstance(env_id, str) else None


def evaluate_run(run_dir: str | Path, episodes: int = 100, seed: int = 0) -> dict[str, Any]:
    """Statistics of the run's exported policy over `episodes` evaluation episodes."""
    run_dir = Path(run_dir)
    policy = run_dir / POLICY_DIR
    if not (policy / "act.jaxexport").is_file():
        reason = never_exported(run_dir)
        if reason:
            raise ExportError(reason)
        raise ExportError(
            f"{run_dir} has no exported policy ({policy}/act.jaxexport): "
            + (
                f"`jaxrl-engine export {run_dir} --checkpoint` writes one from its latest "
                "checkpoint (a run that was stopped exports none)"
                if (run_dir / "checkpoints").is_dir()
                else "runs trained with `jaxrl-engine train` export it at the end; "
                "`jaxrl_engine.export.export_policy` writes one for a state in hand"
            )
        )
    check_eval_request(episodes, seed)
    cfg = _run_config(run_dir)
    # Episodes run in rounds of at most EVAL_BATCH envs at once (memory stays bounded).
    batch = min(episodes, EVAL_BATCH)
    env: Any
    if cfg.env.host:  # a host env: one evaluation env per episode of a round
        env = host_env(cfg, 1, batch)
        env_params = env.eval_set(cfg.eval.env_params)
    else:  # gymnax or Brax: stepped inside the jitted evaluation
        env = make_jax_env(cfg.env.suite, cfg.env.id, cfg.env.params)
        env_params = env.with_params(env.params, cfg.eval.env_params)
    exported, params = load_exported(policy)

    _check_observations(exported, env.spec(env_params), run_dir)

    @jax.jit
    def run(params: Any, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        return evaluate_episodes(
            env,
            env_params,
            lambda obs, _: exported.call(params, obs),
            batch,
            key,
            episodes if episodes > batch else None,
        )

    returns, lengths = (np.asarray(x) for x in run(params, jax.random.key(seed)))
    return {
        "run_dir": str(run_dir.absolute()),
        "env_id": env.id_of(env_params) if cfg.env.host else cfg.env.id,
        "episodes": episodes,
        "seed": seed,
        # the exported policy acts greedily, whatever eval.deterministic the run trained with
        "eval_policy": "deterministic",
        "return_mean": float(returns.mean()),
        "return_std": float(returns.std()),
        "return_min": float(returns.min()),
        "return_median": float(np.median(returns)),
        "return_max": float(returns.max()),
        "length_mean": float(lengths.mean()),
    }
