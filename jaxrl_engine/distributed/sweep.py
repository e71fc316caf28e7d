"""Sweeps: seeds x a grid of config values as one more vmapped axis, sharded over `sweep`.

`plan_sweep(cfg, seeds, grid)` expands the grid (setting-major, seed-minor) into `Member`s,
each with its own resolved config, and splits them into static groups: members whose configs
differ only in the seed and in traced keys (their algorithm's `traced_keys`, the `HParams`
leaves) share one compiled program. Any other key in the grid is static (it changes shapes or
the program): refused naming it, unless `split_static`, which gives one program per distinct
static setting. `SweepPrograms` are one group's engine functions (init, the multi-epoch chunk,
evaluate) vmapped over the member axis and placed on the (`sweep`, `data`) mesh.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_engine.core.engine import Engine
from jaxrl_engine.core.memory import check_state_fits
from jaxrl_engine.core.sharding import state_sharding
from jaxrl_engine.core.state import EngineState, hparams_arrays
from jaxrl_engine.core.warm_up import compile_phase
from jaxrl_engine.distributed.mesh import SWEEP
from jaxrl_engine.io.config import (
    Config,
    ConfigError,
    config_from_dict,
    flat_config,
    is_presentation_key,
    parse_override,
    set_key,
)
from jaxrl_engine.io.schema import UINT32_MAX

MAX_NAME_BYTES = 255  # a member's folder name


@dataclasses.dataclass(frozen=True)
class Member:
    """One run of a sweep: its folder `name` inside the sweep directory, seed, grid values
    and resolved config (a valid config on its own: `name` and `run_dir` point at its folder)."""

    name: str
    seed: int
    settings: dict[str, Any]
    cfg: Config

    @property
    def setting(self) -> str:
        """Its grid values, `algo.lr=0.0003 algo.gamma=0.99` (the seeds of one setting share it)."""
        return " ".join(f"{k}={_text(v)}" for k, v in self.settings.items()) or "(base config)"


@dataclasses.dataclass(frozen=True)
class SweepPlan:
    """The members of a sweep and their static groups (one compiled program each)."""

    seeds: list[int]
    grid: dict[str, list[Any]]
    groups: list[list[Member]]

    @property
    def members(self) -> list[Member]:
        return [m for group in self.groups for m in group]


def parse_seeds(value: Any) -> list[int]:
    """Seeds from `0..15` (inclusive), `[0,3,5]`, `7`, or a sequence of ints."""
    if isinstance(value, str):
        text = value.strip()
        if found := re.fullmatch(r"(\d+)\s*\.\.\s*(\d+)", text):
            low, high = int(found.group(1)), int(found.group(2))
            if high < low:
                raise ConfigError(f"seeds={text}: the range a..b needs a <= b")
            if high - low >= 100_000:
                raise ConfigError(f"seeds={text}: at most 100000 seeds")
            return list(range(low, high + 1))
        if found := re.fullmatch(r"\[([\d\s,]*)\]|(\d+)", text):
            items = (found.group(1) if found.group(1) is not None else found.group(2)).split(",")
            return parse_seeds([int(s) for s in items if s.strip()])
        raise ConfigError(f"seeds={text!r}: give a range a..b (inclusive) or a list [0,3,5]")

    def scalar(x: Any) -> Any:  # NumPy's and JAX's integers (`np.arange(4)`'s) are ints
        is_array = isinstance(x, np.ndarray | jax.Array) and x.ndim == 0
        return x.item() if isinstance(x, np.integer) or is_array else x

    value = scalar(value)
    seeds = [scalar(s) for s in value] if isinstance(value, Iterable) else [value]
    if not seeds:
        raise ConfigError("seeds: give at least one seed")
    for seed in seeds:
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= UINT32_MAX:
            raise ConfigError(f"seeds: {seed!r} is not a seed (an int from 0 to {UINT32_MAX})")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"seeds: {seeds} repeats a seed")
    return seeds


def sweep_arguments(
    items: Sequence[str], base: Config
) -> tuple[str | None, dict[str, list[Any]], list[str]]:
    """The CLI's `key=value` items split into (seeds, grid, overrides): `seeds=...` (its text,
    for `parse_seeds`), `key=[a,b]` a grid axis, anything else an override of the base config.
    A key whose value in `base` is a list (e.g. `algo.hidden_sizes`) takes a list as an
    ordinary value; a list of lists (`algo.hidden_sizes=[[32],[64,64]]`) is its grid axis. As
    with overrides, a key's last item decides."""
    seeds: str | None = None
    grid: dict[str, list[Any]] = {}
    overrides: list[str] = []
    current = flat_config(base.model_dump(mode="json"))
    for item in items:
        key, value = parse_override(item)
        if key == "seeds":
            seeds = item.split("=", 1)[1]
        elif isinstance(value, list) and (
            not isinstance(current.get(key), list) or all(isinstance(v, list) for v in value)
        ):
            overrides = [o for o in overrides if o.split("=", 1)[0] != key]
            grid[key] = value
        else:
            grid.pop(key, None)
            overrides.append(item)
    return seeds, grid, overrides


