"""The engine: phases as pure jitted functions over one `EngineState`, hooks, epoch, warm-up.

RLightning's `BaseEngine` order, per epoch: rollout -> update_dataset -> train -> sync_weights,
with evaluate every `eval.interval` epochs. Each phase is `state -> (state, metrics)`.
"""

from __future__ import annotations

import functools
import math
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from jaxrl_engine.algos import make_algorithm
from jaxrl_engine.algos.base import Algorithm
from jaxrl_engine.algos.networks import one_key_at_a_time
from jaxrl_engine.buffers.rollout import Transition
from jaxrl_engine.core.hooks import (
    Hook,
    Timer,
    chain,
    guarded_quantities,
    move_to,
    nan_guard,
    offload_after,
    reload_before,
    timed,
)
from jaxrl_engine.core.state import (
    Counters,
    EngineState,
    EnvCarry,
    EpisodeStats,
    Metrics,
    Phase,
)
from jaxrl_engine.distributed.mesh import data_mesh, state_sharding
from jaxrl_engine.envs.gymnax_env import GymnaxEnv, make_env
from jaxrl_engine.io.compile_cache import enable_compile_cache
from jaxrl_engine.io.config import Config, ConfigError

PHASES = ("rollout", "evaluate", "update_dataset", "train", "sync_weights")
EPOCH_PHASES = ("rollout", "update_dataset", "train", "sync_weights")
EVAL_STREAM = 0x0E7A1  # fold_in constant: evaluation never advances the training key

# The driver runs the epochs between two evaluations (or checkpoints) as one compiled call, as
# Brax's training loop does; at most this many, so progress and Ctrl-C stay responsive.
MAX_EPOCHS_PER_CALL = 64

# RLightning's `enable_offload` placement. Gradients live only inside `train`'s scan here, so
# "params and grads offloaded after sync" is params (and optimizer state) after sync.
OFFLOAD_PLACEMENT: dict[str, dict[str, tuple[str, ...]]] = {
    "rollout": {"reload": ("eval_params",), "offload": ("eval_params",)},
    "evaluate": {"reload": ("eval_params",), "offload": ("eval_params",)},
    "update_dataset": {"reload": (), "offload": ()},
    "train": {"reload": ("train.params", "train.opt_state"), "offload": ("train.opt_state",)},
    "sync_weights": {"reload": (), "offload": ("train.params", "eval_params")},
}
OFFLOADED_BETWEEN_EPOCHS = ("eval_params", "train.params", "train.opt_state")

# What nan_guard checks besides each phase's metrics.
GUARDED_STATE = {"rollout": ("env.obs",), "train": ("train.params",)}
# NaN by meaning until the first episode ends (not an error).
MAY_BE_NAN = ("rollout/episode_return", "rollout/episode_length")


def episode_stats(
    stats: EpisodeStats, reward: jax.Array, done: jax.Array
) -> tuple[EpisodeStats, Metrics]:
    """Advance the running episode statistics over a rollout's `[T, N]` rewards and ends.

    Vectorised, no loop: per env, the returns of the episodes that ended in the rollout sum to
    the carried-in return plus the reward up to its last end (the sums between ends telescope);
    likewise their lengths. What follows the last end is carried out.
    """
    T = reward.shape[0]
    last = jnp.max(jnp.where(done, jnp.arange(T)[:, None], -1), axis=0)  # [N], -1: no end
    ended = last >= 0
    cumulative = jnp.cumsum(reward, axis=0)
    upto_last = jnp.take_along_axis(cumulative, jnp.maximum(last, 0)[None], axis=0)[0]
    count = done.sum(dtype=jnp.int32)
    total = jnp.where(ended, stats.current_return + upto_last, 0.0).sum()
    length_total = jnp.where(ended, stats.current_length + last + 1, 0).sum()
    finished = count > 0
    mean_return = jnp.where(finished, total / jnp.maximum(count, 1), stats.last_return)
    mean_length = jnp.where(
        finished, length_total / jnp.maximum(count, 1), stats.last_length
    ).astype(jnp.float32)
    new = EpisodeStats(
        current_return=jnp.where(
            ended, cumulative[-1] - upto_last, stats.current_return + cumulative[-1]
        ),
        current_length=jnp.where(ended, T - 1 - last, stats.current_length + T).astype(jnp.int32),
        last_return=mean_return,
        last_length=mean_length,
        episodes=stats.episodes + count,
    )
    return new, {
        "rollout/episode_return": mean_return,
        "rollout/episode_length": mean_length,
        "rollout/episodes": count,
        "rollout/reward_mean": reward.mean(),
    }


