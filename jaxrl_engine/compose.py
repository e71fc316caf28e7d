"""The composition root: `Config` -> `Engine` (env, algorithm, mesh, hooks, driver).

Everything that reads a config to choose a concrete piece lives here: the gymnax env and its
evaluation params, the algorithm from the registry (with a torch policy or learner injected
when `algo.torch_policy` says so), the mesh, the compile cache and the driver with its host
hooks. `make_train`, `hparams` and `resume` are built on the same path.
"""

from __future__ import annotations

import copy
import json
import math
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from jaxrl_engine.core.engine import Engine
from jaxrl_engine.core.hooks import Hook
from jaxrl_engine.core.memory import StateTooLargeError
from jaxrl_engine.core.protocols import Algorithm, Env, EnvSpec
from jaxrl_engine.core.sharding import data_mesh, to_host
from jaxrl_engine.core.state import EngineState, Metrics, Phase, hparams_arrays
from jaxrl_engine.core.train import make_train as make_engine_train
from jaxrl_engine.core.warm_up import check_env_methods
from jaxrl_engine.distributed.mesh import sweep_mesh, train_mesh
from jaxrl_engine.distributed.multihost import check_same_config
from jaxrl_engine.distributed.sweep import SweepPrograms, plan_sweep
from jaxrl_engine.envs import make_jax_env
from jaxrl_engine.envs.host import host_env
from jaxrl_engine.io.checkpoint import Checkpointer, CheckpointError
from jaxrl_engine.io.compile_cache import AUTO, configure_compile_cache
from jaxrl_engine.io.config import (
    Config,
    ConfigError,
    check_env_modules,
    config_changes,
    config_from_dict,
    parse_override,
)
from jaxrl_engine.io.files import RunDirError
from jaxrl_engine.run.driver import Driver
from jaxrl_engine.run.host_hooks import HostHook
from jaxrl_engine.run.run_dir import RunLock
from jaxrl_engine.run.sweep import SPEC_FILE, Group, SweepDriver


def num_epochs(cfg: Config) -> int:
    """Whole epochs covering `total_env_steps`."""
    return math.ceil(cfg.total_env_steps / (cfg.algo.num_steps * cfg.env.num_envs))


def make_algorithm(cfg: Config, spec: EnvSpec) -> Algorithm:
    """The configured algorithm for `spec`; PPO with `algo.torch_policy` acts (and, with
    `learner: torch`, trains) through a torch module."""
    algo = cfg.algo
    epochs = num_epochs(cfg)
    torch_cfg = getattr(algo, "torch_policy", None)
    if torch_cfg is None:
        return algo.build(spec, cfg.env.num_envs, epochs)
    from jaxrl_engine.interop.torch_learner import with_torch_learner
    from jaxrl_engine.interop.torch_policy import build_torch_policy

    conv = None if torch_cfg.critic == "torch" else algo.conv(spec)  # (the flax critic's)
    network = build_torch_policy(torch_cfg, spec, algo.hidden_sizes, algo.activation, conv=conv)
    algorithm = algo.build(spec, cfg.env.num_envs, epochs, network=network)
    if torch_cfg.learner == "torch":
        grad_steps = epochs * algorithm.grad_steps_per_epoch
        algorithm = with_torch_learner(
            algorithm,
            network,
            update_epochs=algo.update_epochs,
            num_minibatches=algo.num_minibatches,
            total_grad_steps=max(1, grad_steps) if algo.anneal_lr else None,
            normalize_obs=algo.normalize_obs,
        )
    return algorithm


def make_configured_env(cfg: Config) -> Env:
    """The env of `cfg.env`: a gymnax or Brax env, or gymnasium's or EnvPool's as a batched host env
    (its training and evaluation env sets, `eval.env_id` and `offload` included; see
    `envs/gymnasium_env.py`, `envs/envpool_env.py`)."""
    if cfg.env.host:
        return host_env(cfg, cfg.env.num_envs, cfg.eval.num_envs)
    return make_jax_env(cfg.env.suite, cfg.env.id, cfg.env.params)


