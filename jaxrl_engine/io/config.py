"""Typed configuration: a pydantic schema, YAML files, dotted overrides, clear errors.

The schema's defaults ARE the default run (PPO on CartPole-v1), so `jaxrl-engine train` with no
file needs nothing on disk; `configs/ppo_cartpole.yaml` spells the same values out.
Unknown keys, wrong types and out-of-range values raise `ConfigError` naming the key and the
valid choices, before anything is compiled: every number fits its device dtype (`io.schema`),
the run's step counts fit the engine's int32 counters, env params keep their defaults' types,
the algorithm fits the env's action space, `name` is one folder name, and config files are
small UTF-8 YAML without alias bombs. Messages are bounded in length.

`load_config` validates twice: first everything that needs no env, without importing JAX,
flax or gymnax (`algos.configs` holds the algorithms' config classes for this), so that a
wrong key, type, value or size is answered in a fraction of a second; then the whole config,
whose env checks (env params, the action and observation spaces, an id gymnax must look up)
make the env. A `Config` is only ever built by the second, full validation.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import math
import operator
import os
import re
import reprlib
import sys
import typing
import unicodedata
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

import yaml
from pydantic import (
    BaseModel,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from jaxrl_engine.algos.configs import ALGORITHMS, PPOConfig
from jaxrl_engine.io.schema import _FIELD_TAG, INT32_MAX, Strict, field_error, run_epochs
from jaxrl_engine.io.user_code import import_env_module

# `compile_cache_dir`'s default: the user's own cache folder (jaxrl_engine/io/compile_cache.py).
AUTO_COMPILE_CACHE = "auto"

MAX_CONFIG_BYTES = 2**20  # a config file or an override value
MAX_YAML_NODES = 100_000  # values in a YAML document with every alias expanded
MAX_INPUT_CHARS = 200  # of each offending value quoted in a message
MAX_MESSAGE_CHARS = 2_000
MAX_ERRORS = 10  # validation errors listed in one message
MAX_BUFFER_BYTES = 256 * 2**30  # observations in one rollout or replay buffer


class ConfigError(ValueError):
    """Bad configuration: the message names the key and what would be valid (at most
    `MAX_MESSAGE_CHARS` characters, then a count of the rest)."""

    def __init__(self, message: str) -> None:
        if len(message) > MAX_MESSAGE_CHARS:
            rest = len(message) - MAX_MESSAGE_CHARS
            message = f"{message[:MAX_MESSAGE_CHARS]}... ({rest} more characters)"
        super().__init__(message)


# The validation context of `config_from_dict`'s first pass, which skips the checks that make an
# env (they import gymnax and JAX). Private: its result is thrown away, so no `Config` skips them.
_STRUCTURE_ONLY = object()


def _structure_only(info: ValidationInfo) -> bool:
    return isinstance(info.context, dict) and info.context.get(_STRUCTURE_ONLY) is True


# gymnax 1.0's `registered_envs` less the ones the adapter refuses (`envs.gymnax_env._EXCLUDED`),
# i.e. `available_env_ids()`, known without importing gymnax (a test checks they agree). An id
# not listed here is looked up in gymnax itself.
GYMNAX_ENV_IDS = (
    "CartPole-v1",
    "Pendulum-v1",
    "Acrobot-v1",
    "MountainCar-v0",
    "MountainCarContinuous-v0",
    "Asterix-MinAtar",
    "Breakout-MinAtar",
    "Freeway-MinAtar",
    "Seaquest-MinAtar",
    "SpaceInvaders-MinAtar",
    "Catch-bsuite",
    "DeepSea-bsuite",
    "MemoryChain-bsuite",
    "UmbrellaChain-bsuite",
    "DiscountingChain-bsuite",
    "SimpleBandit-bsuite",
    "FourRooms-misc",
    "MetaMaze-misc",
    "PointRobot-misc",
    "BernoulliBandit-misc",
    "GaussianBandit-misc",
    "Reacher-misc",
    "Swimmer-misc",
    "Pong-misc",
    "FrozenLake-misc",
)


class EnvConfig(Strict):
    suite: Literal["gymnax", "brax", "gymnasium", "envpool"] = Field(
        "gymnax",
        description="gymnax: JAX envs, stepped inside the compiled rollout; brax: Brax's JAX "
        "physics envs (the `brax` extra; env.params.backend, default spring), also inside the "
        "rollout; gymnasium: any registered gymnasium id (MuJoCo with the `mujoco` extra), "
        "stepped on the host; envpool: an EnvPool id (C++ vectorised envs, the `envpool` "
        "extra), stepped on the host",
    )
    id: str = Field(
        "CartPole-v1",
        description="environment id of the suite; gymnasium: also 'your_module:EnvName-v0' "
        "(the module, installed or in the current directory, registers the env)",
    )
    num_envs: int = Field(16, gt=0, description="parallel envs in rollout (sharded over `data`)")
    params: dict[str, float | int | bool | str] = Field(
        default_factory=dict,
        description="gymnax: overrides of the env params; brax: backend, "
        "max_steps_in_episode (default 1000) and the env's constructor kwargs; gymnasium: "
        "`gymnasium.make` kwargs",
    )
    vectorization: Literal["sync", "async"] = Field(
        "sync", description="gymnasium: one process (sync) or a subprocess per env (async)"
    )
    overlap: bool | None = Field(
        None,
        description="an actor thread collects the next rollout while the learner trains on the "
        "last one (policy lag 1); null: on for host suites with on-policy algorithms (unless "
        "the rollout phase is hooked or replaced), or with env.actor_device; else off",
    )
    actor_device: int | None = Field(
        None,
        ge=0,
        description="overlap: the actor runs on this local device (jax.local_devices() index) "
        "and the learner's data mesh takes the others; null: both on the learner's devices",
    )

    @property
    def host(self) -> bool:
        """Whether the suite steps its envs on the host (gymnasium, EnvPool), not in XLA."""
        return self.suite in ("gymnasium", "envpool")

    @model_validator(mode="after")
    def _known_id(self, info: ValidationInfo) -> EnvConfig:
        """A known id of the suite; the Brax and EnvPool ids need their suite imported (JAX
        with it), so `load_config`'s first pass leaves them to the second."""
        if self.actor_device is not None and self.overlap is False:
            raise field_error(
                "actor_device",
                f"{self.actor_device} places the actor of env.overlap, which is false",
            )
        if self.vectorization == "async" and self.suite != "gymnasium":
            raise field_error(
                "vectorization",
                f"async steps gymnasium envs in subprocesses; env.suite={self.suite} "
                + (
                    "steps its own pool (EnvPool's threads)"
                    if self.suite == "envpool"
                    else "steps its envs inside the compiled program"
                )
                + ": drop it",
            )
        if self.suite in ("brax", "envpool"):  # ids known once the suite (JAX too) imports
            if _structure_only(info):
                return self
            if self.suite == "brax":
                from jaxrl_engine.envs.brax_env import brax_env_ids as suite_ids
            else:
                from jaxrl_engine.envs.envpool_env import envpool_ids as suite_ids
            try:
                ids = suite_ids()
            except ImportError as e:  # not installed: the message names the extra
                raise ValueError(str(e)) from None
            if self.id not in ids:
                if self.suite == "brax":
                    raise field_error(
                        "id", f"{self.id!r} is not a Brax env; valid choices: {', '.join(ids)}"
                    )
                close = [e for e in ids if self.id.split("-")[0] in e][:8]
                raise field_error(
                    "id",
                    f"{self.id!r} is not an EnvPool id (envpool.list_all_envs())"
                    + (f"; similar: {', '.join(close)}" if close else ""),
                )
            return self
        if self.suite == "gymnasium":
            import gymnasium

            try:  # gymnasium's "module:EnvName-v0": the module registers the env
                name = import_env_module(self.id, "env.id")
            except ValueError as e:
                raise field_error("id", str(e).removeprefix(f"env.id={self.id!r}: ")) from None
            if name not in gymnasium.registry:
                close = [e for e in gymnasium.registry if name.split("-")[0] in e][:8]
                module = self.id.rpartition(":")[0]
                raise field_error(
                    "id",
                    f"{name!r} is not a registered gymnasium id"
                    + (f" (after importing {module!r})" if module else "")
                    + (f"; similar: {', '.join(close)}" if close else "")
                    + ("" if module else "; an env of your own: 'your_module:EnvName-v0'"),
                )
            return self
        if self.id not in GYMNAX_ENV_IDS:  # (the adapter's ids: tests/io/test_config.py)
            raise field_error(
                "id",
                f"unknown env id {self.id!r}; valid choices: {', '.join(GYMNAX_ENV_IDS)} (or "
                "env.suite=gymnasium for gymnasium ids)",
            )
        if any(isinstance(v, str) for v in self.params.values()):
            raise field_error("params", "the params of a gymnax env are numbers or booleans")
        return self


