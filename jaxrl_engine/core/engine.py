"""The engine: hooked, jitted phases over one `EngineState`, the fused epoch, warm-up.

`Engine(env, algorithm, ...)` knows the `Env` and `Algorithm` protocols only: no config, no
files, no export. `jaxrl_engine.compose` turns a `Config` into one; a user can build one directly,
replace any phase (`phases={"update_dataset": my_phase}`) and add hooks per phase.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_engine.core.batching import one_key_at_a_time
from jaxrl_engine.core.hooks import Hook, chain
from jaxrl_engine.core.memory import check_state_fits
from jaxrl_engine.core.nan_guard import (
    GUARD_ORDER,
    GUARDED_STATE,
    GuardNames,
)
from jaxrl_engine.core.nan_guard import nan_guard as guard_hook
from jaxrl_engine.core.offload import OFFLOADED_BETWEEN_EPOCHS, placement_hooks
from jaxrl_engine.core.phases import EPOCH_PHASES, PHASES, PhaseBuilder, merge_metrics, reset_batch
from jaxrl_engine.core.protocols import Algorithm, Env
from jaxrl_engine.core.sharding import data_mesh, state_sharding
from jaxrl_engine.core.state import (
    Counters,
    EngineState,
    EnvCarry,
    EpisodeStats,
    Metrics,
    Phase,
    check_hparams,
    check_hparams_shapes,
    hparams_arrays,
    hparams_like,
    strong_types,
)
from jaxrl_engine.core.timing import Timer, timed
from jaxrl_engine.core.warm_up import (
    check_env,
    check_env_methods,
    check_policy,
    check_shapes,
    check_state_layout,
    compile_phase,
)

# The driver runs the epochs between two evaluations (or checkpoints) as one compiled call, as
# Brax's training loop does; at most this many, so progress and Ctrl-C stay responsive.
MAX_EPOCHS_PER_CALL = 64


def _check_phase_signature(name: str, fn: Any) -> None:
    """A phase of the user's is `state -> (state, metrics)`: one taking other arguments is
    refused at build, naming it (it would fail only when compiled)."""
    if not callable(fn):
        raise TypeError(
            f"phases[{name!r}] is {fn!r}: a phase is a function state -> (state, metrics)"
        )
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # (a builtin or C function: nothing to check)
        return
    try:
        signature.bind(None)
    except TypeError as e:
        raise TypeError(
            f"phases[{name!r}] ({getattr(fn, '__name__', type(fn).__name__)}) cannot be called "
            f"with the state alone: {e}; a phase is a function state -> (state, metrics)"
        ) from None


def _checked(name: str, phase: Phase) -> Phase:
    """`phase` returning its state strongly typed (`strong_types`), checked when traced: the
    state keeps its structure, shapes and dtypes (the epoch's loop carries it) and every metric
    is a scalar (the driver logs one number per epoch); else a ValueError naming the phase."""

    @functools.wraps(phase)
    def wrapped(state: EngineState) -> tuple[EngineState, Metrics]:
        try:
            out = phase(state)
        except Exception as e:  # a compile error names only its program: name the phase
            e.add_note(f"raised in phase '{name}'")
            raise
        if not (isinstance(out, tuple) and len(out) == 2):
            raise ValueError(
                f"phase '{name}' returned {type(out).__name__}: a phase returns (state, metrics),"
                " metrics a dict of scalars"
            )
        if not isinstance(out[1], Mapping):
            raise ValueError(
                f"phase '{name}' returned (state, {type(out[1]).__name__}): its metrics are a "
                "dict of scalars ({'train/loss': loss}; {} for none)"
            )
        new, metrics = out[0], out[1]
        new = strong_types(_numbers_as_given(state, new))
        _check_same_state(name, strong_types(state), new)
        for key, value in metrics.items():
            if np.shape(value) != ():
                raise ValueError(
                    f"phase '{name}': metric {key!r} has shape {np.shape(value)}: metrics are "
                    "scalars, one number per epoch (reduce it, or log each part under its own key)"
                )
        return new, metrics

    # Named after its phase, not the hook's inner function: compile logs, profiles and cache
    # entries say jit(evaluate), not jit(wrapped).
    wrapped.__name__ = wrapped.__qualname__ = name
    return wrapped


def _numbers_as_given(given: EngineState, returned: Any) -> Any:
    """`returned` with each plain Python number made an array of the given leaf's dtype (a
    hook's `state.hparams.replace(lr=1e-4)`, as `engine.with_hparams` takes it), where that
    loses nothing: a float only into a float leaf, an int or bool into any number."""
    if jax.tree.structure(returned) != jax.tree.structure(given):  # type: ignore[operator]
        return returned  # (refused by _check_same_state, naming the phase)

    def cast(a: Any, b: Any) -> Any:
        dtype = getattr(a, "dtype", None)
        if dtype is None or np.ndim(a) != 0 or not jnp.issubdtype(dtype, jnp.number):
            return b
        fits = isinstance(b, bool | int) or (
            isinstance(b, float) and jnp.issubdtype(dtype, jnp.floating)
        )
        return jnp.asarray(b, dtype) if fits else b

    return jax.tree.map(cast, given, returned)


def _check_same_state(name: str, given: EngineState, returned: Any) -> None:
    if jax.tree.structure(returned) != jax.tree.structure(given):  # type: ignore[operator]
        raise ValueError(
            f"phase '{name}' returned a state of another structure than it was given "
            f"({type(returned).__name__}): a phase returns the state with its structure, shapes "
            "and dtypes (state.replace(...))"
        )
    for (path, a), b in zip(
        jax.tree_util.tree_leaves_with_path(given), jax.tree.leaves(returned), strict=True
    ):
        if np.shape(a) != np.shape(b) or _dtype(a) != _dtype(b):
            raise ValueError(
                f"phase '{name}' returned state{jax.tree_util.keystr(path)} as "
                f"{_dtype(b)}{list(np.shape(b))}, but was given {_dtype(a)}{list(np.shape(a))}: "
                "a phase keeps the state's shapes and dtypes (the epoch's loop carries it)"
            )


def _dtype(x: Any) -> str:
    return str(getattr(x, "dtype", None) or np.result_type(x))


def check_not_donated(where: str, args: Any) -> None:
    """A clear error for a state used after it was donated (instead of XLA's "Array has been
    deleted" or "Buffer has been deleted or donated")."""

    def deleted(x: Any) -> bool:
        try:
            return bool(x.is_deleted())
        except Exception:  # not an array, or a tracer (inside a user's jit)
            return False

    if any(deleted(x) for x in jax.tree.leaves(args)):
        raise ValueError(
            f"{where}: the state passed was donated to an earlier call (engine.epoch, "
            "engine.epochs and engine.run consume the state they are given) and no longer "
            "exists: use the state that call returned, or a fresh engine.init(key)"
        )


class Program:
    """One of the engine's jitted functions (`engine.epoch`, `engine.rollout`, ...): it runs
    `warm_up`'s executable for it once there is one, so that calling it after `warm_up`
    compiles nothing, and the jit otherwise (before `warm_up`, or for arguments the executable
    was not compiled for: another shape, placement or a traced call). `lower` and the rest are
    the jit's."""

    def __init__(self, name: str, jitted: Any, executables: Mapping[str, Any]):
        self.name, self.jitted, self._executables = name, jitted, executables
        functools.update_wrapper(self, jitted)

    def __call__(self, *args: Any) -> Any:
        check_jax_settings()  # (one turned on since the build, in a notebook)
        if self.name == "epochs" and len(args) == 2:
            _check_epoch_count(args[1])
        executable = self._executables.get(self.name)
        if executable is not None:
            try:
                if self.name == "epochs":  # compiled for an int32[] epoch count
                    return executable(args[0], *(_epoch_count(a) for a in args[1:]))
                return executable(*args)
            except (TypeError, ValueError):
                # Arguments it was not compiled for: refused before anything ran (nothing
                # donated); the jit compiles for them, or raises the error itself.
                check_not_donated(f"engine.{self.name}", args)
            except RuntimeError:
                check_not_donated(f"engine.{self.name}", args)
                raise
        try:
            return self.jitted(*args)
        except (RuntimeError, ValueError):
            check_not_donated(f"engine.{self.name}", args)
            raise

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.jitted, attr)


class OneEpoch:
    """`engine.epoch(state) -> (state, metrics)`: one epoch, run by the `epochs` program with
    n = 1 (its metrics: the table's first row). One executable serves `epoch`, `epochs` and the
    driver, so stepping `epoch` and then calling `run` compiles the fused epoch once. `lower`
    and the rest are the `epochs` jit's (which takes the epoch count too)."""

    name = "epoch"

    def __init__(self, epochs: Program):
        self._epochs = epochs

    def __call__(self, state: EngineState) -> tuple[EngineState, Metrics]:
        state, table, _ = self._epochs(state, _epoch_count(1))
        return state, _first_row(table)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._epochs, attr)


