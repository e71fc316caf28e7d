"""Algorithms: each supplies networks, `act`, `update_dataset` and `train` (see `base.Algorithm`)."""

from __future__ import annotations

from typing import Any

from jaxrl_engine.algos.base import Algorithm
from jaxrl_engine.algos.dqn import DQN
from jaxrl_engine.algos.ppo import PPO
from jaxrl_engine.algos.sac import SAC
from jaxrl_engine.envs.protocol import EnvSpec

ALGORITHMS: dict[str, Any] = {"ppo": PPO, "dqn": DQN, "sac": SAC}


def make_algorithm(algo_cfg: Any, spec: EnvSpec, num_envs: int, num_epochs: int) -> Algorithm:
    """The algorithm named by `algo_cfg.name`, built for this env spec and run length."""
    return ALGORITHMS[algo_cfg.name](algo_cfg, spec, num_envs, num_epochs)


__all__ = ["ALGORITHMS", "DQN", "PPO", "SAC", "Algorithm", "make_algorithm"]