def hparams(cfg: Config) -> Any:
    """The config's numeric hyperparameters as the algorithm's `HParams` pytree:
    `jre.hparams(cfg).replace(lr=...)`."""
    env = make_configured_env(cfg)
    return cfg.algo.hparams(env.spec(env.params))


def build(
    cfg: Config,
    *,
    env: Env | None = None,
    algorithm: Algorithm | None = None,
    mesh: Mesh | None = None,
    hooks: Mapping[str, Sequence[Hook]] | None = None,
    phases: Mapping[str, Phase] | None = None,
    host_hooks: Sequence[HostHook] = (),
) -> Engine:
    """The `Engine` for a config; keyword arguments inject an env (any `Env`), an algorithm,
    a mesh, per-phase hooks, replacement phases or host hooks for the driver."""
    if not isinstance(cfg, Config):
        raise TypeError(
            f"build: cfg is a {type(cfg).__name__}; give a Config: jre.load_config(path, "
            "overrides) (path None: the default config)"
        )
    configure_compile_cache(cfg.compile_cache_dir)
    env = env if env is not None else make_configured_env(cfg)
    host = getattr(env, "batched", False)  # a host env: its eval calls go to its eval set
    if host and hasattr(env, "eval_set"):  # its evaluation env set (`eval.env_id`)
        eval_params = env.eval_set(cfg.eval.env_params)
    elif cfg.eval.env_params and not host and hasattr(env, "with_params"):
        eval_params = env.with_params(env.params, cfg.eval.env_params, "eval.env_params")
    elif cfg.eval.env_params or host:
        eval_params = env.params.replace(**cfg.eval.env_params)
    else:
        eval_params = None
    actor = None
    if cfg.env.actor_device is not None:
        local = jax.local_devices()
        if cfg.env.actor_device >= len(local) or len(local) < 2:
            raise ConfigError(
                f"config key 'env.actor_device': {cfg.env.actor_device} is not one of this "
                f"process's {len(local)} device(s) other than the learner's (the actor needs a "
                "device of its own; with one, leave env.actor_device null)"
            )
        if jax.process_count() > 1:
            raise ConfigError(
                "config key 'env.actor_device': not supported in a multi-process run (each "
                "process would build another learner mesh)"
            )
        if cfg.profile:
            raise ConfigError(
                "config key 'env.actor_device': profile=true runs each phase as its own call, "
                "without the actor; set one of them"
            )
        actor = local[cfg.env.actor_device]
        if mesh is None:  # the learner's data mesh: the other devices (one for a host env)
            others = [d for d in jax.devices() if d != actor]
            if cfg.mesh.data is not None and cfg.mesh.data > len(others):
                raise ConfigError(
                    f"config key 'mesh.data': {cfg.mesh.data} learner devices asked, "
                    f"{len(others)} are left besides the actor's (env.actor_device="
                    f"{cfg.env.actor_device})"
                )
            mesh = train_mesh(cfg.mesh, others[:1] if host and cfg.mesh.data is None else others)
        elif actor in set(mesh.devices.flat):
            raise ConfigError(
                f"config key 'env.actor_device': device {actor} is also in the learner's mesh"
            )
    mesh = mesh if mesh is not None else train_mesh(cfg.mesh)
    if host and mesh.size > 1:
        raise ConfigError(
            f"env.suite={cfg.env.suite} steps its envs on the host: it runs on one device, "
            f"and the 'data' mesh has {mesh.size}"
        )
    counts = (("env.num_envs", cfg.env.num_envs), ("eval.num_envs", cfg.eval.num_envs))
    uneven = [f"{key}={n}" for key, n in counts if n % mesh.size]
    if uneven:
        raise ConfigError(
            f"{' and '.join(uneven)} must be multiples of the {mesh.size} devices of the 'data' "
            "mesh axis "
            + (
                f"(mesh.data; the devices besides env.actor_device={cfg.env.actor_device})"
                if actor is not None
                else "(mesh.data; mesh.data=1 runs on one device)"
            )
        )
    if algorithm is None:
        check_env_methods(env, params=True)
        try:
            algorithm = make_algorithm(cfg, env.spec(env.params))
        except ValueError as e:  # the algorithm does not fit the env (e.g. DQN on Pendulum)
            raise ConfigError(str(e)) from None
    own_rollout = bool((phases or {}).get("rollout") or (hooks or {}).get("rollout"))
    overlap = (
        cfg.env.overlap
        if cfg.env.overlap is not None
        # (the default: on for host envs with on-policy algorithms, unless the user hooks or
        # replaces the rollout, which the actor cannot run: see below)
        else (host and algorithm.on_policy and not own_rollout) or actor is not None
    )
    if overlap and cfg.offload and not host and (actor is not None or not algorithm.on_policy):
        raise ConfigError(
            "offload=true with env.overlap is supported for on-policy algorithms with the "
            "actor on the learner's devices (env.actor_device null): the offload placement "
            "moves state onto the learner's mesh"
        )
    if overlap and own_rollout:
        why = (
            "splits rollout into the actor's collection and the learner's replay-buffer write, "
            "so a replaced or hooked rollout phase would not run"
            if not algorithm.on_policy
            else "runs the rollout on the actor's copy of the state, taken at each chunk's "
            "start: a replaced or hooked rollout phase would see that chunk's counters and "
            "hyperparameters, and its changes to the state besides the env and buffer would "
            "be dropped"
        )
        raise ConfigError(
            f"env.overlap with algo.name={algorithm.name} {why}: set env.overlap=false"
            + (" (and env.actor_device=null)" if actor is not None else "")
        )
    try:
        engine = Engine(
            env,
            algorithm,
            num_envs=cfg.env.num_envs,
            num_steps=cfg.algo.num_steps,
            num_epochs=num_epochs(cfg),
            eval_env_params=eval_params,
            eval_envs=cfg.eval.num_envs,
            eval_episodes=cfg.eval.episodes,
            eval_deterministic=cfg.eval.deterministic,
            eval_interval=cfg.eval.interval,
            mesh=mesh,
            phases=phases,
            hooks=hooks,
            # With a host env, `offload` closes the idle env set (the env's own `offload`); the
            # params' memory-kind moves are left out: jax 0.10.2 cannot compile a jit holding both
            # an ordered io_callback and a device_put to another memory kind (architecture notes).
            offload=cfg.offload and not host,
            nan_guard=cfg.nan_guard,
            driver=Driver(cfg, host_hooks, overlap=overlap, actor_device=actor),
        )
    except StateTooLargeError as e:
        raise _with_size_keys(e, cfg) from None
    return engine


