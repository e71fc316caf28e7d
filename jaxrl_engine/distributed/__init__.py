"""Scale beyond one compiled program: multi-process jobs (`join`, `jax.distributed`) and the
actor-learner split (`run_split`)."""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jaxrl_engine.distributed.multihost import join
    from jaxrl_engine.distributed.split import run_split

__all__ = ["join", "run_split"]
_SOURCES = {"join": "multihost", "run_split": "split"}


def __getattr__(name: str) -> Any:  # imported on first use: the CLI joins a job before JAX starts
    if name not in _SOURCES:
        raise AttributeError(f"module 'jaxrl_engine.distributed' has no attribute {name!r}")
    return getattr(importlib.import_module(f"jaxrl_engine.distributed.{_SOURCES[name]}"), name)