class ShapeMismatchError(ValueError):
    """Env and policy disagree on shapes; raised by `warm_up` before training."""


class Engine:
    """A built engine. `init(key)` makes the state; the phases, `epoch` and `run` advance it."""

    def __init__(
        self,
        cfg: Config,
        *,
        env: GymnaxEnv | None = None,
        algo: Algorithm | None = None,
        mesh: Mesh | None = None,
        hooks: dict[str, list[Hook]] | None = None,
    ):
        self.cfg = cfg
        if cfg.compile_cache_dir:
            enable_compile_cache(cfg.compile_cache_dir)
        self.env = env if env is not None else make_env(cfg.env.id, cfg.env.params)
        self.env_params = self.env.params
        self.eval_env_params = GymnaxEnv.with_params(self.env_params, cfg.eval.env_params)
        self.spec = self.env.spec(self.env_params)
        self.eval_steps = self.env.spec(self.eval_env_params).max_episode_steps
        self.num_envs = cfg.env.num_envs
        self.steps_per_epoch = cfg.algo.num_steps * self.num_envs
        self.num_epochs = math.ceil(cfg.total_env_steps / self.steps_per_epoch)
        self.algo = (
            algo
            if algo is not None
            else make_algorithm(cfg.algo, self.spec, self.num_envs, self.num_epochs)
        )
        self.mesh = mesh if mesh is not None else data_mesh()
        for key, n in (("env.num_envs", self.num_envs), ("eval.num_envs", cfg.eval.num_envs)):
            if n % self.mesh.size:
                raise ConfigError(
                    f"{key}={n} must be a multiple of the {self.mesh.size} devices of the "
                    "'data' mesh axis"
                )
        self.timer = Timer()
        self.compile_report: dict[str, dict[str, float]] = {}
        self.last_summary: dict[str, Any] = {}  # the driver's summary of the last `run`
        self._compiled: dict[str, Any] = {}

        raw: dict[str, Phase] = {
            "rollout": self._rollout,
            "evaluate": self._evaluate,
            "update_dataset": self._update_dataset,
            "train": self._train,
            "sync_weights": self._sync_weights,
        }
        self._raw_phases = raw
        # Order (innermost first): nan_guard checks what the phase itself computes (its metrics,
        # observations, params); then the offload placement; then the user's hooks, whose own
        # metrics are theirs to check (e.g. `every` pads skipped epochs with NaN).
        self.phase_hooks: dict[str, list[Hook]] = {name: [] for name in PHASES}
        if cfg.nan_guard:
            for name in PHASES:
                self.phase_hooks[name].append(
                    nan_guard(name, GUARDED_STATE.get(name, ()), skip=MAY_BE_NAN)
                )
        if cfg.offload:
            for name, place in OFFLOAD_PLACEMENT.items():
                if place["reload"]:
                    self.phase_hooks[name].append(reload_before(place["reload"], self.mesh))
                if place["offload"]:
                    self.phase_hooks[name].append(offload_after(place["offload"], self.mesh))
        for name, user_hooks in (hooks or {}).items():
            if name not in PHASES:
                raise ValueError(f"hooks given for unknown phase {name!r}; phases: {PHASES}")
            self.phase_hooks[name].extend(user_hooks)
        # Pure, hooked phases (callable inside a user's own jit) and their jitted versions.
        self.pure_phases: dict[str, Phase] = {
            name: chain(*self.phase_hooks[name])(raw[name]) for name in PHASES
        }
        self.rollout = jax.jit(self.pure_phases["rollout"])
        self.evaluate = jax.jit(self.pure_phases["evaluate"])
        self.update_dataset = jax.jit(self.pure_phases["update_dataset"])
        self.train = jax.jit(self.pure_phases["train"])
        self.sync_weights = jax.jit(self.pure_phases["sync_weights"])

        self.state_shape = jax.eval_shape(self._init, jax.random.key(0))
        host_paths = OFFLOADED_BETWEEN_EPOCHS if cfg.offload else ()
        self.state_sharding = state_sharding(self.state_shape, self.mesh, self.num_envs, host_paths)
        # Donating an input that lives in pinned_host memory corrupts the output buffers on
        # jax 0.10 CPU (a "memory kind does not match" error on read), so with offload the epoch
        # donates nothing; the driver drops the old state, which frees it just the same.
        self.epoch = jax.jit(
            self.pure_epoch,
            donate_argnums=() if cfg.offload else 0,
            in_shardings=(self.state_sharding,),
            out_shardings=(self.state_sharding, None),
        )
        # Several epochs per compiled call (the driver's default; see `pure_epochs`).
        self.epochs_per_call = max(1, min(cfg.eval.interval, self.num_epochs, MAX_EPOCHS_PER_CALL))
        self.epochs = jax.jit(
            self.pure_epochs,
            donate_argnums=() if cfg.offload else 0,
            in_shardings=(self.state_sharding, None),
            out_shardings=(self.state_sharding, None, None),
        )
        # Memory kinds are applied by device_put after init: XLA may hand two equal outputs
        # (train params and their acting copy) one buffer, which a host out_sharding rejects.
        self._init_jit = jax.jit(
            self._init, out_shardings=state_sharding(self.state_shape, self.mesh, self.num_envs)
        )

    # ----------------------------------------------------------------- state
    def _init(self, key: jax.Array) -> EngineState:
        k_algo, k_env, k_run = jax.random.split(key, 3)
        train_state = one_key_at_a_time(self.algo.init)(k_algo)
        acting = self.algo.acting_params(train_state)
        obs, env_state = jax.vmap(self.env.reset, (0, None))(
            jax.random.split(k_env, self.num_envs), self.env_params
        )
        env = EnvCarry(state=env_state, obs=obs, done=jnp.zeros((self.num_envs,), bool))
        stats = EpisodeStats.zeros(self.num_envs)
        trajectory = jax.eval_shape(lambda: self._collect(acting, env, stats, k_run)[2])
        buffer = self.algo.init_buffer(
            jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), trajectory)
        )
        batch_shape = jax.eval_shape(
            lambda: self.algo.update_dataset(train_state, buffer, k_run)[1]
        )
        batch = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), batch_shape)
        return EngineState(
            train=train_state,
            eval_params=acting,
            eval_version=jnp.zeros((), jnp.int32),
            env=env,
            buffer=buffer,
            batch=batch,
            rng=k_run,
            counters=Counters.zeros(),
            stats=stats,
        )

    def init_pure(self, key: jax.Array) -> EngineState:
        """`init` as a traceable function, with the between-epochs placement (offload) applied."""
        state = self._init(key)
        if self.cfg.offload:
            state = move_to(OFFLOADED_BETWEEN_EPOCHS, self.mesh, "pinned_host")(state)
        return state

    def init(self, key: jax.Array) -> EngineState:
        """A fresh state for `key`, placed on the mesh (env batch sharded, params replicated)."""
        state = self._init_jit(key)
        return jax.device_put(state, self.state_sharding) if self.cfg.offload else state

    # ---------------------------------------------------------------- phases
    def _collect(self, params: Any, env: EnvCarry, stats: EpisodeStats, key: jax.Array):
        """`num_steps` of (policy step, env step), vmapped over envs.

        Returns (env, stats, trajectory, metrics). The scan carries only the env state and the
        observation: on CPU each operation in the loop body costs a dispatch per step, so the
        episode statistics are computed after it, vectorised over the trajectory.
        """
        step_env = jax.vmap(self.env.step, (0, 0, 0, None))

        def step(carry, key: jax.Array):
            env_state, last_obs = carry
            k_act, k_env = jax.random.split(key)
            action, extras = self.algo.act(params, last_obs, k_act, False)
            obs, env_state, reward, terminated, truncated, info = step_env(
                jax.random.split(k_env, self.num_envs),
                env_state,
                self.spec.action.clip(action),
                self.env_params,
            )
            transition = Transition(
                obs=last_obs,
                action=action,
                reward=reward.astype(jnp.float32),
                terminated=terminated,
                truncated=truncated,
                next_obs=info["final_observation"],
                extras=extras,
            )
            return (env_state, obs), transition

        keys = jax.random.split(key, self.cfg.algo.num_steps)
        (env_state, obs), trajectory = jax.lax.scan(step, (env.state, env.obs), keys)
        done = trajectory.terminated | trajectory.truncated  # [T, N]
        stats, metrics = episode_stats(stats, trajectory.reward, done)
        env = EnvCarry(env_state, obs, done[-1])
        return env, stats, self.algo.complete_trajectory(params, trajectory), metrics

    def _rollout(self, state: EngineState) -> tuple[EngineState, Metrics]:
        rng, key = jax.random.split(state.rng)
        env, stats, traj, metrics = self._collect(state.eval_params, state.env, state.stats, key)
        state = state.replace(
            env=env,
            buffer=self.algo.add_to_buffer(state.buffer, traj),
            rng=rng,
            stats=stats,
            counters=state.counters.replace(
                env_steps=state.counters.env_steps + self.steps_per_epoch
            ),
        )
        return state, metrics

    def _evaluate(self, state: EngineState) -> tuple[EngineState, Metrics]:
        """Deterministic actions on fresh eval envs (own env params); state is not advanced."""
        n = self.cfg.eval.num_envs
        key = jax.random.fold_in(state.rng, EVAL_STREAM)
        k_reset, k_steps = jax.random.split(key)
        obs, env_state = jax.vmap(self.env.reset, (0, None))(
            jax.random.split(k_reset, n), self.eval_env_params
        )
        step_env = jax.vmap(self.env.step, (0, 0, 0, None))

        def step(carry, key):
            env_state, obs, ret, length, active = carry
            action, _ = self.algo.act(state.eval_params, obs, key, True)
            obs, env_state, reward, terminated, truncated, _ = step_env(
                jax.random.split(key, n),
                env_state,
                self.spec.action.clip(action),
                self.eval_env_params,
            )
            ret = ret + jnp.where(active, reward, 0.0)
            length = length + active
            active = active & ~(terminated | truncated)
            return (env_state, obs, ret, length, active), None

        init = (env_state, obs, jnp.zeros((n,)), jnp.zeros((n,), jnp.int32), jnp.ones((n,), bool))
        (_, _, ret, length, _), _ = jax.lax.scan(
            step, init, jax.random.split(k_steps, self.eval_steps)
        )
        return state, {
            "evaluate/episode_return": ret.mean(),
            "evaluate/episode_return_std": ret.std(),
            "evaluate/episode_length": length.mean().astype(jnp.float32),
        }

    def _update_dataset(self, state: EngineState) -> tuple[EngineState, Metrics]:
        rng, key = jax.random.split(state.rng)
        train_state, batch, metrics = self.algo.update_dataset(state.train, state.buffer, key)
        return state.replace(train=train_state, batch=batch, rng=rng), metrics

    def _train(self, state: EngineState) -> tuple[EngineState, Metrics]:
        rng, key = jax.random.split(state.rng)
        train_state, metrics = self.algo.train(state.train, state.buffer, state.batch, key)
        counters = state.counters.replace(
            grad_steps=state.counters.grad_steps + self.algo.grad_steps_per_epoch()
        )
        return state.replace(train=train_state, rng=rng, counters=counters), metrics

    def _sync_weights(self, state: EngineState) -> tuple[EngineState, Metrics]:
        """Train params -> acting params; closes the epoch (`counters.epoch += 1`)."""
        state = state.replace(
            eval_params=self.algo.acting_params(state.train),
            eval_version=state.eval_version + 1,
            counters=state.counters.replace(epoch=state.counters.epoch + 1),
        )
        return state, {"sync_weights/version": state.eval_version}

    def pure_epoch(self, state: EngineState) -> tuple[EngineState, Metrics]:
        """rollout -> update_dataset -> train -> sync_weights, hooks applied (pure)."""
        metrics: Metrics = {}
        for name in EPOCH_PHASES:
            state, m = self.pure_phases[name](state)
            metrics.update(m)
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
    def guarded_names(self) -> dict[str, list[str]]:
        """Per phase, the quantities behind its `guard/<phase>` index (see `nan_guard`)."""
        if not self.cfg.nan_guard:
            return {}
        return {
            name: guarded_quantities(
                list(jax.eval_shape(phase, self.state_shape)[1]),
                GUARDED_STATE.get(name, ()),
                skip=MAY_BE_NAN,
            )
            for name, phase in self._raw_phases.items()
        }

    def warm_up(self, state: EngineState, phases: Sequence[str] | None = None) -> EngineState:
        """AOT-compile every phase and the epoch along the real data flow; check shapes.

        phases: what to compile (default: the five phases, "epoch" and "epochs"); the driver asks
        only for what it will run. Records compile seconds and XLA's cost/memory analysis in
        `self.compile_report`. The state is returned untouched (nothing runs, nothing to reseed).
        """
        wanted = set(phases) if phases is not None else {*PHASES, "epoch", "epochs"}
        self.check_shapes(state)
        boundary = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state
        )
        current = boundary
        if wanted & set(EPOCH_PHASES):
            for name in EPOCH_PHASES:
                current = self._compile(name, getattr(self, name), current).out_info[0]
        for name, fn in (("evaluate", self.evaluate), ("epoch", self.epoch)):
            if name in wanted:
                self._compile(name, fn, boundary)
        if "epochs" in wanted:
            self._compile("epochs", self.epochs, boundary, jax.ShapeDtypeStruct((), jnp.int32))
        return state

    def _compile(self, name: str, fn: Any, *args: Any) -> Any:
        start = time.perf_counter()
        try:
            compiled = fn.lower(*args).compile()
        except Exception as e:
            raise ShapeMismatchError(f"warm_up: phase '{name}' failed to compile: {e}") from e
        cost = compiled.cost_analysis() or {}
        memory = compiled.memory_analysis()
        self.compile_report[name] = {
            "compile_s": time.perf_counter() - start,
            "flops": float(cost.get("flops", 0.0)),
            "bytes_accessed": float(cost.get("bytes accessed", 0.0)),
            "temp_bytes": float(getattr(memory, "temp_size_in_bytes", 0)),
            "argument_bytes": float(getattr(memory, "argument_size_in_bytes", 0)),
            "output_bytes": float(getattr(memory, "output_size_in_bytes", 0)),
        }
        self._compiled[name] = compiled
        return compiled

    @property
    def compile_seconds(self) -> float:
        return sum(r["compile_s"] for r in self.compile_report.values())

    def check_shapes(self, state: EngineState) -> None:
        """Env and policy shapes agree, or `ShapeMismatchError` naming phase and both shapes."""
        env_obs = tuple(state.env.obs.shape[1:])
        if env_obs != self.spec.obs_shape:
            raise ShapeMismatchError(
                f"phase 'rollout': the env's observations have shape {env_obs} but its "
                f"observation space (what the policy was built for) says {self.spec.obs_shape}"
            )
        obs = jax.ShapeDtypeStruct(state.env.obs.shape, state.env.obs.dtype)
        # Shapes only: offloaded (pinned_host) params would fail eval_shape on memory spaces.
        params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state.eval_params)
        try:
            action = jax.eval_shape(
                lambda p, o: self.algo.act(p, o, jax.random.key(0), False)[0],
                params,
                obs,
            )
        except Exception as e:
            raise ShapeMismatchError(
                f"phase 'rollout': the policy cannot act on env observations of shape "
                f"{env_obs} (policy params were built for another shape): {e}"
            ) from e
        want = (state.env.obs.shape[0], *self.spec.action.shape)
        if tuple(action.shape) != want:
            raise ShapeMismatchError(
                f"phase 'rollout': the policy returns actions of shape {tuple(action.shape)} "
                f"but the env takes {want} (num_envs, *action_shape)"
            )

    def call(self, name: str, state: EngineState, *args: Any) -> Any:
        """Run one compiled phase, 'epoch' or 'epochs' (`call("epochs", state, n)`); uses
        warm_up's executable when there is one."""
        fn = self._compiled.get(name) or getattr(self, name)
        if name == "epochs":
            args = tuple(jnp.asarray(a, jnp.int32) for a in args)
        return fn(state, *args)

    def timed_call(self, name: str, state: EngineState, *args: Any) -> Any:
        return timed(name, self.timer)(lambda s: self.call(name, s, *args))(state)

    def timing_summary(self, echo: bool = True) -> str:
        """RLightning's `print_timing_summary`: count, total and average per phase."""
        table = self.timer.table()
        if echo:
            print(table)
        return table

    def run(self, state: EngineState, **kwargs: Any) -> tuple[EngineState, list[dict[str, float]]]:
        """The driver: epochs, evaluation, logging, progress; see `jaxrl_engine.core.driver`."""
        from jaxrl_engine.core.driver import run

        state, history = run(self, state, **kwargs)
        self.save_policy(state)
        return state, history

    def save_policy(self, state: EngineState) -> None:
        """Export the acting params to `<run dir>/policy/` (`jaxrl_engine.export`): what
        `jaxrl-engine eval` and `export` read. A policy jax.export cannot serialize (one acting
        through a host callback) is reported with a warning, not an error: training is done."""
        from jaxrl_engine.export import POLICY_DIR, ExportError, export_policy

        try:
            export_policy(self, state.eval_params, Path(self.last_summary["run_dir"]) / POLICY_DIR)
        except ExportError as e:
            warnings.warn(f"policy not exported: {e}", stacklevel=2)


def build(cfg: Config, **kwargs: Any) -> Engine:
    """`Engine` for a config; keyword arguments inject env, algo, mesh or hooks."""
    return Engine(cfg, **kwargs)