def traced_keys(cfg: Config) -> list[str]:
    """The config keys a sweep traces for `cfg`'s algorithm: `algo.<k>` for its `traced_keys`."""
    return sorted(f"algo.{k}" for k in type(cfg.algo).traced_keys)


def check_sweepable(cfg: Config) -> None:
    """ConfigError naming the key when `cfg`'s runs cannot be vmapped into one program."""
    if cfg.env.host:
        raise ConfigError(
            f"config key 'env.suite': {cfg.env.suite} steps its envs on the host (outside XLA), "
            "so its runs cannot be vmapped into one program; sweep a gymnax env, or train each "
            "setting with `jaxrl-engine train`"
        )
    refused = {
        "offload": (cfg.offload, "moves state between memory kinds per phase"),
        "profile": (cfg.profile, "runs phases as separate calls"),
        "env.overlap": (cfg.env.overlap, "runs an actor thread beside the learner"),
        "env.actor_device": (cfg.env.actor_device is not None, "puts the actor on a device"),
        "algo.torch_policy": (
            getattr(cfg.algo, "torch_policy", None) is not None,
            "acts (or trains) through torch",
        ),
    }
    for key, (on, why) in refused.items():
        if on:
            raise ConfigError(
                f"config key '{key}': a sweep vmaps whole runs into one program; {key} {why}, "
                "which a sweep does not support: leave it off"
            )


