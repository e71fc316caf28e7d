"""Algorithms as bundles of pure functions (`core.protocols.Algorithm`), registered by name.

`ALGORITHMS` maps `algo.name` to the algorithm's config class, which builds it
(`algos.base.AlgoConfig`). Adding an algorithm: its module (config class, `HParams`, factory),
one line here, a config file and a test.
"""

from __future__ import annotations

from jaxrl_engine.algos.dqn import DQNConfig, DQNHParams, dqn
from jaxrl_engine.algos.ppo import PPOConfig, PPOHParams, ppo
from jaxrl_engine.algos.sac import SACConfig, SACHParams, sac
from jaxrl_engine.algos.td3 import TD3Config, TD3HParams, td3

ALGORITHMS: dict[str, type] = {
    "ppo": PPOConfig,
    "dqn": DQNConfig,
    "sac": SACConfig,
    "td3": TD3Config,
}

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