@jax.jit
def _first_row(table: Metrics) -> Metrics:
    return jax.tree.map(lambda x: x[0], table)


# What `warm_up` compiles and `call` runs, by name ("epoch" is the "epochs" program).
PROGRAMS = (*PHASES, "epoch", "epochs", "learn")


def _program_name(name: str) -> str:
    """The compiled program behind `name`: "epoch" runs "epochs" (`OneEpoch`)."""
    return "epochs" if name == "epoch" else name


def _check_epoch_count(n: Any) -> None:
    """`engine.epochs(state, n)`: n a whole number >= 0 (a traced one is the caller's)."""
    if isinstance(n, jax.core.Tracer):
        return
    if isinstance(n, bool) or not jnp.issubdtype(jnp.result_type(n), jnp.integer) or np.ndim(n):
        raise TypeError(f"engine.epochs(state, n): n={n!r} is not a whole number of epochs")
    if int(n) < 0:
        raise ValueError(f"engine.epochs(state, n): n={int(n)} epochs; give 0 or more")


def _epoch_count(n: Any) -> Any:
    """`n` as the int32[] the `epochs` program takes: an explicit transfer (one that
    `jax.transfer_guard("disallow")` lets through), or `n` itself when it is an array."""
    return n.astype(jnp.int32) if isinstance(n, jax.Array) else jax.device_put(np.int32(n))


