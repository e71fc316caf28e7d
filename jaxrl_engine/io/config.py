"""Typed configuration: a pydantic schema, YAML files, dotted overrides, clear errors.

The schema's defaults ARE the default run (PPO on CartPole-v1), so `jaxrl-engine train` with no
file needs nothing on disk; `configs/ppo_cartpole.yaml` spells the same values out.
Unknown keys, wrong types and out-of-range values raise `ConfigError` naming the key and the
valid choices, before anything is compiled.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class ConfigError(ValueError):
    """Bad configuration: the message names the key and what would be valid."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class EnvConfig(_Strict):
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


class EvalConfig(_Strict):
    num_envs: int = Field(16, gt=0, description="episodes per evaluation (one per env)")
    interval: int = Field(10, gt=0, description="evaluate every this many epochs (and at the end)")
    env_params: dict[str, float | int | bool] = Field(
        default_factory=dict,
        description="env param overrides for evaluation only (an out-of-distribution test set)",
    )


class TorchPolicyConfig(_Strict):
    """A torch nn.Module as PPO's policy (needs the `torch` extra); see jaxrl_engine.interop."""

    factory: str = Field(
        "jaxrl_engine.interop.torch_nets:mlp",
        description="'module:function' building the nn.Module: f(in_shape, out_dim, out_scale, **kwargs)",
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="keyword arguments of the factory (the built-in mlp defaults to algo.hidden_sizes/activation)",
    )
    path: Literal["fast", "universal"] = Field(
        "fast",
        description="fast: weights bridged into native JAX ops; universal: any module via callback",
    )
    critic: Literal["jax", "torch"] = Field(
        "jax", description="value network: a flax MLP, or a second module from the factory"
    )
    learner: Literal["jax", "torch"] = Field(
        "jax",
        description="jax: optax trains the weights; torch: a torch optimizer (train in torch, act in JAX)",
    )
    acting_dtype: Literal["float32", "bfloat16", "float16"] | None = Field(
        None, description="dtype of the acting copy sync_weights makes (null: as trained)"
    )
    torch_seed: int = Field(0, ge=0, description="torch.manual_seed before the factory runs")

    @model_validator(mode="after")
    def _torch_learner_needs_torch_critic(self) -> TorchPolicyConfig:
        if self.learner == "torch" and self.critic != "torch":
            raise ValueError("learner=torch trains both networks in torch: set critic: torch")
        return self


class PPOConfig(_Strict):
    name: Literal["ppo"] = "ppo"
    num_steps: int = Field(128, gt=0, description="rollout steps per env per epoch")
    update_epochs: int = Field(4, gt=0, description="passes over the rollout per epoch")
    num_minibatches: int = Field(4, gt=0, description="minibatches per pass")
    lr: float = Field(5e-4, gt=0, description="Adam learning rate")
    anneal_lr: bool = Field(True, description="anneal the learning rate linearly to 0")
    gamma: float = Field(0.99, gt=0, le=1, description="discount")
    gae_lambda: float = Field(0.95, ge=0, le=1, description="GAE lambda")
    clip_eps: float = Field(0.2, gt=0, description="PPO ratio (and value) clip")
    ent_coef: float = Field(0.01, ge=0, description="entropy bonus coefficient")
    vf_coef: float = Field(0.5, ge=0, description="value loss coefficient")
    max_grad_norm: float = Field(0.5, gt=0, description="global gradient-norm clip")
    hidden_sizes: list[Annotated[int, Field(gt=0)]] = Field(
        default_factory=lambda: [64, 64], description="MLP widths (actor and critic)"
    )
    activation: Literal["tanh", "relu", "gelu", "silu"] = "tanh"
    normalize_obs: bool = Field(False, description="running mean/std observation normalisation")
    normalize_reward: bool = Field(False, description="scale rewards by the return's running std")
    torch_policy: TorchPolicyConfig | None = Field(
        None, description="act with a torch nn.Module (fast or universal path); null: flax MLPs"
    )


class _OffPolicyConfig(_Strict):
    """Replay buffer, sampling, warm-up and the asynchronous schedule (DQN and SAC)."""

    num_steps: int = Field(16, gt=0, description="rollout steps per env per epoch")
    gamma: float = Field(0.99, gt=0, le=1, description="discount")
    buffer_size: int = Field(
        50_000, gt=0, description="replay capacity in transitions (a multiple of env.num_envs)"
    )
    buffer_mode: Literal["circular", "fixed"] = Field(
        "circular", description="circular: overwrite the oldest; fixed: must hold the whole run"
    )
    batch_size: int = Field(128, gt=0, description="transitions per gradient step")
    learning_starts: int = Field(
        1_000, ge=0, description="transitions stored before training (random actions until then)"
    )
    train_ratio: float = Field(
        0.125,
        gt=0,
        description="gradient steps per env step (x num_steps * env.num_envs: a whole number)",
    )
    sync_every: int = Field(
        1, gt=0, description="refresh the acting weights every this many epochs (staleness bound)"
    )
    prioritized: bool = Field(False, description="prioritised replay (proportional)")
    priority_alpha: float = Field(0.6, ge=0, description="P(i) ~ priority**alpha")
    priority_beta: float = Field(0.4, ge=0, description="importance-weight exponent")
    priority_eps: float = Field(1e-6, gt=0, description="priority = |TD error| + eps")
    hidden_sizes: list[Annotated[int, Field(gt=0)]] = Field(
        default_factory=lambda: [64, 64], description="MLP widths"
    )
    activation: Literal["tanh", "relu", "gelu", "silu"] = "relu"


