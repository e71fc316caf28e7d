"""jaxrl_engine: a functional RL training engine in JAX.

Phases (rollout, evaluate, update_dataset, train, sync_weights) are pure jitted functions of
one `EngineState`; hooks are composable transforms of phases; algorithms are bundles of pure
functions with traced hyperparameters; `make_train(cfg)` is the whole training as one pure
function of a key and hyperparameters.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jaxrl_engine.compose import build, hparams, make_train, resume, resume_sweep, sweep
    from jaxrl_engine.core.engine import Engine
    from jaxrl_engine.core.hooks import Hook, chain, every
    from jaxrl_engine.core.nan_guard import NonFiniteError, nan_guard
    from jaxrl_engine.core.offload import offload_after, reload_before
    from jaxrl_engine.core.protocols import ActionSpec, Algorithm, Env, EnvSpec, Explore
    from jaxrl_engine.core.state import EngineState, Metrics, Phase
    from jaxrl_engine.core.timing import Timer, timed
    from jaxrl_engine.core.warm_up import ShapeMismatchError
    from jaxrl_engine.io.checkpoint import Checkpointer, CheckpointError
    from jaxrl_engine.io.config import Config, ConfigError, load_config, load_distributed
    from jaxrl_engine.policy import make_policy
    from jaxrl_engine.run import Driver, HostHook, RunInfo, TrainingInterrupted

# Imported on first use (PEP 562): `import jaxrl_engine` and the CLI's argument parsing stay
# fast, and JAX starts only when something needs it.
_SOURCES = {
    "build": "compose",
    "hparams": "compose",
    "make_train": "compose",
    "resume": "compose",
    "resume_sweep": "compose",
    "sweep": "compose",
    "Engine": "core.engine",
    "Hook": "core.hooks",
    "chain": "core.hooks",
    "every": "core.hooks",
    "NonFiniteError": "core.nan_guard",
    "nan_guard": "core.nan_guard",
    "offload_after": "core.offload",
    "reload_before": "core.offload",
    "ActionSpec": "core.protocols",
    "Algorithm": "core.protocols",
    "Env": "core.protocols",
    "EnvSpec": "core.protocols",
    "Explore": "core.protocols",
    "EngineState": "core.state",
    "Metrics": "core.state",
    "Phase": "core.state",
    "Timer": "core.timing",
    "timed": "core.timing",
    "ShapeMismatchError": "core.warm_up",
    "Checkpointer": "io.checkpoint",
    "CheckpointError": "io.checkpoint",
    "Config": "io.config",
    "ConfigError": "io.config",
    "load_config": "io.config",
    "load_distributed": "io.config",
    "make_policy": "policy",
    "Driver": "run",
    "HostHook": "run",
    "RunInfo": "run",
    "TrainingInterrupted": "run",
}


def __getattr__(name: str) -> Any:
    if name not in _SOURCES:
        raise AttributeError(f"module 'jaxrl_engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"jaxrl_engine.{_SOURCES[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_SOURCES])


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
    "Explore",
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
    "load_distributed",
    "make_policy",
    "make_train",
    "nan_guard",
    "offload_after",
    "reload_before",
    "resume",
    "resume_sweep",
    "sweep",
    "timed",
]
