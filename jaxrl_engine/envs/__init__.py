"""Environments: the gymnax 1.0 protocol, its adapter, and the specs phases are built from."""

from jaxrl_engine.envs.gymnax_env import GymnaxEnv, available_env_ids, make_env
from jaxrl_engine.envs.protocol import ActionSpec, Env, EnvSpec

__all__ = ["ActionSpec", "Env", "EnvSpec", "GymnaxEnv", "available_env_ids", "make_env"]