def _with_size_keys(e: StateTooLargeError, cfg: Config) -> StateTooLargeError:
    """`e` with the config keys that size the state."""
    sizes = ["algo.hidden_sizes (the networks)", "env.num_envs"]
    sizes += ["algo.buffer_size"] if hasattr(cfg.algo, "buffer_size") else ["algo.num_steps"]
    return StateTooLargeError(f"{e}. Its sizes come from {', '.join(sizes)}")


def make_train(cfg: Config, **build_kwargs: Any) -> Callable[..., tuple[EngineState, Metrics]]:
    """`train(key, hparams=None) -> (state, metrics)`: the whole training as one pure function
    (`core.train.make_train` over `build(cfg)`); `jax.jit(jax.vmap(train))(keys, hparams)`
    trains many seeds and hyperparameter settings at once."""
    return make_engine_train(build(cfg, **build_kwargs))


TRUSTED_FACTORY_MODULE = "jaxrl_engine.interop.torch_nets"  # the package's own factories


def stored_factory(stored: dict[str, Any]) -> str | None:
    """The torch factory a run's stored config (data, not validated) names, if any."""
    algo = stored.get("algo")
    torch_policy = algo.get("torch_policy") if isinstance(algo, dict) else None
    factory = torch_policy.get("factory") if isinstance(torch_policy, dict) else None
    return None if factory is None else str(factory)


