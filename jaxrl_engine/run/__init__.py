"""The host side of a run: the driver loop, host hooks, signals and run directories."""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jaxrl_engine.run.driver import Driver, TrainingInterrupted
    from jaxrl_engine.run.host_hooks import HostHook, RunInfo

__all__ = ["Driver", "HostHook", "RunInfo", "TrainingInterrupted"]
_SOURCES = {
    "Driver": "driver",
    "TrainingInterrupted": "driver",
    "HostHook": "host_hooks",
    "RunInfo": "host_hooks",
}


def __getattr__(name: str) -> Any:  # imported on first use: `run.signals` stays light for the CLI
    if name not in _SOURCES:
        raise AttributeError(f"module 'jaxrl_engine.run' has no attribute {name!r}")
    return getattr(importlib.import_module(f"jaxrl_engine.run.{_SOURCES[name]}"), name)