def plan_sweep(
    cfg: Config,
    seeds: Any,
    grid: Mapping[str, Sequence[Any]] | None = None,
    split_static: bool = False,
) -> SweepPlan:
    """The members of `seeds` x the cartesian product of `grid` (`{"algo.lr": [...], ...}`),
    grouped by static setting. `cfg.seed` is not used: the seeds come from `seeds`.

    Raises ConfigError (before anything is compiled) naming the key: a grid key that cannot be
    swept (seed, a presentation key such as name, mesh), an empty or repeating value list,
    a member config that is invalid, or a static key with several values without
    `split_static`.
    """
    check_sweepable(cfg)
    seeds = parse_seeds(seeds)
    if grid is not None and not isinstance(grid, Mapping):
        raise ConfigError(
            f"sweep grid is a {type(grid).__name__}: give a dict of key -> list of values "
            "({'algo.lr': [1e-4, 3e-4]})"
        )
    for key, values in (grid or {}).items():
        if isinstance(values, str | bytes | Mapping) or not isinstance(values, Iterable):
            raise ConfigError(
                f"sweep grid key {key!r}: {values!r} is not a list of values (one value: "
                f"[{values!r}], or set it in the config)"
            )
    axes = {str(k): list(v) for k, v in (grid or {}).items()}
    for key, values in axes.items():
        if key == "seed":
            raise ConfigError("sweep grid key 'seed': give the seeds with seeds=..., not a grid")
        if is_presentation_key(key):
            raise ConfigError(
                f"sweep grid key {key!r} says where or how the sweep is stored or shown, not what "
                "it trains: give it one value (key=value)"
            )
        if not values:
            raise ConfigError(f"sweep grid key {key!r}: give at least one value")
        texts = [json.dumps(v, sort_keys=True) for v in values]
        if len(set(texts)) != len(texts):
            raise ConfigError(f"sweep grid key {key!r}: {values} repeats a value")
    root = Path(cfg.run_dir) / cfg.name
    base = cfg.model_dump(mode="json")
    members: list[Member] = []
    names: set[str] = set()
    for combo in itertools.product(*axes.values()):
        settings = dict(zip(axes, combo, strict=True))
        for seed in seeds:
            name = member_name(seed, settings, len(members), names)
            names.add(name)
            raw = copy.deepcopy(base)
            for key, value in settings.items():
                set_key(raw, key, copy.deepcopy(value))
            raw.update(seed=seed, name=name, run_dir=str(root))
            raw["mesh"]["sweep"] = None  # (the sweep's axis: a member alone is one run)
            try:
                member_cfg = config_from_dict(raw)
                check_sweepable(member_cfg)
            except ConfigError as e:
                raise ConfigError(f"sweep member {name}: {e}") from None
            members.append(Member(name=name, seed=seed, settings=settings, cfg=member_cfg))
    _refuse_equal_members(members)
    groups: dict[str, list[Member]] = {}
    for member in members:
        groups.setdefault(static_signature(member.cfg), []).append(member)
    if len(groups) > 1 and not split_static:
        traced = traced_keys(cfg)
        static = [k for k in axes if k not in traced and len(axes[k]) > 1]
        raise ConfigError(
            f"sweep grid key{'s' if len(static) > 1 else ''} {', '.join(map(repr, static))}: "
            "static (changes shapes or the compiled program), so its values cannot share one "
            f"compiled program (traced keys of algo.name={cfg.algo.name}: {', '.join(traced)}); "
            "pass --split-static (jre.sweep(..., split_static=True)) to compile one program "
            "per static setting, or give it one value"
        )
    return SweepPlan(seeds=seeds, grid=axes, groups=list(groups.values()))


def _refuse_equal_members(members: list[Member]) -> None:
    """Two members that train the same config (grid values written differently that resolve
    to one value: `algo.gamma=[1,1.0]`) are refused: one would be a copy counted twice."""
    seen: dict[str, Member] = {}
    for member in members:
        flat = flat_config(member.cfg.model_dump(mode="json"))
        key = json.dumps({k: v for k, v in flat.items() if k != "name"}, sort_keys=True)
        other = seen.setdefault(key, member)
        if other is not member:
            both = ", ".join(
                f"{k}: {other.settings[k]!r} and {member.settings[k]!r}"
                for k in member.settings
                if json.dumps(other.settings[k]) != json.dumps(member.settings[k])
            )
            raise ConfigError(
                f"sweep grid: members {other.name} and {member.name} train the same config "
                f"({both} are one value once read): give each value once"
            )


def static_signature(cfg: Config) -> str:
    """What members of one compiled program share: every training key but the seed and the
    traced ones."""
    skip = {"seed", *traced_keys(cfg)}
    flat = flat_config(cfg.model_dump(mode="json"))
    kept = {k: v for k, v in flat.items() if k not in skip and not is_presentation_key(k)}
    return json.dumps(kept, sort_keys=True)


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))