def needs_naming(factory: str) -> bool:
    """A factory outside this package: used for a run directory only when the user names it."""
    return factory.partition(":")[0] != TRUSTED_FACTORY_MODULE


def config_from_run(
    stored: dict[str, Any], overrides: Sequence[str] = (), *, source: str, how: str
) -> Config:
    """The config of a run directory (its config.yaml or a checkpoint's), with `overrides`.

    A run directory is data, never code: nothing it names is imported or loaded on its word.
    A torch factory outside this package is used only when the user names the same one in
    `overrides` (`how` says where: a CLI flag or an override), else `ConfigError`; a stored
    `compile_cache_dir` folder (compiled executables are code) is replaced by `auto` (the
    user's own cache folder) unless given again.
    """
    overrides = list(overrides)
    given = [item.split("=", 1)[0] for item in overrides]
    check_env_modules(stored, given, source)
    raw = copy.deepcopy(stored)
    cache = raw.get("compile_cache_dir")
    if cache and cache != AUTO and "compile_cache_dir" not in given:
        raw["compile_cache_dir"] = AUTO
        print(
            f"jaxrl-engine: not using the compile cache {cache!r} that {source} names (compiled "
            f"code is not taken from a run directory; your own, {AUTO!r}, is used); pass "
            f"compile_cache_dir={cache} to use it",
            file=sys.stderr,
        )
    factory = stored_factory(stored)
    if factory is None and "algo.torch_policy.factory" in given:
        # (checked before validation, which would import and call the factory)
        raise ConfigError(
            f"{source} was not trained with a torch factory (algo.torch_policy is unset: its "
            "network is the engine's own), so there is none to name: drop it"
        )
    try:
        cfg = config_from_dict(raw, overrides)  # (sets the overrides in `raw`)
    except ConfigError as e:
        try:  # whose is the mistake: the stored config's, or the overrides'?
            config_from_dict(copy.deepcopy(stored), [])
        except ConfigError:
            raise ConfigError(f"{source} holds a config this version refuses: {e}") from None
        raise
    if factory is None or not needs_naming(factory):
        return cfg
    named = any(key in ("algo", "algo.torch_policy", "algo.torch_policy.factory") for key in given)
    if not named:
        raise ConfigError(
            f"{source} names the torch factory {factory!r} for its policy; a run directory is "
            "data, never code, so it is not imported on its word: if that module is yours, "
            f"name it yourself with {how.format(factory=factory)}"
        )
    if cfg.algo.torch_policy.factory != factory:
        raise ConfigError(
            f"algo.torch_policy.factory={cfg.algo.torch_policy.factory!r} is not the factory "
            f"{factory!r} that {source} was trained with; its weights belong to that network: "
            "name the same one"
        )
    return cfg


def sweep_member(path: Path) -> bool:
    """`path` is a member's run directory inside a sweep's directory (which holds its
    checkpoints: the member has none of its own)."""
    return (path.parent / "sweep.json").is_file() and (path / "metrics.jsonl").is_file()


