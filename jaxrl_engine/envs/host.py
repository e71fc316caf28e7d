"""The host env of a config (`env.suite: gymnasium | envpool`), made in one place for the
config's validation, `jre.build` and `jaxrl-engine eval`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jaxrl_engine.envs.gymnasium_env import GymnasiumEnv


def host_env(cfg: Any, num_envs: int, eval_envs: int, offload: bool | None = None) -> GymnasiumEnv:
    """`cfg.env`'s host env (cfg: a `Config`; envs/ does not import io/) with `num_envs` training and `eval_envs` evaluation envs (its
    `eval.env_id`, `eval.env_params` and, unless given, `offload`). The suites' packages are
    imported here, on use: neither is needed by a gymnax run."""
    kwargs: dict[str, Any] = {
        "eval_id": cfg.eval.env_id,
        "eval_kwargs": cfg.eval.env_params,
        "offload": cfg.offload if offload is None else offload,
    }
    if cfg.env.suite == "envpool":
        from jaxrl_engine.envs.envpool_env import EnvPoolEnv

        return EnvPoolEnv(cfg.env.id, num_envs, eval_envs, cfg.env.params, **kwargs)
    from jaxrl_engine.envs.gymnasium_env import GymnasiumEnv

    return GymnasiumEnv(
        cfg.env.id, num_envs, eval_envs, cfg.env.params, cfg.env.vectorization, **kwargs
    )
