"""Typed configuration: a pydantic schema, YAML files, dotted overrides, clear errors.

The schema's defaults ARE the default run (PPO on CartPole-v1), so `jaxrl-engine train` with no
file needs nothing on disk; `configs/ppo_cartpole.yaml` spells the same values out.
Unknown keys, wrong types and out-of-range values raise `ConfigError` naming the key and the
valid choices, before anything is compiled.
"""

from __future__ import annotations

import contextlib
import functools
import operator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from jaxrl_engine.algos import ALGORITHMS
from jaxrl_engine.algos.ppo import PPOConfig
from jaxrl_engine.io.schema import Strict


class ConfigError(ValueError):
    """Bad configuration: the message names the key and what would be valid."""


class EnvConfig(Strict):
    id: str = Field("CartPole-v1", description="gymnax environment id")
    num_envs: int = Field(16, gt=0, description="parallel envs in rollout (sharded over `data`)")
    params: dict[str, float | int | bool] = Field(
        default_factory=dict, description="overrides of the gymnax env params"
    )

    @field_validator("id")
    @classmethod
    def _known_id(cls, value: str) -> str:
        from jaxrl_engine.envs.gymnax_env import available_env_ids

        if value not in available_env_ids():
            raise ValueError(
                f"unknown env id {value!r}; valid choices: {', '.join(available_env_ids())}"
            )
        return value


class EvalConfig(Strict):
    num_envs: int = Field(16, gt=0, description="episodes per evaluation (one per env)")
    interval: int = Field(10, gt=0, description="evaluate every this many epochs (and at the end)")
    env_params: dict[str, float | int | bool] = Field(
        default_factory=dict,
        description="env param overrides for evaluation only (an out-of-distribution test set)",
    )


if TYPE_CHECKING:
    AlgoConfig = Any  # one of the registered config classes (`algos.base.AlgoConfig`)
else:
    AlgoConfig = Annotated[
        functools.reduce(operator.or_, ALGORITHMS.values()), Field(discriminator="name")
    ]
ALGO_NAMES = set(ALGORITHMS)


LoggerName = Literal["jsonl", "tensorboard", "wandb"]
DEFAULT_LOGGERS: tuple[LoggerName, ...] = ("jsonl", "tensorboard")


class WandbConfig(Strict):
    """Weights & Biases settings, used when `loggers` lists wandb."""

    project: str = Field("jaxrl_engine", description="W&B project")
    entity: str | None = Field(None, description="W&B team or user (null: your default)")
    mode: Literal["online", "offline", "disabled"] = Field(
        "online", description="offline: write locally, `wandb sync` later"
    )


class Config(Strict):
    name: str = Field("ppo_cartpole", description="run name: the run directory is runs/<name>")
    seed: int = Field(0, ge=0, description="PRNG seed")
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
        None, description="persistent XLA compilation cache folder (off when null)"
    )
    progress: bool = Field(True, description="rich progress bar in the driver")
    loggers: list[LoggerName] = Field(
        default_factory=lambda: list(DEFAULT_LOGGERS),
        description="metric backends, fed once per epoch: jsonl (metrics.jsonl, always written), "
        "tensorboard (event files in the run dir), wandb (the `wandb` extra)",
    )
    wandb: WandbConfig = Field(default_factory=lambda: WandbConfig())
    save_interval: int = Field(
        250,
        ge=0,
        description="full-state checkpoint every this many epochs and after the last (0: none)",
    )
    keep_checkpoints: int = Field(3, gt=0, description="how many of the newest checkpoints to keep")

    @model_validator(mode="before")
    @classmethod
    def _default_algo_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("algo"), dict):
            data = {**data, "algo": {"name": "ppo", **data["algo"]}}
        return data

    @field_validator("loggers")
    @classmethod
    def _loggers_installed(cls, value: list[LoggerName]) -> list[LoggerName]:
        import importlib.util

        if "wandb" in value and importlib.util.find_spec("wandb") is None:
            raise ValueError("wandb is not installed: pip install 'jaxrl-engine[wandb]'")
        return list(dict.fromkeys(["jsonl", *value]))  # type: ignore[list-item]

    @model_validator(mode="after")
    def _consistent(self) -> Config:
        self.algo.check(self.env.num_envs, self.total_env_steps)
        from jaxrl_engine.envs.gymnax_env import GymnaxEnv, make_env

        env = make_env(self.env.id, None)
        for key, overrides in (
            ("env.params", self.env.params),
            ("eval.env_params", self.eval.env_params),
        ):
            try:
                GymnaxEnv.with_params(env.params, overrides)
            except ValueError as e:
                raise ValueError(f"{key}: {e}") from None
        return self


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


def _format(error: ValidationError) -> str:
    lines = []
    for e in error.errors():
        loc = tuple(
            p
            for i, p in enumerate(e["loc"])
            if not (i == 1 and e["loc"][0] == "algo" and p in ALGO_NAMES)
        )
        key = ".".join(str(p) for p in loc) or "<config>"
        if e["type"] == "extra_forbidden":
            tagged = len(e["loc"]) > 2 and e["loc"][0] == "algo" and e["loc"][1] in ALGO_NAMES
            valid = _valid_keys(Config, loc, str(e["loc"][1]) if tagged else "ppo")
            lines.append(f"unknown config key '{key}'; valid keys here: {', '.join(valid)}")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            if loc:
                lines.append(f"config key '{key}': {msg} (got {e.get('input')!r})")
            else:
                lines.append(msg)
    return "invalid configuration: " + "; ".join(lines)


def _parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form key=value (e.g. algo.lr=1e-3)")
    key, raw = item.split("=", 1)
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {item!r} has an empty key part")
    try:
        value = yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError:
        value = raw
    if isinstance(value, str):  # YAML 1.1 reads 1e-3 as a string
        with contextlib.suppress(ValueError):
            value = float(value)
    return key.split("."), value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """`raw` with each `a.b.c=value` set (values parsed as YAML scalars/lists)."""
    for item in overrides:
        parts, value = _parse_override(item)
        node = raw
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        node[parts[-1]] = value
    return raw


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Load a YAML config (None: the built-in default), apply dotted overrides, validate."""
    raw: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} does not exist")
        try:
            loaded = yaml.safe_load(path.read_text())
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {str(path)!r} is not valid YAML: {e}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {str(path)!r} must hold a mapping at top level")
        raw = loaded or {}
    return config_from_dict(raw, overrides)


def config_from_dict(raw: dict[str, Any], overrides: list[str] | None = None) -> Config:
    """Validate a config mapping (e.g. a checkpoint's resolved config) with dotted overrides."""
    raw = apply_overrides(raw, list(overrides or []))
    try:
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
    "wandb.",
    "save_interval",
    "keep_checkpoints",
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
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
