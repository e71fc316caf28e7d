"""Algorithms as bundles of pure functions (`core.protocols.Algorithm`), registered by name.

`ALGORITHMS` (in `algos.configs`) maps `algo.name` to the algorithm's config class, which
builds it (`algos.base.AlgoConfig`). Adding an algorithm: its module (`HParams`, factory), its
config class in `algos/configs.py` with one line in `ALGORITHMS`, a config file and a test.

The config classes import without JAX; the `HParams` and factories below are imported on first
use (PEP 562), so `from jaxrl_engine.algos import ALGORITHMS` stays light.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

from jaxrl_engine.algos.configs import ALGORITHMS, DQNConfig, PPOConfig, SACConfig, TD3Config

if TYPE_CHECKING:
    from jaxrl_engine.algos.dqn import DQNHParams, dqn
    from jaxrl_engine.algos.ppo import PPOHParams, ppo
    from jaxrl_engine.algos.sac import SACHParams, sac
    from jaxrl_engine.algos.td3 import TD3HParams, td3

_SOURCES = {
    "DQNHParams": "dqn",
    "dqn": "dqn",
    "PPOHParams": "ppo",
    "ppo": "ppo",
    "SACHParams": "sac",
    "sac": "sac",
    "TD3HParams": "td3",
    "td3": "td3",
}


def __getattr__(name: str) -> Any:
    if name not in _SOURCES:
        raise AttributeError(f"module 'jaxrl_engine.algos' has no attribute {name!r}")
    return getattr(importlib.import_module(f"jaxrl_engine.algos.{_SOURCES[name]}"), name)


class _Package(types.ModuleType):
    """`algos.ppo` is the factory `ppo`, not its module: importing a submodule sets the
    package's attribute of that name to the module, which this turns into the factory (the
    module stays `sys.modules["jaxrl_engine.algos.ppo"]`)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and _SOURCES.get(name) == name:
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


__all__ = [
    "ALGORITHMS",
    "DQNConfig",
    "DQNHParams",
    "PPOConfig",
    "PPOHParams",
    "SACConfig",
    "SACHParams",
    "TD3Config",
    "TD3HParams",
    "dqn",
    "ppo",
    "sac",
    "td3",
]