class EvalConfig(Strict):
    num_envs: int = Field(16, gt=0, description="evaluation envs (one episode each per round)")
    episodes: int | None = Field(
        None,
        gt=0,
        description="episodes per evaluation (null: eval.num_envs); more than eval.num_envs "
        "runs rounds of eval.num_envs fresh episodes",
    )
    deterministic: bool = Field(
        True,
        description="act greedily (argmax, or the Gaussian mean); false: sample as in training",
    )
    interval: int = Field(10, gt=0, description="evaluate every this many epochs (and at the end)")
    env_params: dict[str, float | int | bool | str] = Field(
        default_factory=dict,
        description="env param overrides for evaluation only (an out-of-distribution test set)",
    )
    env_id: str | None = Field(
        None,
        description="host suites: evaluate in this env id instead of env.id (same spaces; made "
        "with eval.env_params alone); null: env.id",
    )


if TYPE_CHECKING:
    AlgoConfig = Any  # one of the registered config classes (`algos.base.AlgoConfig`)
else:
    AlgoConfig = Annotated[
        functools.reduce(operator.or_, ALGORITHMS.values()), Field(discriminator="name")
    ]
ALGO_NAMES = set(ALGORITHMS)
_DEFAULTED = object()  # a key the user left at its default (its error then says so)


LoggerName = Literal["jsonl", "tensorboard", "wandb"]
DEFAULT_LOGGERS: tuple[LoggerName, ...] = ("jsonl", "tensorboard")


