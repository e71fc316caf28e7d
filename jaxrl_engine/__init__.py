"""jaxrl_engine: a functional RL training engine in JAX.

Phases (rollout, evaluate, update_dataset, train, sync_weights) are pure jitted functions of
one `EngineState`; hooks are composable transforms of phases; `make_train(cfg)` is the whole
training as one pure function of a key.
"""

from jaxrl_engine.core.driver import TrainingInterrupted, resume
from jaxrl_engine.core.engine import Engine, ShapeMismatchError, build
from jaxrl_engine.core.hooks import (
    Hook,
    NonFiniteError,
    Timer,
    chain,
    every,
    nan_guard,
    offload_after,
    reload_before,
    timed,
)
from jaxrl_engine.core.state import EngineState, Metrics, Phase
from jaxrl_engine.core.train import make_train
from jaxrl_engine.io.checkpoint import Checkpointer, CheckpointError
from jaxrl_engine.io.config import Config, ConfigError, load_config

__all__ = [
    "CheckpointError",
    "Checkpointer",
    "Config",
    "ConfigError",
    "Engine",
    "EngineState",
    "Hook",
    "Metrics",
    "NonFiniteError",
    "Phase",
    "ShapeMismatchError",
    "Timer",
    "build",
    "chain",
    "every",
    "load_config",
    "make_train",
    "nan_guard",
    "offload_after",
    "reload_before",
    "resume",
    "timed",
    "TrainingInterrupted",
]
