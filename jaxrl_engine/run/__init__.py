"""The host side of a run: the driver loop, host hooks, signals and run directories."""

from jaxrl_engine.run.driver import Driver, TrainingInterrupted
from jaxrl_engine.run.host_hooks import HostHook, RunInfo

__all__ = ["Driver", "HostHook", "RunInfo", "TrainingInterrupted"]