class WandbConfig(Strict):
    """Weights & Biases settings, used when `loggers` lists wandb."""

    project: str = Field("jaxrl_engine", description="W&B project")
    entity: str | None = Field(None, description="W&B team or user (null: your default)")
    mode: Literal["online", "offline", "disabled"] = Field(
        "online", description="offline: write locally, `wandb sync` later"
    )


class DistributedConfig(Strict):
    """Multi-process training (`jax.distributed`): where process 0 listens, how many processes
    and which one this is. Read before JAX starts (`jaxrl_engine.distributed.multihost.join`)."""

    coordinator: str | None = Field(
        None, description="HOST:PORT of process 0's coordinator (null: one process, or auto)"
    )
    num_processes: int | None = Field(None, gt=0, description="processes in the job")
    process_id: int | None = Field(None, ge=0, description="this process's index, 0 to N-1")
    auto: bool | None = Field(
        None,
        description="null: join the job a SLURM or Open MPI launch describes (more than one "
        "task); true: let jax.distributed.initialize() detect any cluster it knows (Kubernetes "
        "included); false: never",
    )
    heartbeat_timeout_s: int = Field(
        100,
        gt=0,
        description="a process that stops answering this long stops all the others (JAX's "
        "default; shorter ones end healthy jobs on a loaded machine)",
    )
    init_timeout_s: int = Field(
        120, gt=0, description="how long a process waits for all the others to join"
    )
    collective_timeout_s: int = Field(
        300,
        gt=0,
        description="a CPU collective (gloo) that a process waits in this long fails, instead "
        "of hanging (XLA's --xla_cpu_collective_timeout_seconds)",
    )

    @field_validator("coordinator")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        if value is None:
            return value
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{value!r} is not HOST:PORT (e.g. 127.0.0.1:12355)")
        return value

    @model_validator(mode="after")
    def _complete(self) -> DistributedConfig:
        given = [self.num_processes is not None, self.process_id is not None]
        if self.coordinator is not None and not all(given):
            raise field_error(
                "num_processes" if not given[0] else "process_id",
                "distributed.coordinator needs distributed.num_processes and "
                "distributed.process_id too",
            )
        if self.coordinator is None and any(given):
            raise field_error(
                "coordinator",
                "distributed.num_processes/process_id need distributed.coordinator (HOST:PORT "
                "of process 0)",
            )
        if (
            self.num_processes is not None
            and self.process_id is not None
            and self.process_id >= self.num_processes
        ):
            raise field_error(
                "process_id",
                f"{self.process_id} is not below distributed.num_processes={self.num_processes}",
            )
        return self


class MeshConfig(Strict):
    """The device mesh: `data` shards each run's env batch, `sweep` a sweep's members."""

    data: int | None = Field(
        None,
        gt=0,
        description="devices of the `data` axis (env batch sharded); null: every device for a "
        "train, 1 in a sweep",
    )
    sweep: int | None = Field(
        None,
        gt=0,
        description="devices of the `sweep` axis (a sweep's members sharded; must divide the "
        "members of each compiled program); null: the most devices that divide them",
    )


