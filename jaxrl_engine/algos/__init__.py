"""Algorithms as bundles of pure functions (`core.protocols.Algorithm`), registered by name.

`ALGORITHMS` (in `algos.configs`) maps `algo.name` to the algorithm's config class, which
builds it (`algos.base.AlgoConfig`). Adding an algorithm: its module (`HParams`, factory), its
config class in `algos/configs.py` with one line in `ALGORITHMS`, a config file and a test.

The config classes import without JAX; the `HParams` below are imported on first use (PEP 562),
so `from jaxrl_engine.algos import ALGORITHMS` stays light. The factories are in their modules:
`from jaxrl_engine.algos.ppo import ppo`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from jaxrl_engine.algos.configs import ALGORITHMS, DQNConfig, PPOConfig, SACConfig, TD3Config

if TYPE_CHECKING:
    from jaxrl_engine.algos.dqn import DQNHParams
    from jaxrl_engine.algos.ppo import PPOHParams
    from jaxrl_engine.algos.sac import SACHParams
    from jaxrl_engine.algos.td3 import TD3HParams

_HPARAMS = {"DQNHParams": "dqn", "PPOHParams": "ppo", "SACHParams": "sac", "TD3HParams": "td3"}


def __getattr__(name: str) -> Any:
    if name not in _HPARAMS:
        raise AttributeError(f"module 'jaxrl_engine.algos' has no attribute {name!r}")
    return getattr(importlib.import_module(f"jaxrl_engine.algos.{_HPARAMS[name]}"), name)


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
]
