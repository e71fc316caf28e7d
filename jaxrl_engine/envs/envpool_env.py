"""EnvPool (C++ vectorised envs, `pip install 'jaxrl-engine[envpool]'`) as a batched host env.

`EnvPoolEnv` is `GymnasiumEnv`'s design with an EnvPool pool in place of a gymnasium vector
env: an engine `Env` with `batched = True` whose `reset` and `step` (inherited: one ordered
host callback per step for the whole env batch) call `envpool.make(id, env_type="gymnasium",
num_envs=n, seed=...)`. The pool steps all its envs in C++ threads in one call, so the host
loop is not Python per env. Same train/eval env sets (`HostEnvParams`; `env.params` and
`eval.env_params` are `envpool.make` kwargs, e.g. `num_threads`, `max_episode_steps`,
`img_height`), same space mapping (`_space_spec`), same `host_error`.

Autoreset. EnvPool 1.2.5 has one mode, gymnasium's NEXT_STEP (`metadata["autoreset_mode"]`):
the step that ends an episode returns its last observation, and the env's next `step` ignores
its action and returns the first observation of a new episode (reward 0, terminated and
truncated False, `elapsed_step` 0); it has no SAME_STEP option. The engine needs SAME_STEP
(gymnax's and `GymnasiumEnv`'s view), so the adapter makes it: after each `step`, the envs
that ended are reset at once with EnvPool's partial reset (`reset(env_id=ended)`, which runs
the same C++ `Reset()` the next-step autoreset would), their new first observations replace
theirs in `obs`, and the observations the step returned are `final_observation`. The pool's
own next-step reset then never fires (a reset env is not done), so no reset step enters the
trajectory. Cost: one extra pool call on the steps where some env ended.

Seeds: EnvPool fixes its seeds when a pool is made (env i gets `seed + i`;
`reset(seed=...)` is ignored), so `reset(key)` makes a fresh pool seeded by the key: the same
key gives the same first observations, as `GymnasiumEnv`'s `reset(seed=...)` does (making a
CartPole pool takes milliseconds; it happens once a run for training, once an evaluation).

EnvPool's async `send`/`recv` (batches of the envs that finished first) is not used: the
compiled rollout needs every env's observation at every step. Limits as `GymnasiumEnv`'s (the
pools' own state is not saved; one device; no sweeps).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from jaxrl_engine.envs.gymnasium_env import (
    DEFAULT_MAX_STEPS,
    GymnasiumEnv,
    HostEnvParams,
    _space_spec,
)

INSTALL_HINT = "pip install 'jaxrl-engine[envpool]'"
SEED_RANGE = 2**31 - 2**16  # EnvPool seeds are int32, env i's is `seed + i`


def envpool_ids() -> list[str]:
    """EnvPool's registered ids; ImportError naming the extra when envpool is not installed."""
    try:
        import envpool
    except ImportError as e:
        raise ImportError(f"env.suite=envpool needs envpool: {INSTALL_HINT} ({e})") from None
    return list(envpool.list_all_envs())


