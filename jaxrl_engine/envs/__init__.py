"""Environments: adapters to the gymnax 1.0 protocol (`core.protocols.Env`)."""

from jaxrl_engine.envs.gymnax_env import GymnaxEnv, available_env_ids, make_env

__all__ = ["GymnaxEnv", "available_env_ids", "make_env"]