class Config(Strict):
    """A run's whole configuration (validated; `jre.load_config` reads it from YAML and
    `key=value` overrides). Every key is listed in the README's config reference."""

    uint32_fields: ClassVar[frozenset[str]] = frozenset({"seed"})  # jax.random.key(seed)

    name: str = Field("ppo_cartpole", description="run name: the run directory is runs/<name>")
    seed: int = Field(
        0, ge=0, description="PRNG seed of jax.random.key: at most 2**32 - 1 (uint32)"
    )
    total_env_steps: int = Field(
        1_000_000, gt=0, description="env steps to train (rounded up to whole epochs)"
    )
    offload: bool = Field(
        False, description="RLightning's placement: idle params/optimizer state in pinned_host"
    )
    env: EnvConfig = Field(default_factory=lambda: EnvConfig())
    eval: EvalConfig = Field(default_factory=lambda: EvalConfig())
    algo: AlgoConfig = Field(default_factory=lambda: PPOConfig())
    run_dir: str = Field("runs", description="parent folder of run directories")
    profile: bool = Field(
        False, description="run phases as separate compiled calls and time each one"
    )
    nan_guard: bool = Field(True, description="stop at the first non-finite metric/param/obs")
    compile_cache_dir: str | None = Field(
        AUTO_COMPILE_CACHE,
        description="persistent XLA compilation cache folder: auto (JAX's own if set, else "
        "~/.cache/jaxrl_engine/xla/<cpu>), a path, or null (the engine sets none)",
    )
    progress: bool = Field(True, description="rich progress bar in the driver")
    loggers: list[LoggerName] = Field(
        default_factory=lambda: list(DEFAULT_LOGGERS),
        description="metric backends, fed once per epoch (or per log_interval epochs): jsonl "
        "(metrics.jsonl, always written), tensorboard (event files in the run dir), wandb (the "
        "`wandb` extra)",
    )
    log_interval: int = Field(
        1,
        gt=0,
        description="one metrics record (metrics.jsonl and the loggers) per this many epochs: "
        "the means over them (episode returns over the episodes that ended in them), and at "
        "every evaluation and checkpoint",
    )
    wandb: WandbConfig = Field(default_factory=lambda: WandbConfig())
    distributed: DistributedConfig = Field(default_factory=lambda: DistributedConfig())
    save_interval: int = Field(
        250,
        ge=0,
        description="full-state checkpoint every this many epochs and after the last (0: none)",
    )
    keep_checkpoints: int = Field(3, gt=0, description="how many of the newest checkpoints to keep")
    mesh: MeshConfig = Field(default_factory=lambda: MeshConfig())

    @model_validator(mode="before")
    @classmethod
    def _default_algo_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("algo"), dict):
            data = {**data, "algo": {"name": "ppo", **data["algo"]}}
        return data

    @field_validator("name")
    @classmethod
    def _one_folder_name(cls, value: str) -> str:
        return folder_name(value)

    @field_validator("run_dir", "compile_cache_dir")
    @classmethod
    def _a_directory(cls, value: str | None, info: ValidationInfo) -> str | None:
        """A folder path: no NUL, and neither it nor a parent is an existing non-directory."""
        if value is None or (
            value == AUTO_COMPILE_CACHE and info.field_name == "compile_cache_dir"
        ):
            return value
        if not value:
            raise ValueError("must name a folder (an empty string names none; null for no value)")
        if "\0" in value:
            raise ValueError("a path cannot hold a NUL byte")
        try:
            os.fsencode(value)
        except UnicodeEncodeError:
            raise ValueError("the path cannot be encoded for the file system") from None
        path = Path(value)
        for part in (path, *path.parents):
            if os.path.lexists(part) and not os.path.isdir(part):
                what = "is" if part == path else f"is inside {str(part)!r}, which is"
                raise ValueError(f"must name a directory; it {what} a file, not a directory")
        return value

    @field_validator("loggers")
    @classmethod
    def _loggers_installed(cls, value: list[LoggerName]) -> list[LoggerName]:
        import importlib.util

        if "wandb" in value and importlib.util.find_spec("wandb") is None:
            raise ValueError("wandb is not installed: pip install 'jaxrl-engine[wandb]'")
        return list(dict.fromkeys(["jsonl", *value]))  # type: ignore[list-item]

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> Config:
        """Sizes, env params and the action space, checked together (before any compile); the
        checks that make the env (gymnax or the host suite: JAX) are left out of
        `load_config`'s first pass."""
        per_epoch = self.algo.num_steps * self.env.num_envs
        epochs = run_epochs(self.total_env_steps, self.algo.num_steps, self.env.num_envs)
        if epochs * per_epoch > INT32_MAX:
            raise ValueError(
                f"total_env_steps={self.total_env_steps}, rounded up to whole epochs of "
                f"algo.num_steps * env.num_envs = {per_epoch} env steps, is "
                f"{epochs * per_epoch}: more than the engine's int32 counters hold ({INT32_MAX})"
            )
        self.algo.check(self.env.num_envs, self.total_env_steps)
        if not self.env.host and self.eval.env_id not in (None, self.env.id):
            raise field_error(
                "eval.env_id",
                f"{self.eval.env_id!r}: a {self.env.suite} run evaluates in its own env (env.id="
                f"{self.env.id}); eval.env_params changes its params for evaluation",
            )
        if _structure_only(info):
            return self
        if self.env.host:
            from jaxrl_engine.envs.host import host_env

            spec = host_env(self, 1, 1, offload=False).spec(None)
        elif self.env.suite == "brax":
            from jaxrl_engine.envs.brax_env import BraxEnv

            try:
                brax_env = BraxEnv(self.env.id, self.env.params)
                BraxEnv.with_params(brax_env.params, self.eval.env_params, key="eval.env_params")
            except ValueError as e:  # the message names env.params or eval.env_params
                raise ValueError(str(e)) from None
            spec = brax_env.spec(brax_env.params)
        else:
            from jaxrl_engine.envs.gymnax_env import GymnaxEnv, make_env

            env = make_env(self.env.id, None)
            params = GymnaxEnv.with_params(env.params, self.env.params, key="env.params")
            GymnaxEnv.with_params(env.params, self.eval.env_params, key="eval.env_params")
            spec = env.spec(params)
        _check_action_space(self.algo, self.env.id, spec.action, self.env.suite)
        if hasattr(self.algo, "check_observations"):  # e.g. algo.torso=cnn on non-images
            self.algo.check_observations(spec)
        import numpy as np

        replay = getattr(self.algo, "buffer_size", 0) > per_epoch
        rows = self.algo.buffer_size if replay else per_epoch
        obs_bytes = rows * math.prod(spec.obs_shape) * np.dtype(spec.obs_dtype).itemsize
        if obs_bytes > MAX_BUFFER_BYTES:
            raise ValueError(
                f"the {'replay' if replay else 'rollout'} buffer would hold {rows} transitions, "
                f"{obs_bytes / 2**30:.0f} GiB of observations alone (obs shape "
                f"{spec.obs_shape}), more than {MAX_BUFFER_BYTES // 2**30} GiB: lower "
                + ("algo.buffer_size" if replay else "env.num_envs or algo.num_steps")
            )
        return self


def folder_name(value: str) -> str:
    """`value` when it can be a run's name: one folder inside run_dir; ValueError if not."""
    if (
        value in ("", ".", "..")
        or value.startswith("-")
        or any(c in "/\\" or unicodedata.category(c) in ("Cc", "Cs") for c in value)
        or len(value.encode()) > 255
    ):
        raise ValueError(
            "must be one folder name inside run_dir: not empty, '.' or '..', at most 255 "
            "bytes, no '/', '\\' or control characters, not starting with '-'"
        )
    return value