def member_name(seed: int, settings: Mapping[str, Any], index: int, taken: set[str]) -> str:
    """`seed0_algo.lr=0.0003`: one folder name (characters outside `[A-Za-z0-9._=+,-]` become
    `_`); `member<index>_seed<seed>` when that is too long or already taken."""
    parts = [f"seed{seed}", *(f"{k}={_text(v)}" for k, v in settings.items())]
    name = re.sub(r"[^A-Za-z0-9._=+,\-]", "_", "_".join(parts))
    if len(name.encode()) > MAX_NAME_BYTES or name in taken:
        name = f"member{index}_seed{seed}"
    return name


class SweepPrograms:
    """One static group's engine functions vmapped over `members`, placed on `mesh`.

    The state is the engine's with a leading member axis, sharded over `sweep`; inside each
    member the env batch is sharded over `data` as in a train. `epochs(state, n)` is
    `Engine.pure_epochs` vmapped (the driver's chunk: up to `engine.epochs_per_call` epochs,
    each member stopping after an epoch whose `nan_guard` fired), `evaluate(state)` the hooked
    evaluate phase. `state_shape` and `state_sharding` are what `Checkpointer.restore` needs.
    """

    def __init__(self, engine: Engine, mesh: Mesh, members: int):
        self.engine, self.mesh, self.members = engine, mesh, members
        placed = state_sharding(engine.state_shape, mesh, engine.num_envs)
        self.state_sharding = jax.tree.map(
            lambda s: NamedSharding(mesh, PartitionSpec(SWEEP, *s.spec)), placed
        )
        self.state_shape = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct((members, *x.shape), x.dtype), engine.state_shape
        )
        check_state_fits(
            self.state_shape, self.state_sharding, what=f"the sweep's state ({members} members)"
        )
        self._init = jax.jit(jax.vmap(engine.init_pure), out_shardings=self.state_sharding)
        self._jitted = {
            "epochs": jax.jit(
                jax.vmap(engine.pure_epochs, in_axes=(0, None)),
                donate_argnums=0,
                in_shardings=(self.state_sharding, None),
                out_shardings=(self.state_sharding, None, None),
            ),
            "evaluate": jax.jit(
                jax.vmap(engine.pure_phases["evaluate"]),
                in_shardings=(self.state_sharding,),
                out_shardings=(self.state_sharding, None),
            ),
        }
        self._compiled: dict[str, Any] = {}

    @staticmethod
    def stacked_hparams(hparams: Iterable[Any]) -> Any:
        """The members' hyperparameters as one pytree of arrays `[members, ...]`."""
        return jax.tree.map(lambda *x: jnp.stack(x), *[hparams_arrays(hp) for hp in hparams])

    def init(self, seeds: Sequence[int], hparams: Iterable[Any]) -> EngineState:
        """The members' fresh states: `engine.init(jax.random.key(seed), hparams)` each."""
        keys = jnp.stack([jax.random.key(seed) for seed in seeds])
        return self._init(keys, self.stacked_hparams(hparams))  # type: ignore[no-any-return]

    def compile(self) -> float:
        """AOT-compile the chunk and evaluate (once); returns the seconds it took."""
        seconds = 0.0
        shapes = jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
            self.state_shape,
            self.state_sharding,
        )
        extra = {"epochs": (jax.ShapeDtypeStruct((), jnp.int32),), "evaluate": ()}
        for name, fn in self._jitted.items():
            if name not in self._compiled:
                self._compiled[name], report = compile_phase(name, fn, shapes, *extra[name])
                seconds += report["compile_s"]
        return seconds

    def epochs(self, state: EngineState, n: int) -> tuple[EngineState, Any, jax.Array]:
        """Up to `n` epochs of every member: (state, metrics `[members, rows, ...]`, done
        `[members]`)."""
        fn = self._compiled.get("epochs") or self._jitted["epochs"]
        return fn(state, jnp.int32(n))  # type: ignore[no-any-return]

    def evaluate(self, state: EngineState) -> tuple[EngineState, Any]:
        fn = self._compiled.get("evaluate") or self._jitted["evaluate"]
        return fn(state)  # type: ignore[no-any-return]
