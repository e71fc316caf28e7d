"""The algorithms' config classes (`algo.*`) and their registry, without JAX.

`ALGORITHMS` maps `algo.name` to its config class; `io.config` builds the config's `algo` union
from it. Everything here (fields, defaults, validators, `check`) is pure Python, so that a
config error is answered before JAX, flax or optax is imported. The methods that need them
(`hparams`, `build`, `replay`) import their algorithm's module when called; the algorithm
modules re-export their config classes (`jaxrl_engine.algos.ppo.PPOConfig` is this one).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from jaxrl_engine.algos.torso import TORSO_DESCRIPTION, CNNConfig, ConvSpec, Torso, conv_spec
from jaxrl_engine.io.schema import Strict, check_int32_count, run_epochs

if TYPE_CHECKING:
    from jaxrl_engine.algos.dqn import DQNHParams
    from jaxrl_engine.algos.off_policy import Replay
    from jaxrl_engine.algos.ppo import PPOHParams
    from jaxrl_engine.algos.sac import SACHParams
    from jaxrl_engine.algos.td3 import TD3HParams
    from jaxrl_engine.core.protocols import Algorithm, EnvSpec


def minibatch_size(num_steps: int, num_envs: int, num_minibatches: int) -> int:
    """Transitions per minibatch; ValueError (naming the config keys) when it is not whole."""
    batch = num_steps * num_envs
    if batch % num_minibatches:
        raise ValueError(
            f"algo.num_minibatches={num_minibatches} must divide "
            f"algo.num_steps * env.num_envs = {batch}"
        )
    return batch // num_minibatches


class TorchPolicyConfig(Strict):
    """A torch nn.Module as PPO's policy (needs the `torch` extra); see jaxrl_engine.interop."""

    factory: str = Field(
        "jaxrl_engine.interop.torch_nets:mlp",
        description="'module:function' (installed, or a module in the current directory) or "
        "'path/to/file.py:function', building the nn.Module: f(in_shape, out_dim, out_scale, "
        "**kwargs)",
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
    obs_layout: Literal["hwc", "chw"] | None = Field(
        None,
        description="axis order of image observations, passed to factories that take "
        "obs_layout (torch_nets:cnn); null: the env's (gymnax, gymnasium: hwc; EnvPool: chw); "
        "one that contradicts the env's is refused",
    )

    @model_validator(mode="after")
    def _torch_learner_needs_torch_critic(self) -> TorchPolicyConfig:
        if self.learner == "torch" and self.critic != "torch":
            raise ValueError("learner=torch trains both networks in torch: set critic: torch")
        return self


class PPOConfig(Strict):
    action_space: ClassVar[str] = "any"  # discrete or continuous
    # The `algo.*` keys that are `PPOHParams` leaves (traced: a sweep vmaps over them); every
    # other key is static (it changes shapes or the compiled program).
    traced_keys: ClassVar[frozenset[str]] = frozenset(
        {"lr", "gamma", "gae_lambda", "clip_eps", "ent_coef", "vf_coef", "max_grad_norm"}
    )

    # Keys whose change on resume would make the trained params mean something else (no shape
    # changes, so the checkpoint's layout check would let it through): refused then.
    trained_with_keys: ClassVar[frozenset[str]] = frozenset(
        {"activation", "normalize_obs", "normalize_reward"}
    )

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
    torso: Torso = Field("auto", description=TORSO_DESCRIPTION)
    cnn: CNNConfig = Field(default_factory=CNNConfig)
    normalize_obs: bool = Field(False, description="running mean/std observation normalisation")
    normalize_reward: bool = Field(False, description="scale rewards by the return's running std")
    torch_policy: TorchPolicyConfig | None = Field(
        None,
        description="act with a torch nn.Module (fast or universal path); null: the flax networks",
    )

    def check(self, num_envs: int, total_env_steps: int) -> None:
        """Minibatches that divide the rollout; a run's gradient steps that fit int32."""
        minibatch_size(self.num_steps, num_envs, self.num_minibatches)
        epochs = run_epochs(total_env_steps, self.num_steps, num_envs)
        check_int32_count(
            "the run's gradient steps: epochs (total_env_steps / (algo.num_steps * "
            f"env.num_envs), rounded up: {epochs}) * algo.update_epochs * algo.num_minibatches",
            epochs * self.update_epochs * self.num_minibatches,
        )

    def check_observations(self, spec: EnvSpec) -> None:
        """ValueError naming algo.torso / algo.cnn.* when the torso does not fit the env (not
        checked when both networks come from a torch factory: no flax torso is built, as
        algo.cnn.* is not read with algo.torso=mlp)."""
        if self.torch_policy is None or self.torch_policy.critic != "torch":
            self.conv(spec)

    def conv(self, spec: EnvSpec) -> ConvSpec | None:
        """The CNN torso's conv layers for `spec` (None: MLPs alone), from algo.torso/cnn."""
        return conv_spec(self.torso, self.cnn, spec)

    def run_length_schedules(self) -> list[str]:
        """What is scheduled over the run's env steps (a resume to another total stretches it)."""
        return ["the learning rate (algo.anneal_lr)"] if self.anneal_lr else []

    def hparams(self, spec: EnvSpec) -> PPOHParams:
        from jaxrl_engine.algos.ppo import PPOHParams

        return PPOHParams(
            lr=self.lr,
            gamma=self.gamma,
            gae_lambda=self.gae_lambda,
            clip_eps=self.clip_eps,
            ent_coef=self.ent_coef,
            vf_coef=self.vf_coef,
            max_grad_norm=self.max_grad_norm,
        )

    def build(
        self, spec: EnvSpec, num_envs: int, num_epochs: int, network: Any = None
    ) -> Algorithm:
        """network: an injected actor-critic; default the flax `ActorCritic` (with the CNN
        torso that `algo.torso` chooses)."""
        import numpy as np

        from jaxrl_engine.algos.networks import ActorCritic
        from jaxrl_engine.algos.ppo import ppo

        if network is None:
            network = ActorCritic(
                action_dim=int(spec.action.num_actions or np.prod(spec.action.shape)),
                discrete=spec.action.discrete,
                hidden_sizes=tuple(self.hidden_sizes),
                activation=self.activation,
                conv=self.conv(spec),
            )
        return ppo(
            network,
            spec,
            num_envs=num_envs,
            num_steps=self.num_steps,
            num_epochs=num_epochs,
            update_epochs=self.update_epochs,
            num_minibatches=self.num_minibatches,
            anneal_lr=self.anneal_lr,
            normalize_obs=self.normalize_obs,
            normalize_reward=self.normalize_reward,
            hparams=self.hparams(spec),
        )


def run_grad_steps(epochs: int, per_epoch: int, learning_starts: int, grad_steps: int) -> int:
    """An off-policy run's gradient steps: those of the epochs from the one whose rollout
    brings the buffer to `learning_starts` transitions on (that epoch's train learns)."""
    first = max(-(-learning_starts // per_epoch), 1)
    return max(epochs - first + 1, 0) * grad_steps


def grad_steps_per_epoch(train_ratio: float, num_steps: int, num_envs: int) -> int:
    """round(train_ratio * num_steps * num_envs); the config checks it is a whole number >= 1."""
    return round(train_ratio * num_steps * num_envs)


class OffPolicyConfig(Strict):
    """Replay buffer, sampling, warm-up and the asynchronous schedule (DQN, SAC, TD3)."""

    # (as PPOConfig's)
    trained_with_keys: ClassVar[frozenset[str]] = frozenset({"activation"})

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
        1_000,
        ge=0,
        description="env steps (over all envs) before training starts; random actions until then",
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
    priority_beta: float = Field(
        0.4, ge=0, description="importance-weight exponent beta at env step 0"
    )
    priority_beta_end: float = Field(
        1.0,
        ge=0,
        description="beta at the run's last env step (linear from algo.priority_beta; "
        "Schaul et al. anneal it to 1)",
    )
    priority_eps: float = Field(1e-6, gt=0, description="priority = |TD error| + eps")
    hidden_sizes: list[Annotated[int, Field(gt=0)]] = Field(
        default_factory=lambda: [64, 64], description="MLP widths"
    )
    activation: Literal["tanh", "relu", "gelu", "silu"] = "relu"

    def check(self, num_envs: int, total_env_steps: int) -> None:
        """Buffer and schedule sizes that would fail later, named by their keys now."""
        n = num_envs
        per_epoch = self.num_steps * n
        if self.buffer_size % n or self.buffer_size < per_epoch:
            raise ValueError(
                f"algo.buffer_size={self.buffer_size} must be a multiple of env.num_envs={n} "
                f"and at least algo.num_steps * env.num_envs = {per_epoch} (one rollout)"
            )
        if self.batch_size > self.buffer_size:
            raise ValueError(
                f"algo.batch_size={self.batch_size} is larger than algo.buffer_size="
                f"{self.buffer_size}: each gradient step samples its batch from the buffer"
            )
        grad_steps = self.train_ratio * per_epoch
        if grad_steps < 1 or abs(grad_steps - round(grad_steps)) > 1e-6:
            raise ValueError(
                f"algo.train_ratio={self.train_ratio} x algo.num_steps * env.num_envs "
                f"= {per_epoch} env steps per epoch must be a whole number >= 1 of gradient steps"
            )
        epochs = run_epochs(total_env_steps, self.num_steps, n)
        check_int32_count(
            "the run's gradient steps: epochs (total_env_steps / (algo.num_steps * "
            f"env.num_envs), rounded up: {epochs}) * algo.train_ratio * algo.num_steps * "
            "env.num_envs",
            epochs * round(grad_steps),
        )
        run_steps = epochs * per_epoch
        if self.learning_starts >= run_steps:
            raise ValueError(
                f"algo.learning_starts={self.learning_starts} >= total_env_steps="
                f"{total_env_steps} (rounded up to {run_steps}, whole epochs): the run would "
                "never train; lower algo.learning_starts or raise total_env_steps"
            )
        if self.buffer_mode == "fixed" and self.buffer_size < run_steps:
            raise ValueError(
                f"algo.buffer_mode=fixed cannot hold the run: algo.buffer_size={self.buffer_size}"
                f" < total_env_steps={total_env_steps} (rounded up to {run_steps}, whole "
                "epochs); raise algo.buffer_size or use algo.buffer_mode=circular"
            )
        most = run_grad_steps(epochs, per_epoch, self.learning_starts, round(grad_steps))
        for key, interval, what in self.step_intervals():
            if interval > most:  # a smoke run may mean it: said, not refused
                warnings.warn(
                    f"algo.{key}={interval} > the run's {most} gradient steps (the epochs "
                    f"after algo.learning_starts={self.learning_starts} x algo.train_ratio * "
                    f"algo.num_steps * env.num_envs): {what} will never be updated; lower "
                    f"algo.{key} or raise total_env_steps",
                    stacklevel=2,
                )

    def run_length_schedules(self) -> list[str]:
        """What is scheduled over the run's env steps (a resume to another total stretches it)."""
        return ["beta (algo.priority_beta_end)"] if self.prioritized else []

    def step_intervals(self) -> list[tuple[str, int, str]]:
        """(key, interval in gradient steps, what it updates) the run must reach at least once."""
        return []

    def replay(self, num_envs: int, num_epochs: int) -> Replay:
        """The static replay schedule of this config for `num_envs` envs and the run length."""
        from jaxrl_engine.algos.off_policy import Replay

        grad_steps = grad_steps_per_epoch(self.train_ratio, self.num_steps, num_envs)
        if grad_steps < 1:
            raise ValueError(
                f"algo.train_ratio={self.train_ratio} gives no gradient step per epoch of "
                f"algo.num_steps * env.num_envs = {self.num_steps * num_envs} env steps"
            )
        return Replay(
            num_envs=num_envs,
            num_steps=self.num_steps,
            num_epochs=num_epochs,
            capacity_per_env=self.buffer_size // num_envs,
            grad_steps=grad_steps,
            batch_size=self.batch_size,
            learning_starts=self.learning_starts,
            sync_every=self.sync_every,
            mode=self.buffer_mode,
            prioritized=self.prioritized,
        )


class ContinuousOffPolicyConfig(OffPolicyConfig):
    """The sizes SAC and TD3 share: a gradient step per env step, 256-wide networks."""

    action_space: ClassVar[str] = "continuous"

    train_ratio: float = Field(
        1.0,
        gt=0,
        description="gradient steps per env step (x num_steps * env.num_envs: a whole number)",
    )
    batch_size: int = Field(256, gt=0, description="transitions per gradient step")
    hidden_sizes: list[Annotated[int, Field(gt=0)]] = Field(
        default_factory=lambda: [256, 256], description="MLP widths (actor and both critics)"
    )


class DQNConfig(OffPolicyConfig):
    action_space: ClassVar[str] = "discrete"
    # The `algo.*` keys that are `DQNHParams` leaves (traced); every other key is static.
    traced_keys: ClassVar[frozenset[str]] = frozenset(
        {
            "lr",
            "gamma",
            "tau",
            "huber_delta",
            "max_grad_norm",
            "adam_eps",
            "epsilon_start",
            "epsilon_end",
            "exploration_fraction",
            "priority_alpha",
            "priority_beta",
            "priority_beta_end",
            "priority_eps",
        }
    )

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
    epsilon_start: float = Field(
        1.0,
        ge=0,
        le=1,
        description="epsilon at env step 0 of its linear decay (1 before algo.learning_starts)",
    )
    epsilon_end: float = Field(0.05, ge=0, le=1, description="final epsilon")
    exploration_fraction: float = Field(
        0.5,
        gt=0,
        le=1,
        description="epsilon decays linearly from env step 0 to this fraction of the run",
    )
    torso: Torso = Field("auto", description=TORSO_DESCRIPTION)
    cnn: CNNConfig = Field(default_factory=CNNConfig)

    def check_observations(self, spec: EnvSpec) -> None:
        """ValueError naming algo.torso / algo.cnn.* when the torso does not fit the env."""
        conv_spec(self.torso, self.cnn, spec)

    def run_length_schedules(self) -> list[str]:
        lr = ["the learning rate (algo.anneal_lr)"] if self.anneal_lr else []
        return ["epsilon (algo.exploration_fraction)", *lr, *super().run_length_schedules()]

    def step_intervals(self) -> list[tuple[str, int, str]]:
        return [("target_update_interval", self.target_update_interval, "the target network")]

    def hparams(self, spec: EnvSpec) -> DQNHParams:
        from jaxrl_engine.algos.dqn import DQNHParams

        return DQNHParams(
            lr=self.lr,
            gamma=self.gamma,
            tau=self.tau,
            huber_delta=self.huber_delta,
            max_grad_norm=self.max_grad_norm,
            adam_eps=self.adam_eps,
            epsilon_start=self.epsilon_start,
            epsilon_end=self.epsilon_end,
            exploration_fraction=self.exploration_fraction,
            priority_alpha=self.priority_alpha,
            priority_beta=self.priority_beta,
            priority_beta_end=self.priority_beta_end,
            priority_eps=self.priority_eps,
        )

    def build(
        self, spec: EnvSpec, num_envs: int, num_epochs: int, network: Any = None
    ) -> Algorithm:
        from jaxrl_engine.algos.dqn import dqn
        from jaxrl_engine.algos.networks import torso_network

        if network is None:
            network = torso_network(
                conv_spec(self.torso, self.cnn, spec),
                self.hidden_sizes,
                int(spec.action.num_actions or 0),
                self.activation,
            )
        return dqn(
            network,
            spec,
            self.replay(num_envs, num_epochs),
            num_steps=self.num_steps,
            double=self.double,
            target_update_interval=self.target_update_interval,
            anneal_lr=self.anneal_lr,
            hparams=self.hparams(spec),
        )


class SACConfig(ContinuousOffPolicyConfig):
    # The `algo.*` keys that are `SACHParams` leaves (traced); every other key is static.
    traced_keys: ClassVar[frozenset[str]] = frozenset(
        {
            "actor_lr",
            "critic_lr",
            "alpha_lr",
            "gamma",
            "tau",
            "init_alpha",
            "target_entropy",
            "priority_alpha",
            "priority_beta",
            "priority_beta_end",
            "priority_eps",
        }
    )

    name: Literal["sac"] = "sac"
    actor_lr: float = Field(3e-4, gt=0, description="actor Adam learning rate")
    critic_lr: float = Field(3e-4, gt=0, description="critic Adam learning rate")
    alpha_lr: float = Field(3e-4, gt=0, description="entropy-temperature Adam learning rate")
    tau: float = Field(0.005, gt=0, le=1, description="Polyak rate of the target critics")
    init_alpha: float = Field(1.0, gt=0, description="initial entropy temperature")
    # Keys only `init` reads (a resume keeps the checkpoint's trained value): not overridable.
    init_only_keys: ClassVar[frozenset[str]] = frozenset({"init_alpha"})
    autotune: bool = Field(True, description="tune alpha towards target_entropy")
    target_entropy: float | None = Field(None, description="entropy target (null: -action_dim)")

    def hparams(self, spec: EnvSpec) -> SACHParams:
        import numpy as np

        from jaxrl_engine.algos.sac import SACHParams

        target = self.target_entropy
        return SACHParams(
            actor_lr=self.actor_lr,
            critic_lr=self.critic_lr,
            alpha_lr=self.alpha_lr,
            gamma=self.gamma,
            tau=self.tau,
            init_alpha=self.init_alpha,
            target_entropy=-float(np.prod(spec.action.shape)) if target is None else target,
            priority_alpha=self.priority_alpha,
            priority_beta=self.priority_beta,
            priority_beta_end=self.priority_beta_end,
            priority_eps=self.priority_eps,
        )

    def build(
        self, spec: EnvSpec, num_envs: int, num_epochs: int, network: Any = None
    ) -> Algorithm:
        """network: an injected (actor, critic) pair; default MLPs of `hidden_sizes`."""
        import numpy as np

        from jaxrl_engine.algos.networks import MLP
        from jaxrl_engine.algos.sac import Critic, sac

        hidden = tuple(self.hidden_sizes)
        action_dim = int(np.prod(spec.action.shape))
        actor, critic = network or (
            MLP(hidden, 2 * action_dim, self.activation),
            Critic(hidden, self.activation),
        )
        return sac(
            actor,
            critic,
            spec,
            self.replay(num_envs, num_epochs),
            autotune=self.autotune,
            hparams=self.hparams(spec),
        )


class TD3Config(ContinuousOffPolicyConfig):
    # The `algo.*` keys that are `TD3HParams` leaves (traced); every other key is static.
    traced_keys: ClassVar[frozenset[str]] = frozenset(
        {
            "actor_lr",
            "critic_lr",
            "gamma",
            "tau",
            "exploration_noise",
            "policy_noise",
            "noise_clip",
            "ou_theta",
            "ou_dt",
            "priority_alpha",
            "priority_beta",
            "priority_beta_end",
            "priority_eps",
        }
    )

    name: Literal["td3"] = "td3"
    actor_lr: float = Field(1e-3, gt=0, description="actor Adam learning rate")
    critic_lr: float = Field(1e-3, gt=0, description="critic Adam learning rate")
    tau: float = Field(0.005, gt=0, le=1, description="Polyak rate of the target actor and critics")
    exploration_noise: float = Field(
        0.1, ge=0, description="std of the Gaussian acting noise, in [-1, 1] action units"
    )
    noise: Literal["gaussian", "ou"] = Field(
        "gaussian",
        description="rollout's acting noise: independent per step, or an Ornstein-Uhlenbeck "
        "process per env (sigma exploration_noise; temporally correlated, for sparse rewards)",
    )
    ou_theta: float = Field(0.15, ge=0, description="OU noise: mean reversion rate (noise=ou)")
    ou_dt: float = Field(1e-2, gt=0, description="OU noise: time step (noise=ou)")
    policy_noise: float = Field(
        0.2, ge=0, description="std of the target policy smoothing noise, in [-1, 1] units"
    )
    noise_clip: float = Field(0.5, ge=0, description="target smoothing noise clipped to +-this")
    policy_delay: int = Field(
        2, gt=0, description="gradient steps per actor and target update (delayed updates)"
    )

    def step_intervals(self) -> list[tuple[str, int, str]]:
        return [("policy_delay", self.policy_delay, "the actor and the target networks")]

    def hparams(self, spec: EnvSpec) -> TD3HParams:
        from jaxrl_engine.algos.td3 import TD3HParams

        return TD3HParams(
            actor_lr=self.actor_lr,
            critic_lr=self.critic_lr,
            gamma=self.gamma,
            tau=self.tau,
            exploration_noise=self.exploration_noise,
            policy_noise=self.policy_noise,
            noise_clip=self.noise_clip,
            ou_theta=self.ou_theta,
            ou_dt=self.ou_dt,
            priority_alpha=self.priority_alpha,
            priority_beta=self.priority_beta,
            priority_beta_end=self.priority_beta_end,
            priority_eps=self.priority_eps,
        )

    def build(
        self, spec: EnvSpec, num_envs: int, num_epochs: int, network: Any = None
    ) -> Algorithm:
        """network: an injected (actor, critic) pair; default MLPs of `hidden_sizes`."""
        import numpy as np

        from jaxrl_engine.algos.networks import MLP
        from jaxrl_engine.algos.sac import Critic
        from jaxrl_engine.algos.td3 import td3

        hidden = tuple(self.hidden_sizes)
        action_dim = int(np.prod(spec.action.shape))
        actor, critic = network or (
            MLP(hidden, action_dim, self.activation),
            Critic(hidden, self.activation),
        )
        return td3(
            actor,
            critic,
            spec,
            self.replay(num_envs, num_epochs),
            policy_delay=self.policy_delay,
            noise=self.noise,
            hparams=self.hparams(spec),
        )


ALGORITHMS: dict[str, type] = {
    "ppo": PPOConfig,
    "dqn": DQNConfig,
    "sac": SACConfig,
    "td3": TD3Config,
}