class EnvPoolEnv(GymnasiumEnv):
    """EnvPool `env_id` as a batched host env of `num_envs` training and `eval_envs`
    evaluation envs (see the module docstring); kwargs: `envpool.make` keyword arguments."""

    image_layout = "chw"  # EnvPool's image observations are channels first (Atari: [4, 84, 84])

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        eval_envs: int,
        kwargs: dict[str, Any] | None = None,
        *,
        eval_id: str | None = None,
        eval_kwargs: dict[str, Any] | None = None,
        offload: bool = False,
    ):
        self.env_id = env_id  # (no `vectorization`: the pool is EnvPool's own)
        self.sizes = {"train": num_envs, "eval": eval_envs}
        self.params = HostEnvParams("train", tuple(sorted((kwargs or {}).items())))
        self.obs_shape, self.obs_dtype, self.action, self.max_episode_steps = self._probe(
            env_id, self.params, "env.id"
        )
        self._host_init(eval_id, offload, eval_kwargs)

    def _probe(self, env_id: str, params: HostEnvParams, key: str) -> tuple[Any, ...]:
        if env_id not in envpool_ids():
            raise ValueError(f"{key}={env_id!r} is not an EnvPool id (envpool.list_all_envs())")
        probe = self._make(params, 1, seed=0, env_id=env_id)
        try:
            limit = int(probe.config["max_episode_steps"])
            # EnvPool says "no limit" with int32's maximum (e.g. Blackjack-v1).
            return (
                *_space_spec(env_id, probe.observation_space, probe.action_space, key),
                limit if 0 < limit < 2**31 - 1 else DEFAULT_MAX_STEPS,
            )
        finally:
            probe.close()

    def _make(
        self, params: HostEnvParams, num_envs: int, seed: int, env_id: str | None = None
    ) -> Any:
        import envpool

        env_id = env_id or self.id_of(params)
        try:
            pool = envpool.make(
                env_id,
                env_type="gymnasium",
                num_envs=num_envs,
                seed=seed,
                **dict(params.kwargs),
            )
        except Exception as e:  # bad kwargs (a TypeError naming the key), a failed asset
            raise ValueError(
                f"{'env.id' if env_id == self.env_id else 'eval.env_id'}={env_id} (suite envpool) "
                f"cannot be made: {type(e).__name__}: "
                f"{(str(e).splitlines() or [''])[0][:300]}"
            ) from None
        # The pool builds its gymnasium spaces (cached) on first use; gymnasium warns there
        # that EnvPool's float64 Box bounds are cast to float32: harmless, built here quietly.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", ".*precision lowered by casting", UserWarning)
            _ = pool.observation_space, pool.action_space
        return pool

    # ------------------------------------------------------------------------- host side
    def vector_env(self, params: HostEnvParams, seed: int = 0) -> Any:
        """The EnvPool pool of an env set (made on first use with `seed`)."""
        if self.offload:
            self._release_others(params)
        if params not in self._vec:
            self.rebuilds += params in self._released
            self._released.discard(params)
            self._vec[params] = self._make(params, self.sizes[params.role], seed)
            self._needs_reset[params] = True
        return self._vec[params]

    def _host_reset(self, params: HostEnvParams, key_data: np.ndarray) -> tuple[Any, Any]:
        old = self._vec.pop(params, None)
        if old is not None:
            old.close()
        seed = int(np.asarray(key_data).ravel()[-1]) % SEED_RANGE
        pool = self.vector_env(params, seed)
        obs, info = pool.reset()
        self._needs_reset[params] = False
        order = np.argsort(info["env_id"])
        return self._obs(obs[order]), np.zeros((self.sizes[params.role],), np.int32)

    def _host_step(self, params: HostEnvParams, action: np.ndarray) -> tuple[Any, ...]:
        n = self.sizes[params.role]
        if self._needs_reset.get(params, True):  # e.g. a resumed run: its episodes start afresh
            self._host_reset(params, self._restart_seed())
        pool = self._vec[params]
        obs, reward, terminated, truncated, info = pool.step(np.asarray(action))
        order = np.argsort(info["env_id"])  # sync mode answers in env order; made sure
        obs, reward = self._obs(obs[order]), np.asarray(reward[order], np.float32)
        terminated, truncated = (
            np.asarray(terminated[order], bool),
            np.asarray(truncated[order], bool),
        )
        final = obs
        ended = np.flatnonzero(terminated | truncated).astype(np.int32)
        if ended.size:  # SAME_STEP: the ended envs' next episodes start now
            first, reset_info = pool.reset(ended)
            obs = obs.copy()
            obs[np.asarray(reset_info["env_id"])] = self._obs(first)
        return obs, np.zeros((n,), np.int32), reward, terminated, truncated, final


def steps_per_second_of_random_policy(env: EnvPoolEnv, steps: int = 2000) -> float:
    """The training pool's own stepping rate under uniformly random actions (its NEXT_STEP
    autoreset, no adapter): the limit of any engine built on it; for benchmarks."""
    import time

    pool = env.vector_env(env.params)
    pool.reset()
    n = env.sizes["train"]
    space = pool.action_space
    batches = [np.stack([space.sample() for _ in range(n)]) for _ in range(16)]
    rounds = -(-steps // n)
    start = time.perf_counter()
    for i in range(rounds):
        pool.step(batches[i % len(batches)])
    return rounds * n / (time.perf_counter() - start)