def _check_key(key: Any, where: str, traced: bool = False) -> None:
    """A PRNG key (`jax.random.key(seed)`, or a raw uint32[2] one), else a TypeError; a
    traced one is checked by its shape and dtype with `traced` (else let through)."""
    if isinstance(key, jax.core.Tracer) and not traced:
        return
    typed = isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    raw = isinstance(key, jax.Array | np.ndarray) and key.shape == (2,) and key.dtype == np.uint32
    if not (typed or raw):
        what = (
            f"{key.dtype}{list(key.shape)}"
            if isinstance(key, jax.Array | np.ndarray)
            else f"{type(key).__name__} {np.shape(key)}"
        )
        raise TypeError(f"{where}: key is {what}; give a PRNG key: jax.random.key(seed)")


class Driver(Protocol):
    """What `Engine.run` hands itself to (`jaxrl_engine.run.Driver` is the one shipped):
    `driver.run(engine, state, **kwargs)`."""

    def run(self, *args: Any, **kwargs: Any) -> Any: ...


class JaxSettingError(ValueError):
    """A process-wide JAX setting the engine cannot train under (raised at `build`)."""


# (setting, why the engine cannot train under it, what to do instead)
UNSUPPORTED_JAX_SETTINGS = (
    (
        "jax_enable_x64",
        "the engine trains in float32 and int32, and its phases do not compile with 64-bit "
        "defaults (observations, rewards and hyperparameters become float64)",
        "turn it off: jax.config.update('jax_enable_x64', False) (or unset JAX_ENABLE_X64)",
    ),
    (
        "jax_disable_jit",
        "the engine compiles its phases ahead of time (warm_up, the epoch loop) and cannot "
        "run them op by op",
        "turn it off; to look inside a phase use jax.debug.print, or `profile: true` for each "
        "phase's time",
    ),
    (
        "jax_debug_nans",
        "the engine marks values not measured yet with NaN (episode statistics before the "
        "first episode ends, the metrics of epochs `every` skips)",
        "turn it off: `nan_guard: true` (the default) stops at the first non-finite loss, "
        "gradient, param or observation and names its phase, quantity and epoch",
    ),
)


def check_jax_settings() -> None:
    """`JaxSettingError` naming a process-wide JAX setting the engine cannot train under."""
    for name, why, instead in UNSUPPORTED_JAX_SETTINGS:
        if getattr(jax.config, name):
            raise JaxSettingError(f"{name} is on: {why}; {instead}")