def _check_action_space(algo: Any, env_id: str, action: Any, suite: str) -> None:
    """ValueError when the algorithm's `action_space` ("discrete", "continuous" or "any") does
    not fit the env's actions; the message lists the algorithms that do."""
    kind = "discrete" if action.discrete else "continuous"
    needs = getattr(type(algo), "action_space", "any")
    if needs in ("any", kind):
        return
    fits = [n for n, c in ALGORITHMS.items() if getattr(c, "action_space", "any") in ("any", kind)]
    has = (
        f"{action.num_actions} discrete actions"
        if action.discrete
        else f"a continuous action space of shape {action.shape}"
    )
    use = f"{', '.join(fits[:-1])} or {fits[-1]}" if len(fits) > 1 else "".join(fits)
    own = ""
    if suite == "gymnax":
        example = "Pendulum-v1" if needs == "continuous" else "CartPole-v1"
        own = (
            "; for your own env given to jre.build(cfg, env=...), set env.id to a gymnax id "
            f"with {needs} actions, e.g. {example}: the config is validated against env.id"
        )
    raise ValueError(
        f"algo.name={algo.name} needs a {needs} action space; env.id={env_id} has {has} (use "
        f"{use}{own})"
    )


def _valid_keys(model: type[BaseModel], loc: tuple[Any, ...], algo: str = "ppo") -> list[str]:
    """Field names of the sub-model at `loc` (for 'unknown key' messages); `algo` names the
    model under the `algo` key."""
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        if field is None:
            return []
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
        elif str(part) == "algo":
            model = ALGORITHMS.get(algo, PPOConfig)
        else:
            return []
    return sorted(model.model_fields)


# Names other libraries give these settings (Stable-Baselines3, CleanRL, PureJaxRL), compared
# lower-cased without underscores, and this config's keys for them (those valid in the section
# are suggested; a dotted key is another section's).
_ALIASES: dict[str, tuple[str, ...]] = {
    "learningrate": ("lr", "actor_lr", "critic_lr"),
    "policylr": ("actor_lr",),
    "qlr": ("critic_lr",),
    "nsteps": ("num_steps",),
    "nepochs": ("update_epochs",),
    "ppoepochs": ("update_epochs",),
    "nminibatches": ("num_minibatches",),
    "batchsize": ("num_minibatches",),  # (under ppo: batch_size is DQN's, SAC's and TD3's)
    "minibatchsize": ("num_minibatches", "batch_size"),
    "cliprange": ("clip_eps",),
    "clipcoef": ("clip_eps",),
    "clipparam": ("clip_eps",),
    "lam": ("gae_lambda",),
    "lambda": ("gae_lambda",),
    "netarch": ("hidden_sizes",),
    "activationfn": ("activation",),
    "trainfreq": ("train_ratio",),
    "gradientsteps": ("train_ratio",),
    "targetupdatefreq": ("target_update_interval",),
    "targetnetworkfrequency": ("target_update_interval",),
    "explorationinitialeps": ("epsilon_start",),
    "starte": ("epsilon_start",),
    "explorationfinaleps": ("epsilon_end",),
    "ende": ("epsilon_end",),
    "policyfrequency": ("policy_delay",),
    "targetpolicynoise": ("policy_noise",),
    "targetnoiseclip": ("noise_clip",),
    "alpha": ("init_alpha",),
    "entcoef": ("init_alpha", "autotune"),
    "nenvs": ("env.num_envs",),
    "numenvs": ("env.num_envs",),
    "totaltimesteps": ("total_env_steps",),
    "timesteps": ("total_env_steps",),
}
_NOTES = {
    "num_minibatches": " (PPO's minibatch is env.num_envs x algo.num_steps / algo.num_minibatches)",
    "train_ratio": " (gradient steps per env step)",
}


def _alias(key: str, fields: list[str]) -> str:
    """`'lr'` for `learning_rate` (another library's name), "" when none is known."""
    last = key.rsplit(".", 1)[-1].lower().replace("_", "").replace("-", "")
    meant = [t for t in _ALIASES.get(last, ()) if t in fields or "." in t]
    return " or ".join(f"'{t}'" for t in meant) + "".join(_NOTES.get(t, "") for t in meant)


def _hint(keys: list[str], fields: list[str], algo: str | None) -> str:
    """`; did you mean 'lr'?` for misspelled keys or other libraries' names
    (`learning_rate`), or the algorithms whose keys they all are when they are another
    algorithm's (`algo.tau` under ppo; a PPO config's keys under sac); "" when none."""
    aliases = {k: a for k in keys if (a := _alias(k, fields))}
    alias = ""
    if aliases:
        meant = [a if len(keys) == 1 else f"{a} for '{k}'" for k, a in aliases.items()]
        alias = f"; did you mean {', '.join(meant)}?"

    def others(key: str) -> set[str]:
        last = key.rsplit(".", 1)[-1]
        models = ALGORITHMS.items()
        return {n for n, m in models if n != algo and last in getattr(m, "model_fields", {})}

    if algo is not None:
        common = set.intersection(*(others(k) for k in keys))
        if common:  # (another algorithm's keys; one key may also be another library's name)
            whose = f"algo.name={'/'.join(sorted(common))}"
            one = len(keys) == 1
            return f"; {'it is a key' if one else 'they are keys'} of {whose}{alias * one}"
    if alias:
        return alias
    lowered = {f.lower(): f for f in fields}
    meant = []
    for key in keys:
        last = key.rsplit(".", 1)[-1].lower()
        close = difflib.get_close_matches(last, list(lowered), n=1, cutoff=0.75)
        if close:
            word = f"'{lowered[close[0]]}'"
            meant.append(f"{word} for '{key}'" if len(keys) > 1 else word)
    return f"; did you mean {', '.join(meant)}?" if meant else ""


