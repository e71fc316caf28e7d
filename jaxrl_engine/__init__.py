"""jaxrl_engine: a functional RL training engine in JAX.

Phases (rollout, evaluate, update_dataset, train, sync_weights) are pure jitted functions of
one `EngineState`; hooks are composable transforms of phases; algorithms are bundles of pure
functions with traced hyperparameters; `make_train(cfg)` is the whole training as one pure
function of a key and hyperparameters.
"""

from jaxrl_engine.compose import build, hparams, make_train, resume
from jaxrl_engine.core.engine import Engine
from jaxrl_engine.core.hooks import Hook, chain, every
from jaxrl_engine.core.nan_guard import NonFiniteError, nan_guard
from jaxrl_engine.core.offload import offload_after, reload_before
from jaxrl_engine.core.protocols import ActionSpec, Algorithm, Env, EnvSpec
from jaxrl_engine.core.state import EngineState, Metrics, Phase
from jaxrl_engine.core.timing import Timer, timed
from jaxrl_engine.core.warm_up import ShapeMismatchError
from jaxrl_engine.io.checkpoint import Checkpointer, CheckpointError
from jaxrl_engine.io.config import Config, ConfigError, load_config
from jaxrl_engine.policy import make_policy
from jaxrl_engine.run import Driver, HostHook, RunInfo, TrainingInterrupted

__all__ = [
    "ActionSpec",
    "Algorithm",
    "CheckpointError",
    "Checkpointer",
    "Config",
    "ConfigError",
    "Driver",
    "Engine",
    "EngineState",
    "Env",
    "EnvSpec",
    "Hook",
    "HostHook",
    "Metrics",
    "NonFiniteError",
    "Phase",
    "RunInfo",
    "ShapeMismatchError",
    "Timer",
    "TrainingInterrupted",
    "build",
    "chain",
    "every",
    "hparams",
    "load_config",
    "make_policy",
    "make_train",
    "nan_guard",
    "offload_after",
    "reload_before",
    "resume",
    "timed",
]