def _warn_long_evaluation(engine: Engine) -> None:
    """Warn when an evaluation steps the env far more than training does between two (e.g.
    `eval.episodes` in the millions): it is one compiled call, which a first SIGINT waits for."""
    max_steps = engine.spec.max_episode_steps
    rounds = -(-engine.eval_episodes // engine.eval_envs)
    eval_steps = rounds * engine.eval_envs * max_steps
    between = engine.steps_per_epoch * min(engine.eval_interval, engine.num_epochs)
    if eval_steps > max(10 * between, 10_000_000):
        plural = "s" if rounds != 1 else ""
        warnings.warn(
            f"each evaluation steps the env up to {eval_steps:,} times ({rounds:,} round{plural} "
            f"of {engine.eval_envs} envs x up to {max_steps} steps) against {between:,} training "
            "env steps between evaluations; it is one compiled call (a first SIGINT waits for "
            "it): lower eval.episodes, or the episode limit (the env's max_episode_steps, "
            f"{max_steps:,}: a JAX env's evaluation steps every episode to it, ended or not)",
            stacklevel=3,
        )


def is_engine_adapter(env: Any) -> bool:
    """`env` is one of the engine's own adapters (its class, not a user's subclass or wrapper
    of it: a wrapper's `__getattr__` forwards the inner env's attributes)."""
    cls = type(env)
    return cls.__module__.startswith("jaxrl_engine.") and bool(getattr(cls, "engine_adapter", 0))


class Engine:
    """A built engine. `init(key)` makes the state; the phases, `epoch` and `run` advance it.

    env, algorithm: the two protocols. num_envs: envs in rollout (sharded over the `data` mesh
    axis); num_steps: rollout steps per env per epoch; num_epochs: the run's length (the
    driver's default and `make_train`'s). eval_envs: evaluation envs; eval_episodes: episodes
    per evaluation (default eval_envs; more run in rounds); eval_deterministic: greedy actions
    in evaluation (else sampled); eval_interval:
    epochs between evaluations. phases: replacements for any of the five default phases
    (`state -> (state, metrics)`); hooks: per phase, user hooks (outermost). offload:
    RLightning's placement (`core.offload`); nan_guard: stop at the first non-finite value.
    driver: what `run` delegates to (the composition root passes `jaxrl_engine.run.Driver`).
    """

    def __init__(
        self,
        env: Env,
        algorithm: Algorithm,
        *,
        num_envs: int,
        num_steps: int,
        num_epochs: int,
        env_params: Any = None,
        eval_env_params: Any = None,
        eval_envs: int = 16,
        eval_interval: int = 10,
        eval_episodes: int | None = None,
        eval_deterministic: bool = True,
        mesh: Mesh | None = None,
        phases: Mapping[str, Phase] | None = None,
        hooks: Mapping[str, Sequence[Hook]] | None = None,
        offload: bool = False,
        nan_guard: bool = True,
        driver: Driver | None = None,
    ):
        check_jax_settings()
        check_env_methods(env, params=env_params is None)
        self.env, self.algo = env, algorithm
        self.env_params = env.params if env_params is None else env_params
        self.eval_env_params = self.env_params if eval_env_params is None else eval_env_params
        self.spec = env.spec(self.env_params)
        if not is_engine_adapter(env):  # (the engine's own are tested)
            check_env(env, self.env_params, self.spec, num_envs)
        self.num_envs, self.num_steps, self.num_epochs = num_envs, num_steps, num_epochs
        self.steps_per_epoch = num_steps * num_envs
        self.eval_envs, self.eval_interval = eval_envs, eval_interval
        self.eval_episodes = eval_envs if eval_episodes is None else eval_episodes
        self.eval_deterministic = eval_deterministic
        _warn_long_evaluation(self)
        self.offload, self.nan_guard, self.driver = offload, nan_guard, driver
        # What of this engine a config cannot say (checkpoints record it; a resume without
        # them warns): the phases replaced and the phases hooked by the user
        self.user_parts = {
            "phases": sorted(phases or {}),
            "hooks": sorted(k for k, v in (hooks or {}).items() if v)
            if isinstance(hooks, Mapping)
            else [],
        }
        self.mesh = mesh if mesh is not None else data_mesh()
        for key, n in (("num_envs", num_envs), ("eval_envs", eval_envs)):
            if n % self.mesh.size:
                raise ValueError(
                    f"{key}={n} must be a multiple of the {self.mesh.size} devices of the "
                    "'data' mesh axis"
                )
        self.timer = Timer()
        self.compile_report: dict[str, dict[str, float]] = {}
        self._compiled: dict[str, Any] = {}

        self.builder = PhaseBuilder(
            env,
            algorithm,
            self.env_params,
            self.eval_env_params,
            num_envs,
            num_steps,
            eval_envs,
            self.eval_episodes,
            eval_deterministic,
        )
        unknown = sorted(set(phases or {}) - set(PHASES))
        if unknown:
            raise ValueError(f"phases given for unknown phase(s) {unknown}; phases: {PHASES}")
        for name, fn in (phases or {}).items():
            _check_phase_signature(name, fn)
        self.raw_phases: dict[str, Phase] = {**self.builder.phases(), **(phases or {})}
        # Order (innermost first): nan_guard checks what the phase itself computes (its metrics,
        # observations, params); then the offload placement; then the user's hooks, whose own
        # metrics are theirs to check (e.g. `every` pads skipped epochs with NaN).
        self.phase_hooks: dict[str, list[Hook]] = {name: [] for name in PHASES}
        for name in PHASES:
            if nan_guard:
                guarded = GUARDED_STATE.get(name, ())
                self.phase_hooks[name].append(guard_hook(name, guarded))
            if offload:
                self.phase_hooks[name].extend(placement_hooks(name, self.mesh))
        if hooks is not None and not isinstance(hooks, Mapping):
            raise TypeError(
                f"hooks is a {type(hooks).__name__}: give a dict of phase name -> list of hooks "
                "({'train': [jre.every(2, my_hook)]})"
            )
        for name, user_hooks in (hooks or {}).items():
            if name not in PHASES:
                raise ValueError(f"hooks given for unknown phase {name!r}; phases: {PHASES}")
            if callable(user_hooks) or not isinstance(user_hooks, Sequence):
                raise TypeError(
                    f"hooks[{name!r}] is a {type(user_hooks).__name__}: give a list of hooks "
                    f"({{{name!r}: [hook]}})"
                )
            for i, hook in enumerate(user_hooks):
                if not callable(hook):
                    raise TypeError(
                        f"hooks[{name!r}][{i}] is {hook!r}: a hook is a function from a phase "
                        "to a phase"
                    )
            self.phase_hooks[name].extend(user_hooks)
        # Pure, hooked phases (callable inside a user's own jit) and their jitted versions.
        self.pure_phases: dict[str, Phase] = {
            name: _checked(name, chain(*self.phase_hooks[name])(self.raw_phases[name]))
            for name in PHASES
        }
        program = functools.partial(Program, executables=self._compiled)
        self.rollout = program("rollout", jax.jit(self.pure_phases["rollout"]))
        self.evaluate = program("evaluate", jax.jit(self.pure_phases["evaluate"]))
        self.update_dataset = program("update_dataset", jax.jit(self.pure_phases["update_dataset"]))
        self.train = program("train", jax.jit(self.pure_phases["train"]))
        self.sync_weights = program("sync_weights", jax.jit(self.pure_phases["sync_weights"]))
        # The epoch after its rollout, fused: what a learner runs while an actor collects the
        # next rollout (`run/overlap.py`).
        self.learn = program("learn", jax.jit(self.pure_learn))

        self.state_shape = jax.eval_shape(self._init, jax.random.key(0), self.hparams)
        host_paths = OFFLOADED_BETWEEN_EPOCHS if offload else ()
        self.state_sharding = state_sharding(self.state_shape, self.mesh, num_envs, host_paths)
        if any((hooks or {}).get(name) for name in EPOCH_PHASES):
            # The user's hooks (`offload_after`, ...) may leave parts of the state in host
            # memory after the epoch: between epochs they live there (the epochs' loop carries
            # them so), as `offload: true`'s placement does.
            self.state_sharding = self._placed_as_the_epoch_leaves_it(self.state_sharding)
        kinds = {s.memory_kind for s in jax.tree.leaves(self.state_sharding)}
        self.host_between_epochs = "pinned_host" in kinds
        check_state_fits(self.state_shape, self.state_sharding)  # before anything is compiled
        if any(self.user_parts.values()):
            # The evaluation's metrics join the epoch's record: a name in both would replace
            # the epoch's value (only the user's hooks and phases can make one).
            evaluated = jax.eval_shape(self.pure_phases["evaluate"], self.state_shape)[1]
            epoch = jax.eval_shape(self.pure_epoch, self.state_shape)[1]
            clash = sorted(k for k in evaluated if k in epoch)
            guards = [k for k in clash if k.startswith("guard/")]
            if guards:
                raise ValueError(
                    f"the nan_guard {guards[0].removeprefix('guard/')!r} guards the evaluate "
                    "phase and a phase of the epoch, whose metrics join in one record: give "
                    "each guard its own name"
                )
            if clash:
                raise ValueError(
                    f"phase 'evaluate' returns metric {clash[0]!r}, which a phase of the epoch "
                    "also returns; the two join in one record, where the evaluation's would "
                    "replace the epoch's: give the evaluate phase's metrics their own prefix "
                    "('evaluate/...')"
                )
        # Donating an input that lives in pinned_host memory corrupts the output buffers on
        # jax 0.10 CPU (a "memory kind does not match" error on read), so with offload the epoch
        # donates nothing; the driver drops the old state, which frees it just the same.
        donate = () if self.host_between_epochs else 0
        # Several epochs per compiled call (the driver's; see `pure_epochs`), and one epoch,
        # the same program with n = 1 (`OneEpoch`).
        self.epochs_per_call = max(1, min(eval_interval, num_epochs, MAX_EPOCHS_PER_CALL))
        self.epochs = program(
            "epochs",
            jax.jit(
                self.pure_epochs,
                donate_argnums=donate,
                in_shardings=(self.state_sharding, None),
                out_shardings=(self.state_sharding, None, None),
            ),
        )
        self.epoch = OneEpoch(self.epochs)
        # Memory kinds are applied by device_put after init: XLA may hand two equal outputs
        # (train params and their acting copy) one buffer, which a host out_sharding rejects.
        self._init_jit = jax.jit(
            self._init, out_shardings=state_sharding(self.state_shape, self.mesh, num_envs)
        )

    def _placed_as_the_epoch_leaves_it(self, sharding: Any) -> Any:
        """`sharding` with the leaves that the hooked epoch returns in host memory there."""
        traced = jax.make_jaxpr(self.pure_epoch)(self.state_shape)
        leaves, treedef = jax.tree.flatten(sharding)
        host = NamedSharding(self.mesh, PartitionSpec(), memory_kind="pinned_host")
        out = traced.out_avals[: len(leaves)]  # (the state's leaves, then the metrics')
        placed = [
            host if getattr(a, "memory_space", None) == jax.memory.Space.Host else s
            for s, a in zip(leaves, out, strict=True)
        ]
        return jax.tree.unflatten(treedef, placed)

    # ----------------------------------------------------------------- state
    @property
    def hparams(self) -> Any:
        """The algorithm's default numeric hyperparameters (`init`'s default). A Python int
        among them (`gamma=1`) is a float hyperparameter, as a Python number given to `init`
        for a float one is: an integer hyperparameter is declared `jnp.int32(...)` (else its
        leaf would be int32 and cast every value given later, 0.99 to 0)."""
        return jax.tree.map(lambda x: float(x) if type(x) is int else x, self.algo.hparams)

    def _init(self, key: jax.Array, hparams: Any) -> EngineState:
        algo, hparams = self.algo, hparams_arrays(hparams)
        k_algo, k_env, k_run = jax.random.split(key, 3)
        train_state = one_key_at_a_time(algo.init)(k_algo, hparams)
        acting = algo.acting_params(train_state, hparams)
        obs, env_state = reset_batch(self.env, k_env, self.env_params, self.num_envs)
        explore = None
        if algo.explore is not None:
            explore = algo.explore.init(jax.random.fold_in(k_env, 1), self.num_envs)
        done = jnp.zeros((self.num_envs,), bool)
        env = EnvCarry(state=env_state, obs=obs, done=done, explore=explore)
        stats = EpisodeStats.zeros(self.num_envs)
        # The policy's actions fit the env before the rollout gives them to it.
        check_policy(acting, obs, self.spec, algo)
        trajectory = jax.eval_shape(lambda: self.builder.collect(acting, env, stats, k_run)[2])
        buffer = algo.init_buffer(jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), trajectory))
        batch_shape = jax.eval_shape(
            lambda: algo.update_dataset(train_state, buffer, k_run, hparams)[1]
        )
        batch = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), batch_shape)
        return strong_types(
            EngineState(
                train=train_state,
                eval_params=acting,
                eval_version=jnp.zeros((), jnp.int32),
                env=env,
                buffer=buffer,
                batch=batch,
                rng=k_run,
                counters=Counters.zeros(),
                stats=stats,
                hparams=hparams,
            )
        )

    def init_pure(self, key: jax.Array, hparams: Any = None) -> EngineState:
        """`init` as a traceable function, with the between-epochs placement (offload) applied.
        The key and hparams are checked as traced values too (one run's: a key and scalars)."""
        _check_key(key, "train(key, hparams)", traced=True)
        if hparams is not None:
            check_hparams(hparams, self.hparams, "train(key, hparams)", scalars=True, traced=True)
        state = self._init(
            key, hparams_like(self.hparams if hparams is None else hparams, self.hparams)
        )
        if self.host_between_epochs:
            state = jax.tree.map(
                lambda x, s: jax.device_put(x, s) if s.memory_kind == "pinned_host" else x,
                state,
                self.state_sharding,
            )
        return state

    def init(self, key: jax.Array, hparams: Any = None) -> EngineState:
        """A fresh state for `key` (and `hparams`, default the algorithm's), placed on the mesh
        (env batch sharded, params replicated)."""
        check_jax_settings()
        _check_key(key, "engine.init")
        if hparams is not None:
            check_hparams(hparams, self.hparams, "engine.init", scalars=True)
        # Python numbers become f32 here, before the jit sees them (the default's too: one
        # compiled init for the default and for a user's hyperparameters)
        hparams = hparams_like(self.hparams if hparams is None else hparams, self.hparams)
        state = self._init_jit(key, hparams)
        return jax.device_put(state, self.state_sharding) if self.host_between_epochs else state

    def with_hparams(self, state: EngineState, hparams: Any) -> EngineState:
        """`state` carrying `hparams` (placed like the state's): what the phases train with
        from here on."""
        check_hparams(hparams, self.hparams, "engine.with_hparams")
        check_hparams_shapes(hparams, state.hparams, "engine.with_hparams")
        placed = jax.device_put(hparams_like(hparams, self.hparams), self.state_sharding.hparams)
        return state.replace(hparams=placed)

    # ---------------------------------------------------------------- epochs
    def pure_epoch(self, state: EngineState) -> tuple[EngineState, Metrics]:
        """rollout -> update_dataset -> train -> sync_weights, hooks applied (pure)."""
        metrics: Metrics = {}
        for name in EPOCH_PHASES:
            state, m = self.pure_phases[name](state)
            merge_metrics(metrics, m, name)
        return state, metrics

    def pure_learn(self, state: EngineState) -> tuple[EngineState, Metrics]:
        """update_dataset -> train -> sync_weights on the rollout in `state.buffer` (pure)."""
        metrics: Metrics = {}
        for name in EPOCH_PHASES[1:]:
            state, m = self.pure_phases[name](state)
            merge_metrics(metrics, m, name)
        return state, metrics

    def pure_epochs(
        self, state: EngineState, n: jax.Array
    ) -> tuple[EngineState, Metrics, jax.Array]:
        """Up to `n` (traced, <= `epochs_per_call`) epochs in one loop: (state, metrics, done).

        metrics: each epoch's metrics in a row of `[epochs_per_call, ...]` arrays (rows from
        `done` on are zeros). The loop stops early after an epoch whose `nan_guard` fired, so
        the state is the one after the failing epoch, as with one call per epoch. One compiled
        function serves every `n`: the driver's chunks (up to the next evaluation, checkpoint
        or the end) never recompile.
        """
        rows = self.epochs_per_call
        shapes = jax.eval_shape(self.pure_epoch, state)[1]
        table = {k: jnp.zeros((rows, *v.shape), v.dtype) for k, v in shapes.items()}
        guards = [k for k in shapes if k.startswith("guard/")]

        def keep_going(carry):
            i, _, _, fired = carry
            return (i < jnp.minimum(n, rows)) & ~fired

        def one_epoch(carry):
            i, state, table, _ = carry
            state, metrics = self.pure_epoch(state)
            table = {k: table[k].at[i].set(metrics[k]) for k in table}
            fired = jnp.any(jnp.stack([metrics[k] >= 0 for k in guards])) if guards else False
            return i + 1, state, table, jnp.asarray(fired)

        done, state, table, _ = jax.lax.while_loop(
            keep_going, one_epoch, (jnp.int32(0), state, table, jnp.bool_(False))
        )
        return state, table, done

    # ------------------------------------------------------------- compiled
    @functools.cached_property
    def guarded_names(self) -> Mapping[str, list[str]]:
        """Per guard name, the quantities behind its `guard/<name>` index (see `nan_guard`): the
        engine's guards and any in the user's hooks; phases are traced for them only when a
        guard has fired (`GuardNames`)."""
        return GuardNames(
            GUARD_ORDER, lambda name: jax.eval_shape(self.pure_phases[name], self.state_shape)
        )

    def warm_up(
        self,
        state: EngineState,
        phases: Sequence[str] | None = None,
        on_compile: Callable[[str, int, int], None] | None = None,
    ) -> EngineState:
        """AOT-compile every phase and the epoch along the real data flow; check shapes.

        phases: what to compile (default: the five phases and "epochs"; "learn" on request;
        "epoch" is the "epochs" program, see `OneEpoch`); the driver asks only for what it
        will run. on_compile(name, i, n): called before the i-th of n compilations (the
        driver's "compiling ..." status). Records compile seconds and XLA's cost/memory
        analysis in `self.compile_report`. The state is returned untouched (nothing runs,
        nothing to reseed).
        """
        check_jax_settings()
        if isinstance(phases, str):
            phases = [phases]  # (not its letters)
        unknown = sorted({str(n) for n in phases or ()} - set(PROGRAMS))
        if unknown:
            raise ValueError(f"engine.warm_up: unknown phase(s) {unknown}; valid: {list(PROGRAMS)}")
        wanted = {_program_name(n) for n in phases} if phases is not None else {*PHASES, "epochs"}
        check_shapes(state, self.spec, self.algo)
        check_state_layout(state, self.state_shape, "engine.warm_up")
        boundary = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state
        )
        chained = [name for name in EPOCH_PHASES if name in wanted]
        along = EPOCH_PHASES[: EPOCH_PHASES.index(chained[-1]) + 1] if chained else ()
        others = [n for n in ("evaluate", "learn", "epochs") if n in wanted]
        plan = [*along, *others]
        current = boundary
        for i, name in enumerate(plan, 1):
            if on_compile is not None:
                on_compile(name, i, len(plan))
            if name in along:  # along the data flow, up to the last phase asked for
                compiled = self._compile(name, getattr(self, name), current)
                try:
                    current = compiled.out_info[0]
                except AssertionError:
                    # A phase with ordered effects (a host env's callbacks): jax does not give
                    # its output layouts; its outputs have the state's shapes and placement.
                    current = boundary
            else:  # evaluate and learn (after a rollout: the same shapes) from the state;
                # epochs from the state and its epoch count
                extra = (jax.ShapeDtypeStruct((), jnp.int32),) if name == "epochs" else ()
                self._compile(name, getattr(self, name), boundary, *extra)
        return state

    def _compile(self, name: str, fn: Any, *args: Any) -> Any:
        compiled, self.compile_report[name] = compile_phase(name, fn, *args)
        self._compiled[name] = compiled
        return compiled

    def compiled(self, name: str) -> bool:
        """Whether `warm_up` has compiled `name` (a phase, "epochs" or "learn"; "epoch" is
        "epochs")."""
        return _program_name(name) in self._compiled

    @property
    def compile_seconds(self) -> float:
        """Seconds this engine spent compiling (lowering included) in `warm_up`: the sum of
        `compile_report`'s `compile_s` (the latest compilation of each name). What jit
        compiles on a first call without `warm_up` is not counted."""
        return sum(r["compile_s"] for r in self.compile_report.values())

    def call(self, name: str, state: EngineState, *args: Any) -> Any:
        """Run one compiled phase, 'epoch' or 'epochs' (`call("epochs", state, n)`); uses
        warm_up's executable when there is one."""
        if name == "epoch":
            return self.epoch(state, *args)
        if name not in PROGRAMS:
            raise ValueError(f"engine.call: unknown phase {name!r}; valid: {list(PROGRAMS)}")
        fn = self._compiled.get(name) or getattr(self, name).jitted
        if name == "epochs":
            args = tuple(_epoch_count(a) for a in args)
        return fn(state, *args)

    def timed_call(self, name: str, state: EngineState, *args: Any) -> Any:
        """`call(name, state, *args)`, its seconds (after `block_until_ready`) booked in
        `self.timer` under `name`."""
        return timed(name, self.timer)(lambda s: self.call(name, s, *args))(state)

    def timing_summary(self, echo: bool = True) -> str | None:
        """RLightning's `print_timing_summary`: count, total and average per phase, printed
        (echo=True; nothing returned, so a notebook shows it once) or returned (echo=False)."""
        table = self.timer.table()
        if not echo:
            return table
        print(table)
        return None

    def run(self, state: EngineState, **kwargs: Any) -> tuple[EngineState, dict[str, Any]]:
        """Train from `state` with this engine's driver: `state, summary = engine.run(state)`
        (`jaxrl_engine.run.Driver.run` documents the keywords)."""
        if self.driver is None:
            raise ValueError(
                "this Engine has no driver: build it with jre.build(cfg), or pass "
                "driver=jre.Driver(...) to Engine(...)"
            )
        check_not_donated("engine.run", state)
        state, summary = self.driver.run(self, state, **kwargs)
        return state, summary