_repr = reprlib.Repr()
_repr.maxlevel, _repr.maxdict, _repr.maxlist, _repr.maxtuple = 3, 8, 8, 8
_repr.maxstring = _repr.maxlong = _repr.maxother = MAX_INPUT_CHARS


def _short(value: Any) -> str:
    """A repr of at most about `MAX_INPUT_CHARS` characters, however large `value` is."""
    try:
        text = _repr.repr(value)
    except Exception:  # e.g. an int with too many digits to print
        text = f"<{type(value).__name__}>"
    return text if len(text) <= MAX_INPUT_CHARS else text[:MAX_INPUT_CHARS] + "..."


def _format(error: ValidationError) -> str:
    """One line per error (at most `MAX_ERRORS`), each offending input shortened."""
    lines: list[Any] = []  # a message, or an unknown-keys section to fill in
    errors = error.errors()
    # Unknown keys of one section are one line, its valid keys listed once (a config's ppo
    # keys left over after `algo.name=sac` are several unknown keys of one section).
    unknown: dict[tuple[Any, ...], list[str]] = {}
    for e in errors:
        loc = tuple(
            p
            for i, p in enumerate(e["loc"])
            if not (i == 1 and e["loc"][0] == "algo" and p in ALGO_NAMES)
        )
        key = ".".join(str(p) for p in loc)[:MAX_INPUT_CHARS] or "<config>"
        if e["type"] == "extra_forbidden":
            tagged = len(e["loc"]) > 2 and e["loc"][0] == "algo" and e["loc"][1] in ALGO_NAMES
            section = (loc[:-1], str(e["loc"][1]) if tagged else None)
            if section not in unknown:
                unknown[section] = []
                lines.append(section)  # its place in the message, filled in below
            unknown[section].append(key)
        else:
            msg = e["msg"].removeprefix("Value error, ")
            got = e.get("input")
            if msg.startswith(_FIELD_TAG):  # a model validator naming the field at fault
                field, msg = msg[len(_FIELD_TAG) :].split(_FIELD_TAG, 1)
                key = f"{key}.{field}" if loc else field
                for part in field.split("."):
                    got = got.get(part, _DEFAULTED) if isinstance(got, dict) else got
                loc = (*loc, field)
            if e["type"] == "union_tag_invalid" and isinstance(got, dict):  # algo.name=foo
                key, got = f"{key}.name", got.get("name")
                msg = msg.replace(" found using 'name'", "")
            if loc and got is _DEFAULTED:  # (the default's fault, with another key's value)
                lines.append(f"config key '{key}': {msg} (its default)")
            elif loc:
                lines.append(f"config key '{key}': {msg} (got {_short(got)})")
            else:
                lines.append(msg)
    for i, line in enumerate(lines):
        if isinstance(line, tuple):
            (parent, algo), keys = line, unknown[line]
            fields = _valid_keys(Config, (*parent, "x"), algo or "ppo")
            valid = ", ".join(fields)
            names = ", ".join(f"'{k}'" for k in keys)
            which = f" (algo.name={algo})" if algo else ""
            plural = "s" if len(keys) > 1 else ""
            hint = _hint(keys, fields, algo if parent == ("algo",) else None)
            lines[i] = f"unknown config key{plural} {names}{which}; valid keys here: {valid}{hint}"
    if len(lines) > MAX_ERRORS:
        lines[MAX_ERRORS:] = [f"and {len(lines) - MAX_ERRORS} more errors"]
    return "invalid configuration: " + "; ".join(lines)


def _expanded_size(node: yaml.Node, memo: dict[int, int]) -> int:
    """Values in `node` with every alias expanded, memoised by node id (so linear in the
    document, not in its expansion); ConfigError on an alias to itself."""
    if id(node) in memo:
        if memo[id(node)] < 0:
            raise ConfigError("a YAML alias refers to the node that holds it")
        return memo[id(node)]
    memo[id(node)] = -1  # being counted
    if isinstance(node, yaml.SequenceNode):
        children = list(node.value)
    elif isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    else:
        children = []
    memo[id(node)] = 1 + sum(_expanded_size(child, memo) for child in children)
    return memo[id(node)]


