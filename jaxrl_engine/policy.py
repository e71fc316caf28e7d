"""Acting with a trained policy, Brax-style: `policy = jre.make_policy(source)`; `policy(obs)`.

A source is an `(engine, state)` pair or a run directory. From a run directory the engine is
rebuilt from the run's `config.yaml` (nothing is compiled until the policy is called) and the
params are the exported policy's (`policy/params.npz`, written at the end of a run), or, when
there is none or `checkpoint=True`, the acting params of the latest checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_engine.compose import (
    build,
    config_from_run,
    needs_naming,
    stored_factory,
    sweep_member,
)
from jaxrl_engine.core.engine import Engine, JaxSettingError
from jaxrl_engine.core.state import EngineState, hparams_arrays
from jaxrl_engine.export.policy import (
    POLICY_DIR,
    ExportError,
    export_policy,
    load_exported,
    load_params,
)
from jaxrl_engine.io.checkpoint import Checkpointer, CheckpointError
from jaxrl_engine.io.config import ALGO_NAMES, read_config
from jaxrl_engine.io.files import check_no_symlinks
from jaxrl_engine.io.plot import not_a_sweep
from jaxrl_engine.run.run_dir import RunLock

# `loggers` may name wandb, which acting does not need installed; loading a policy (in someone
# else's process, say) does not switch on JAX's process-wide compile cache.
QUIET = ["loggers=[jsonl]", "progress=false", "compile_cache_dir=null"]
FACTORY_HINT = "make_policy(..., factory={factory!r}) (CLI: --factory {factory})"


def _engine_for_run(run: Path, factory: str | None) -> Engine:
    if not (run / "config.yaml").is_file():
        raise ExportError(f"{run} is not a run directory (no config.yaml)")
    # Read, not validated: `config_from_run` first decides what the stored config may import.
    stored = read_config(run / "config.yaml")
    source = str(run / "config.yaml")
    return build(config_from_run(stored, _overrides(factory), source=source, how=FACTORY_HINT))


def batch_of_observations(obs: Any, obs_shape: Sequence[Any]) -> jax.Array:
    """`obs` as an array `[batch, *obs_shape]`, else a ValueError naming both shapes (before
    the network sees it: its own error would name a layer's kernel)."""
    obs = jnp.asarray(obs)
    want = tuple(int(d) for d in obs_shape)
    if obs.shape[1:] != want or obs.ndim != len(want) + 1:
        one = " (one observation: obs[None])" if obs.shape == want else ""
        raise ValueError(
            f"policy(obs): obs has shape {list(obs.shape)}, this policy takes "
            f"[batch{''.join(f', {d}' for d in want)}]{one}"
        )
    return obs


def _names_user_code(run: Path) -> bool:
    """The run was trained with a torch factory of the user's, which is imported only when
    the user names it (`compose.config_from_run`)."""
    try:
        factory = stored_factory(read_config(run / "config.yaml"))
    except (OSError, ValueError):
        return False  # (`_engine_for_run` says what is wrong with the run directory)
    return factory is not None and needs_naming(factory)


def _users_algorithm(run: Path) -> str | None:
    """The name of the algorithm the run's policy was exported from, when it is one given to
    `jre.build(algorithm=...)` (no config names it, so its config.yaml rebuilds another)."""
    try:
        name = json.loads((run / POLICY_DIR / "meta.json").read_text()).get("algorithm")
    except (OSError, ValueError, AttributeError):
        return None
    return name if isinstance(name, str) and name not in ALGO_NAMES else None


def _exported_policy(directory: Path) -> Callable[..., jax.Array]:
    """The deterministic policy of an exported artefact: the StableHLO graph the run exported
    (as `jaxrl-engine eval` plays it), so no code of the run's is imported."""
    exported, params = load_exported(directory)
    obs_aval = exported.in_avals[-1]  # (params..., obs[batch, ...])
    obs_shape, obs_dtype = obs_aval.shape[1:], obs_aval.dtype
    float_obs = jnp.issubdtype(obs_dtype, jnp.floating)

    def policy(obs: jax.Array, key: jax.Array | None = None) -> jax.Array:
        del key  # (deterministic)
        obs = batch_of_observations(obs, obs_shape)
        if float_obs and jnp.issubdtype(obs.dtype, jnp.floating):
            obs = obs.astype(obs_dtype)  # (float64 under jax_enable_x64: the graph's float32)
        return exported.call(params, obs)

    return policy


def _overrides(factory: str | None) -> list[str]:
    return QUIET + ([] if factory is None else [f"algo.torch_policy.factory={factory}"])


PRUNED_RETRIES = 3  # reads of a newer latest checkpoint when the one read was pruned


def _checkpoint_params(run: Path, factory: str | None) -> tuple[Engine, EngineState]:
    """(engine, state) of the run's latest checkpoint; the engine from its stored config."""
    if not (run / "checkpoints").is_dir():
        where = (
            f" (a sweep member: its checkpoints are the sweep's, {run.parent / 'checkpoints'}; "
            f"its policy/ is written when its sweep completes or pauses: continue it with "
            f"jre.resume_sweep({str(run.parent)!r}))"
            if sweep_member(run)
            else ""
        )
        raise ExportError(f"{run} has no checkpoints/ to read a policy from{where}")
    checkpoints = Checkpointer(run / "checkpoints", read_only=True)
    built: dict[str, Engine] = {}  # (by config: a retry reads a checkpoint of the same)
    try:
        for attempt in range(PRUNED_RETRIES + 1):
            epoch = checkpoints.latest()
            try:
                info = checkpoints.info(epoch)
                raw = {**info.config, "name": run.name, "run_dir": str(run.parent)}
                cfg = config_from_run(
                    raw,
                    _overrides(factory),
                    source=f"checkpoint {str(info.path)!r}",
                    how=FACTORY_HINT,
                )
                key = json.dumps(cfg.model_dump(mode="json"), sort_keys=True)
                if key not in built:
                    built[key] = build(cfg)
                engine = built[key]
                state, _ = checkpoints.restore(
                    engine,
                    info.epoch,
                    config=cfg.model_dump(mode="json"),
                    hparams=hparams_arrays(engine.hparams),
                )
                return engine, state
            except (CheckpointError, OSError):
                # A run still training removes its older checkpoints (keep_checkpoints): the
                # latest when listed may be gone by the time it is read; the newer one is read
                if epoch is None or attempt == PRUNED_RETRIES or epoch in checkpoints.epochs():
                    raise
    finally:
        checkpoints.close()
    raise AssertionError("unreachable")  # (the loop returns or raises)


def make_policy(
    source: str | Path | tuple[Engine, EngineState],
    deterministic: bool = True,
    *,
    checkpoint: bool = False,
    factory: str | None = None,
) -> Callable[..., jax.Array]:
    """`policy(obs, key=None) -> action`, jittable: obs `[batch, *obs_shape]` -> the action the
    env takes `[batch, *action_shape]` (continuous actions clipped to the bounds).

    deterministic: the evaluation action (argmax / mean); otherwise sampled with `key`
    (required then). checkpoint: read the params from the latest checkpoint even when the run
    has an exported policy. factory: the torch factory of a run trained with
    `algo.torch_policy` (a run directory is data: the factory it names is imported only when
    you name the same one here). Without it, a deterministic policy of such a run is its
    exported artefact (`policy/act.jaxexport`, what `jaxrl-engine eval` plays), as is a
    run's deterministic policy under `jax_enable_x64`, which the engine cannot be built under.
    """
    if isinstance(source, tuple):
        if not (
            len(source) == 2
            and isinstance(source[0], Engine)
            and isinstance(source[1], EngineState)
        ):
            raise TypeError(
                "make_policy: source is an (engine, state) pair or a run directory, not a tuple "
                f"of {[type(x).__name__ for x in source]}"
            )
        engine, state = source
        params = state.eval_params
    else:
        run = Path(source)
        problem = not_a_sweep(run, "make_policy takes")
        if problem:
            raise ExportError(problem)
        exported = not checkpoint and (run / POLICY_DIR / "act.jaxexport").is_file()
        yours = _users_algorithm(run)
        # (under jax_enable_x64 the engine cannot be built, but the exported graph, float32
        # inside, runs: observations are cast to its dtype)
        x64 = bool(jax.config.read("jax_enable_x64"))
        if (
            exported
            and deterministic
            and (x64 or yours or (factory is None and _names_user_code(run)))
        ):
            return _exported_policy(run / POLICY_DIR)
        if x64:
            what = (
                "sampling actions"
                if not deterministic
                else "reading the checkpoint's params"
                if checkpoint
                else "a run without an exported policy"
            )
            raise JaxSettingError(
                f"make_policy({str(run)!r}): {what} needs the run's engine, which is not built "
                "while jax_enable_x64 is on (it trains in float32 and int32): turn it off "
                "(jax.config.update('jax_enable_x64', False)), or take the deterministic "
                "policy, which plays the exported graph under x64 too"
            )
        if yours:
            raise ExportError(
                f"{run} was trained with the algorithm {yours!r} given to "
                "jre.build(algorithm=...), which its config.yaml cannot name: its deterministic "
                "policy is the exported graph (make_policy(run)); for sampled actions or its "
                "checkpoint, engine, state = jre.resume(run, algorithm=...) and "
                "make_policy((engine, state))"
            )
        if checkpoint or not (run / POLICY_DIR / "params.npz").is_file():
            engine, state = _checkpoint_params(run, factory)
            params = state.eval_params
        else:
            engine = _engine_for_run(run, factory)
            try:
                params = load_params(engine, run / POLICY_DIR)
            except ExportError as e:
                if exported and deterministic:
                    # Another network than config.yaml builds (one given to
                    # `algo.build(network=...)`): the exported graph is the trained one.
                    return _exported_policy(run / POLICY_DIR)
                raise ExportError(
                    f"{e} (a network given to algo.build(network=...) is not in config.yaml: "
                    "the exported graph is its deterministic policy, make_policy(run); for "
                    "sampled actions, make_policy((engine, state)) with your engine)"
                ) from None
    params = jax.device_get(params)
    act, clip = engine.algo.act, engine.spec.action.clip

    def policy(obs: jax.Array, key: jax.Array | None = None) -> jax.Array:
        obs = batch_of_observations(obs, engine.spec.obs_shape)
        if key is None:
            if not deterministic:
                raise ValueError("make_policy(..., deterministic=False): pass a PRNG key")
            key = jax.random.key(0)
        return clip(act(params, obs, key, deterministic)[0])

    return policy


def export_from_checkpoint(run_dir: str | Path, factory: str | None = None) -> Path:
    """Write `<run_dir>/policy/` from the run's latest full-state checkpoint, e.g. for a run
    stopped by SIGINT before its end-of-run export (holding the run directory's lock, so not
    while a run trains in it). The run directory is otherwise only read."""
    run = Path(run_dir)
    engine, state = _checkpoint_params(run, factory)
    # (a run that trains on exports its own policy when it ends)
    lock = RunLock(run, instead="or let it end: it exports its policy then")
    lock.acquire()
    try:
        check_no_symlinks(run)
        return export_policy(engine, state.eval_params, run / POLICY_DIR)
    finally:
        lock.release()
