"""Environments: adapters to the gymnax 1.0 protocol (`core.protocols.Env`)."""

from typing import Any

from jaxrl_engine.envs.gymnax_env import GymnaxEnv, available_env_ids, make_env


def make_jax_env(suite: str, env_id: str, params: dict[str, Any] | None = None) -> Any:
    """The env of a suite stepped inside XLA (gymnax, Brax): `GymnaxEnv` or `BraxEnv`, both
    with `params` and `with_params(params, overrides)` for the evaluation overrides.

    Brax is imported only when asked for: it is an optional extra and takes seconds to import.
    """
    if suite == "brax":
        from jaxrl_engine.envs.brax_env import BraxEnv

        return BraxEnv(env_id, params)
    return make_env(env_id, params)


__all__ = ["GymnaxEnv", "available_env_ids", "make_env", "make_jax_env"]