def resume(
    run_dir: str | Path,
    overrides: list[str] | None = None,
    *,
    epoch: int | None = None,
    factory_hint: str = "algo.torch_policy.factory={factory}",
    **build_kwargs: Any,
) -> tuple[Engine, EngineState]:
    """Continue a run: `engine, state = resume("runs/x"); engine.run(state)`.

    Builds the engine from the checkpoint's config (the latest, or that of `epoch`; dotted
    `overrides` may not change any shape) and restores the whole state onto the engine's
    shardings; nothing in the run directory changes here. `engine.run(state)` then puts the
    run's `metrics.jsonl` back to its length at the checkpoint (records written after it
    are computed again, identically) and, when an earlier `epoch` was chosen, sets the later
    checkpoints aside in `discarded_checkpoints/`. A finished run's `engine.run` returns its
    summary unchanged. The hyperparameters are the checkpoint's (a hook may have changed them
    in training), except those an override changes (from here on). Raises `CheckpointError` or `ConfigError` with one clear
    message, before anything is compiled.
    """
    path = Path(run_dir)
    if not str(run_dir) or not path.is_dir():
        raise CheckpointError(f"cannot resume: run directory {str(run_dir)!r} does not exist")
    if path.name in ("", ".", ".."):  # `--resume .` from inside the run directory
        path = path.resolve()
    if path.name == "checkpoints" or (path / "_CHECKPOINT_METADATA").exists():
        raise CheckpointError(
            f"cannot resume from {str(path)!r}: that is a checkpoint; pass its run directory "
            f"({str(path.parent if path.name == 'checkpoints' else path.parent.parent)!r}), "
            "which continues from its latest checkpoint"
        )
    if (path / SPEC_FILE).is_file() and not (path / "metrics.jsonl").exists():
        raise CheckpointError(
            f"cannot resume {str(path)!r} as a run: it is a sweep's directory; continue the "
            f"sweep with jre.resume_sweep({str(path)!r}) (`jaxrl-engine sweep --resume {path}`)"
        )
    _refuse_in_use(path)
    if not (path / "checkpoints").is_dir():
        raise CheckpointError(
            f"cannot resume: {str(path)!r} has no checkpoints/ "
            + (
                f"(it is a member of the sweep {str(path.parent)!r}, whose checkpoints hold "
                f"all its members: jre.resume_sweep({str(path.parent)!r}), or `jaxrl-engine "
                f"sweep --resume {path.parent}`)"
                if sweep_member(path)
                else "(is it a run directory? runs with save_interval=0 write none)"
            )
        )
    for item in overrides or []:
        key = item.split("=", 1)[0]
        if key in ("name", "run_dir"):
            raise ConfigError(
                f"override {item!r}: a resumed run stays in its run directory {str(path)!r}"
            )
        if key == "seed":  # the PRNG state is the checkpoint's: a new seed would change nothing
            raise ConfigError(
                f"override {item!r}: a resumed run continues its checkpoint's random state, so "
                "its seed cannot change (start a new run for another seed)"
            )
    checkpoints = Checkpointer(path / "checkpoints", read_only=True)
    try:
        if not checkpoints.epochs():
            raise CheckpointError(
                f"cannot resume {str(path)!r}: it stopped before its first checkpoint (every "
                "save_interval epochs), so there is no state to continue; train it again from "
                "the start (the same command without --resume)"
            )
        info = checkpoints.info(epoch)
        stored_algo = info.config.get("algo", {}).get("name")
        for item in overrides or []:
            key, value = parse_override(item) if "=" in item else (item, None)
            if key == "algo.name" and stored_algo is not None and value != stored_algo:
                raise ConfigError(
                    f"override {item!r}: a resumed run continues its checkpoint's algorithm "
                    f"({stored_algo}); start a new run (another name=) for another"
                )
        stored = {**info.config, "name": path.name, "run_dir": str(path.parent)}
        cfg = config_from_run(
            stored, overrides or [], source=f"checkpoint {str(info.path)!r}", how=factory_hint
        )
        check_same_config(cfg.model_dump(mode="json"))  # (a multi-process job's processes)
        if cfg.total_env_steps != info.config.get("total_env_steps") and (
            num_epochs(cfg) < info.epoch
        ):
            raise ConfigError(
                f"override total_env_steps={cfg.total_env_steps} ({num_epochs(cfg)} epochs of "
                f"{cfg.algo.num_steps * cfg.env.num_envs} env steps) is below what checkpoint "
                f"{str(info.path)!r} has trained (epoch {info.epoch}): the run would end "
                "marked completed with no epoch trained; a resume keeps or lengthens a run "
                "(give at least "
                f"{info.epoch * cfg.algo.num_steps * cfg.env.num_envs}, or start a new run)"
            )
        # Keys a resume cannot change although no shape changes (the layout check passes)
        fixed = [
            (
                key,
                "it only sets the trained state's initial value, which a resumed run takes "
                "from its checkpoint (algo.{key} was {was})",
            )
            for key in sorted(getattr(cfg.algo, "init_only_keys", ()))
        ] + [
            (
                key,
                "the checkpoint's params were trained with algo.{key}={was}, and another "
                "would change what they compute (not their shapes)",
            )
            for key in sorted(getattr(cfg.algo, "trained_with_keys", ()))
        ]
        for key, why in fixed:
            was, now = info.config.get("algo", {}).get(key), getattr(cfg.algo, key, None)
            if was is not None and now is not None and was != now:
                raise ConfigError(
                    f"override algo.{key}={now}: {why.format(key=key, was=was)}; start a new "
                    "run (another name=) for another"
                )
        engine = build(cfg, **build_kwargs)
        resolved = cfg.model_dump(mode="json")
        state, info = checkpoints.restore(
            engine, info.epoch, config=resolved, hparams=hparams_arrays(engine.hparams)
        )
    finally:
        checkpoints.close()
    state, kept = _resumed_hparams(engine, state, info.config, resolved)
    missing = {
        kind: sorted(set(names) - set(engine.user_parts.get(kind, ())))
        for kind, names in info.user_parts.items()
    }
    if any(missing.values()):
        said = " and ".join(
            f"{'your own ' if kind == 'phases' else 'hooks on '}{', '.join(names)}"
            + (" phase(s)" if kind == "phases" else "")
            for kind, names in missing.items()
            if names
        )
        warnings.warn(
            f"{str(path)!r} was trained with {said}, which this resume lacks (a config cannot "
            "name them): pass them again, jre.resume(path, phases=..., hooks=...), or the run "
            "trains on without them",
            stacklevel=2,
        )
    if epoch is not None and isinstance(engine.driver, Driver):
        engine.driver.resume_from = info.epoch
    changes = config_changes(info.config, resolved)
    stretched = ""
    if info.config.get("total_env_steps") != cfg.total_env_steps and (
        scheduled := cfg.algo.run_length_schedules()
    ):
        stretched = (
            f" ({' and '.join(scheduled)}: scheduled over the new total_env_steps from this "
            "epoch on, so the run differs from one trained to it from the start)"
        )
    print(
        f"jaxrl-engine: resuming {path} from its checkpoint of epoch {info.epoch}"
        + (f", with config changes: {'; '.join(changes)}{stretched}" if changes else "")
        + (f"; hyperparameters as the checkpoint has them: {', '.join(kept)}" if kept else ""),
        file=sys.stderr,
    )
    return engine, state