class DQNConfig(_OffPolicyConfig):
    name: Literal["dqn"] = "dqn"
    lr: float = Field(2.5e-4, gt=0, description="Adam learning rate")
    anneal_lr: bool = Field(False, description="anneal the learning rate linearly to 0")
    adam_eps: float = Field(1e-8, gt=0, description="Adam epsilon")
    max_grad_norm: float = Field(10.0, gt=0, description="global gradient-norm clip")
    double: bool = Field(True, description="double DQN: the online network picks a'")
    huber_delta: float = Field(1.0, gt=0, description="Huber loss threshold")
    tau: float = Field(1.0, gt=0, le=1, description="target update: 1 is a hard copy, <1 Polyak")
    target_update_interval: int = Field(
        500, gt=0, description="gradient steps between target updates"
    )
    epsilon_start: float = Field(1.0, ge=0, le=1, description="epsilon after warm-up")
    epsilon_end: float = Field(0.05, ge=0, le=1, description="final epsilon")
    exploration_fraction: float = Field(
        0.5, gt=0, le=1, description="fraction of the run over which epsilon decays"
    )


class SACConfig(_OffPolicyConfig):
    name: Literal["sac"] = "sac"
    train_ratio: float = Field(
        1.0,
        gt=0,
        description="gradient steps per env step (x num_steps * env.num_envs: a whole number)",
    )
    batch_size: int = Field(256, gt=0, description="transitions per gradient step")
    hidden_sizes: list[Annotated[int, Field(gt=0)]] = Field(
        default_factory=lambda: [256, 256], description="MLP widths (actor and both critics)"
    )
    actor_lr: float = Field(3e-4, gt=0, description="actor Adam learning rate")
    critic_lr: float = Field(3e-4, gt=0, description="critic Adam learning rate")
    alpha_lr: float = Field(3e-4, gt=0, description="entropy-temperature Adam learning rate")
    tau: float = Field(0.005, gt=0, le=1, description="Polyak rate of the target critics")
    init_alpha: float = Field(1.0, gt=0, description="initial entropy temperature")
    autotune: bool = Field(True, description="tune alpha towards target_entropy")
    target_entropy: float | None = Field(None, description="entropy target (null: -action_dim)")


AlgoConfig = Annotated[PPOConfig | DQNConfig | SACConfig, Field(discriminator="name")]
ALGO_CONFIGS: dict[str, type[BaseModel]] = {
    "ppo": PPOConfig,
    "dqn": DQNConfig,
    "sac": SACConfig,
}
ALGO_NAMES = set(ALGO_CONFIGS)


LoggerName = Literal["jsonl", "tensorboard", "wandb"]
DEFAULT_LOGGERS: tuple[LoggerName, ...] = ("jsonl", "tensorboard")


class WandbConfig(_Strict):
    """Weights & Biases settings, used when `loggers` lists wandb."""

    project: str = Field("jaxrl_engine", description="W&B project")
    entity: str | None = Field(None, description="W&B team or user (null: your default)")
    mode: Literal["online", "offline", "disabled"] = Field(
        "online", description="offline: write locally, `wandb sync` later"
    )


class Config(_Strict):
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
        algo = self.algo
        if isinstance(algo, PPOConfig):
            batch = algo.num_steps * self.env.num_envs
            if batch % algo.num_minibatches:
                raise ValueError(
                    f"algo.num_minibatches={algo.num_minibatches} must divide "
                    f"algo.num_steps * env.num_envs = {batch}"
                )
        if isinstance(algo, _OffPolicyConfig):
            self._check_replay(algo)
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

    def _check_replay(self, algo: _OffPolicyConfig) -> None:
        """Buffer and schedule sizes that would fail later, named by their keys now."""
        n = self.env.num_envs
        per_epoch = algo.num_steps * n
        if algo.buffer_size % n or algo.buffer_size < per_epoch:
            raise ValueError(
                f"algo.buffer_size={algo.buffer_size} must be a multiple of env.num_envs={n} "
                f"and at least algo.num_steps * env.num_envs = {per_epoch} (one rollout)"
            )
        grad_steps = algo.train_ratio * per_epoch
        if grad_steps < 1 or abs(grad_steps - round(grad_steps)) > 1e-6:
            raise ValueError(
                f"algo.train_ratio={algo.train_ratio} x algo.num_steps * env.num_envs "
                f"= {per_epoch} env steps per epoch must be a whole number >= 1 of gradient steps"
            )
        run_steps = -(-self.total_env_steps // per_epoch) * per_epoch
        if algo.buffer_mode == "fixed" and algo.buffer_size < run_steps:
            raise ValueError(
                f"algo.buffer_mode=fixed cannot hold the run: algo.buffer_size={algo.buffer_size}"
                f" < total_env_steps={self.total_env_steps} (rounded up to {run_steps}, whole "
                "epochs); raise algo.buffer_size or use algo.buffer_mode=circular"
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
            model = ALGO_CONFIGS.get(algo, PPOConfig)
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


def dump_config(cfg: Config) -> str:
    """The resolved config as YAML (what a run directory keeps)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