class _Loader(yaml.SafeLoader):
    """Safe YAML that also reads exponent floats without a dot (`1e-3`, `-1e39`) as floats,
    as YAML 1.2 does; PyYAML's YAML 1.1 rules read them as strings. A key given twice in one
    mapping is an error (YAML 1.2 forbids it; PyYAML keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, Hashable) and key in seen:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping",
                    node.start_mark,
                    f"the key {key!r} is given twice",
                    key_node.start_mark,
                )
            if isinstance(key, Hashable):
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


class _Dumper(yaml.SafeDumper):
    """Safe YAML that quotes the strings `_Loader` would read as floats (a run named `0E0`)."""


_EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
for _cls, _base in ((_Loader, yaml.SafeLoader), (_Dumper, yaml.SafeDumper)):
    _cls.yaml_implicit_resolvers = {k: list(v) for k, v in _base.yaml_implicit_resolvers.items()}
    _cls.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+0123456789"))


def _load_yaml(text: str, what: str) -> Any:
    """`text` parsed as (safe) YAML; ConfigError naming `what` when it is larger than
    `MAX_CONFIG_BYTES`, nested too deeply, or expands to more than `MAX_YAML_NODES` values
    (an alias bomb); yaml.YAMLError when it is not YAML."""
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{what} is larger than {MAX_CONFIG_BYTES // 2**20} MiB")
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        try:
            size = _expanded_size(node, {})
        except ConfigError as e:
            raise ConfigError(f"{what}: {e}") from None
        if size > MAX_YAML_NODES:
            raise ConfigError(
                f"{what} expands to {size} values through its YAML anchors and aliases "
                f"(at most {MAX_YAML_NODES})"
            )
        return loader.construct_document(node)
    except ConfigError:
        raise
    except RecursionError:
        raise ConfigError(f"{what} is nested too deeply") from None
    except ValueError as e:  # e.g. an int with too many digits
        raise ConfigError(f"{what} holds a value YAML cannot read: {_short(str(e))}") from None
    finally:
        loader.dispose()


def _parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        first = (
            ": a config file comes first (jaxrl-engine train CONFIG key=value ...)"
            if item.endswith((".yaml", ".yml"))
            else ""
        )
        raise ConfigError(
            f"override {_short(item)} is not of the form key=value (e.g. algo.lr=1e-3){first}"
        )
    key, raw = item.split("=", 1)
    key = key.strip()  # ('algo.lr = 3e-4' given as one argument)
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {_short(item)} has an empty key part")
    try:
        value = _load_yaml(raw, f"the value of override {_short(key)}") if raw else ""
    except yaml.YAMLError:
        value = raw
    if isinstance(value, bool) and raw.strip().lower() not in ("true", "false"):
        # YAML 1.1's yes/no/on/off: kept as written, so `name=off` is the name "off" (a
        # boolean key still takes it: pydantic reads "off" as false)
        value = raw.strip()
    if raw.strip() == "None":  # Python's spelling of null (not a quoted "None")
        value = None  # (a text-only key keeps "None": `apply_overrides`)
    if isinstance(value, str):  # YAML 1.1 reads 1e-3 as a string
        with contextlib.suppress(ValueError):
            value = float(value)
    return key.split("."), value


def parse_override(item: str) -> tuple[str, Any]:
    """`key=value` -> (the dotted key, the value parsed as a YAML scalar or list)."""
    parts, value = _parse_override(item)
    return ".".join(parts), value


def set_key(raw: dict[str, Any], key: str, value: Any) -> None:
    """Set dotted `key` (`a.b.c`) in the config mapping `raw`, making the sections on the way."""
    parts = key.split(".")
    node = raw
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value


def _scalar_text(raw: str) -> str:
    """The text of a YAML scalar as written: without its quotes or a trailing comment
    (`"2024"` and `2024  # year` are both 2024)."""
    try:
        node = yaml.compose(raw, Loader=_Loader)
    except yaml.YAMLError:
        node = None
    return str(node.value) if isinstance(node, yaml.ScalarNode) else raw.strip()


def _text_field(parts: list[str]) -> bool | None:
    """For a config key whose values are text only (`name`, `env.id`, `run_dir`; under
    `algo`, a key that is text in every algorithm that has it): whether it also takes None.
    None for any other key."""
    models: list[Any] = [Config]
    annotations: list[Any] = []
    for i, part in enumerate(parts):
        found = [m.model_fields[part].annotation for m in models if part in m.model_fields]
        if not found:
            return None
        if i == len(parts) - 1:
            annotations = found
            break
        models = [
            t
            for a in found
            for t in (typing.get_args(a) or (a,))
            if isinstance(t, type) and issubclass(t, BaseModel)
        ]
    takes_none = False
    for annotation in annotations:
        types = set(typing.get_args(annotation) or (annotation,))
        takes_none |= type(None) in types
        if types - {type(None)} != {str}:
            return None
    return takes_none


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """`raw` with each `a.b.c=value` set (values parsed as YAML scalars/lists). A key that
    takes text only keeps the text as written where YAML reads a number or a boolean
    (`name=2024`, `env.id=2048`), and `null` too where the key cannot be null."""
    for item in overrides:
        parts, value = _parse_override(item)
        if isinstance(value, int | float | bool) or value is None:
            takes_none = _text_field(parts)
            if takes_none is not None and (value is not None or not takes_none):
                value = _scalar_text(item.split("=", 1)[1])
        set_key(raw, ".".join(parts), value)
    return raw


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    on_structure: Callable[[Config], None] | None = None,
) -> Config:
    """Load a YAML config (None: the built-in default), apply dotted overrides, validate.

    on_structure(cfg): called between the two validations (see the module docstring) with
    the config whose keys, types, values and sizes are valid and whose env checks are still
    to come (the CLI's first status line); only the returned config is fully validated."""
    return config_from_dict(read_config(path), overrides, on_structure)


def load_distributed(
    path: str | Path | None = None, overrides: list[str] | None = None
) -> DistributedConfig:
    """The `distributed` block of a config file with overrides, validated alone: what a
    process must know before JAX starts (validating the whole config starts JAX)."""
    raw = apply_overrides(read_config(path), list(overrides or []))
    try:  # (a model of this block alone: errors name `distributed.<key>`)
        block = raw.get("distributed") or {}
        return _DistributedOnly.model_validate({"distributed": block}).distributed
    except ValidationError as e:
        raise ConfigError(_format(e)) from None


def check_structure(path: str | Path | None = None, overrides: list[str] | None = None) -> None:
    """`load_config`'s first validation alone (keys, types, values and sizes; no env, no
    JAX): a process of a multi-process job answers these errors before it joins the job."""
    raw = apply_overrides(read_config(path), list(overrides or []))
    try:
        Config.model_validate(raw, context={_STRUCTURE_ONLY: True})
    except ValidationError as e:
        raise ConfigError(_format(e)) from None


class _DistributedOnly(Strict):
    distributed: DistributedConfig


def read_config(path: str | Path | None) -> dict[str, Any]:
    """A YAML config file's mapping, not yet validated (None: empty, the built-in default)."""
    raw: dict[str, Any] = {}
    if path is not None:
        name = f"config file {_short(str(path))}"
        text = _read_text(Path(path), name)
        try:
            loaded = _load_yaml(text, name)
        except yaml.YAMLError as e:
            raise ConfigError(f"{name} is not valid YAML: {e}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{name} must hold a mapping at top level")
        raw = loaded or {}
    return raw


def _read_text(path: Path, name: str) -> str:
    """The UTF-8 text of a regular file of at most `MAX_CONFIG_BYTES`; ConfigError naming
    `name` otherwise."""
    if not os.path.exists(path):
        raise ConfigError(f"{name} does not exist")
    if os.path.isdir(path):
        raise ConfigError(f"{name} is a directory, not a YAML file")
    if not os.path.isfile(path):
        raise ConfigError(f"{name} is not a regular file")
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"{name} cannot be read: {e.strerror or e}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{name} is larger than {MAX_CONFIG_BYTES // 2**20} MiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{name} is not UTF-8 text: byte 0x{data[e.start]:02x} at offset {e.start}"
        ) from None