def _refuse_in_use(path: Path) -> None:
    """`RunDirError` when a run (or sweep) of `path` is going on now: its checkpoints are
    still being written, and the resume would fail later (or read one being rotated away)."""
    holder = RunLock(path).holder()
    if holder is not None:
        raise RunDirError(
            f"cannot resume {str(path)!r}: it is in use by another run (pid {holder}), which "
            "is still training it; wait for it to end, or stop it (Ctrl-C or SIGTERM: it "
            "checkpoints) and resume then"
        )


def _resumed_hparams(
    engine: Engine, state: EngineState, stored: dict[str, Any], resolved: dict[str, Any]
) -> tuple[EngineState, list[str]]:
    """`state` with the checkpoint's hyperparameters (a hook may have changed them in
    training: the resume stays exact), except those whose `algo.<key>` the resumed config
    changed (an override applies from here on). Also returns, for the message, the kept
    values that differ from the config's."""
    was, now = stored.get("algo", {}), resolved.get("algo", {})
    kept: list[str] = []

    def pick(path: Any, saved: Any, configured: Any) -> Any:
        key = str(getattr(path[-1], "name", path[-1]))
        if was.get(key) != now.get(key):
            return configured
        value = to_host(saved)
        if value.shape == () and not np.isclose(value, np.asarray(configured, value.dtype)):
            kept.append(f"algo.{key}={value.item():.6g} (config: {configured})")
        return saved

    hparams = jax.tree_util.tree_map_with_path(pick, state.hparams, engine.hparams)
    return engine.with_hparams(state, hparams), kept


# ---------------------------------------------------------------------------------- sweeps
def sweep(
    cfg: Config,
    seeds: Any = None,
    grid: Mapping[str, Sequence[Any]] | None = None,
    *,
    split_static: bool = False,
    num_epochs: int | None = None,
    progress: bool | None = None,
) -> dict[str, Any]:
    """Train `seeds` x the cartesian product of `grid` (`{"algo.lr": [1e-4, 3e-4]}`) over
    `cfg`, each static group of members as ONE compiled program (the engine's chunk vmapped
    over the members, sharded over the `sweep` mesh axis), into `runs/<name>/`: one run
    directory per member, `sweep.csv` and `summary.json` (see `run/sweep.py`).

    seeds: `[0, 1]`, `range(16)`, `np.arange(16)`, `"0..15"` (inclusive) or an int, which is
    one seed (None: `[cfg.seed]`). Only traced keys (the algorithm's `traced_keys`) may vary
    inside one program; another key with several
    values is a `ConfigError` naming it, unless `split_static` (one program per distinct
    static setting). num_epochs: train up to this many epochs (default: the config's; the rest
    with `resume_sweep`). Returns the sweep summary plus `table`, the per-setting table.
    """
    plan = plan_sweep(cfg, [cfg.seed] if seeds is None else seeds, grid, split_static)
    spec = {
        "config": cfg.model_dump(mode="json"),
        "seeds": plan.seeds,
        "grid": plan.grid,
        "split_static": split_static,
    }
    return _sweep_driver(cfg, plan.groups, spec).run(num_epochs=num_epochs, progress=progress)


def resume_sweep(
    run_dir: str | Path, *, num_epochs: int | None = None, progress: bool | None = None
) -> dict[str, Any]:
    """Continue a sweep from each group's latest checkpoint (`sweep(...)`'s summary): its
    config, seeds and grid come from `<run_dir>/sweep.json`."""
    path = Path(run_dir)
    if path.name in ("", ".", ".."):
        path = path.resolve()
    spec_file = path / SPEC_FILE
    if not spec_file.is_file():
        raise CheckpointError(
            f"cannot resume: {str(path)!r} is not a sweep directory (no {SPEC_FILE})"
        )
    _refuse_in_use(path)
    try:
        spec = json.loads(spec_file.read_text())
        stored = {**spec["config"], "name": path.name, "run_dir": str(path.parent)}
        seeds, grid, split = spec["seeds"], spec["grid"], bool(spec["split_static"])
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"cannot resume: {str(spec_file)!r} is unreadable ({e})") from None
    cfg = config_from_run(
        stored, [], source=str(spec_file), how="a sweep of your own with that factory"
    )
    plan = plan_sweep(cfg, seeds, grid, split)
    spec = {**spec, "config": cfg.model_dump(mode="json")}
    driver = _sweep_driver(cfg, plan.groups, spec)
    return driver.run(num_epochs=num_epochs, progress=progress, resume=True)


def _sweep_driver(cfg: Config, groups: list[list[Any]], spec: dict[str, Any]) -> SweepDriver:
    """Every group's mesh and engine, checked before anything is compiled."""
    check_same_config(spec, "sweep")  # (a multi-process job's processes)
    built = []
    for g, members in enumerate(groups):
        mesh = sweep_mesh(cfg.mesh, len(members))
        engine = build(members[0].cfg, mesh=data_mesh(list(mesh.devices[0])))
        try:
            programs = SweepPrograms(engine, mesh, len(members))
        except StateTooLargeError as e:
            raise _with_size_keys(e, cfg) from None
        built.append(Group(f"group{g}", members, programs))
    return SweepDriver(cfg, spec, built)