def check_env_modules(stored: dict[str, Any], given: list[str], source: str) -> None:
    """ConfigError for a stored env id of gymnasium's `module:EnvName-v0` form whose module this
    process has not imported, unless the user names that key again in the overrides: the
    module's code would run on the run directory's word."""
    for key in ("env.id", "eval.env_id"):
        section, field = key.split(".")
        value = (
            stored.get(section, {}).get(field) if isinstance(stored.get(section), dict) else None
        )
        module = value.rpartition(":")[0] if isinstance(value, str) else ""
        if not module or module in sys.modules or section in given or key in given:
            continue
        raise ConfigError(
            f"{source} names the env {value!r} for {key}, registered by the module {module!r}; "
            "a run directory is data, never code, so that module is not imported on its word: "
            f"if it is yours, import it first (CLI: --import {module}; Python: import {module})"
        )


def config_from_dict(
    raw: dict[str, Any],
    overrides: list[str] | None = None,
    on_structure: Callable[[Config], None] | None = None,
) -> Config:
    """Validate a config mapping (e.g. a checkpoint's resolved config) with dotted overrides."""
    raw = apply_overrides(raw, list(overrides or []))
    try:
        # First without the checks that make an env, so that every other error is answered
        # before JAX is imported; then the whole config (its result is the only one kept).
        structure = Config.model_validate(raw, context={_STRUCTURE_ONLY: True})
        if on_structure is not None:
            on_structure(structure)
        return Config.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_format(e)) from None


# Keys that say where and how a run is shown or stored, not what it trains (a prefix ends in
# "."): resuming with other values is not a config change, and plots do not group by them.
PRESENTATION_KEYS = (
    "name",
    "run_dir",
    "progress",
    "profile",
    "compile_cache_dir",
    "loggers",
    "log_interval",
    "wandb.",
    "save_interval",
    "keep_checkpoints",
    "distributed.",
    "mesh.",
)


def is_presentation_key(key: str) -> bool:
    return any(key == p or (p.endswith(".") and key.startswith(p)) for p in PRESENTATION_KEYS)


def flat_config(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"algo": {"lr": 1}}` -> `{"algo.lr": 1}` (dicts of env params stay whole)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict) and key not in ("params", "env_params"):
            out.update(flat_config(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """`key: old -> new` for each training config key that differs (presentation keys
    ignored)."""
    a, b = flat_config(old), flat_config(new)
    return [
        f"{k}: {a.get(k, '<unset>')!r} -> {b.get(k, '<unset>')!r}"
        for k in sorted(set(a) | set(b))
        if not is_presentation_key(k) and a.get(k, "<unset>") != b.get(k, "<unset>")
    ]


def dump_config(cfg: Config) -> str:
    """The resolved config as YAML (what a run directory keeps)."""
    return yaml.dump(cfg.model_dump(mode="json"), Dumper=_Dumper, sort_keys=False)
