"""Torch-tensor batch simulators (IsaacLab/ManiSkill style) in the engine, and a torch CartPole.

A simulator here has `num_envs`, `reset() -> obs [num_envs, *obs_shape]` and
`step(actions [num_envs, ...]) -> (obs, reward, terminated, truncated, info)`, all torch
tensors, auto-resetting finished envs with `info["final_observation"]` holding their last
observation (the gymnax convention the engine uses).

Such a simulator cannot run inside jit, so `TorchSimRollout` is a host loop around a jitted
policy step: observations cross torch -> JAX by DLPack (`from_torch`, zero-copy), actions cross
JAX -> torch the same way (`to_torch`). The jitted step returns its own copy of what the
trajectory keeps, so a simulator that overwrites its observation tensor in place (IsaacLab
does) cannot change a stored transition. The episode statistics are the JAX rollout's
(`episode_stats` over the trajectory: the same `rollout/*` metrics, and the running per-env
return and length in `state.stats`, so checkpoints carry them). The other phases are the
engine's own (jitted, hooked): `update_dataset`, `train`, `sync_weights`.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_engine.buffers.rollout import Transition
from jaxrl_engine.core.hooks import chain
from jaxrl_engine.core.nan_guard import check_guards
from jaxrl_engine.core.phases import EPOCH_PHASES, episode_stats, merge_metrics
from jaxrl_engine.core.protocols import EnvSpec
from jaxrl_engine.core.timing import timed
from jaxrl_engine.interop.dlpack import BridgeReport, from_torch, to_torch

if TYPE_CHECKING:
    import torch

    from jaxrl_engine.core.engine import Engine
    from jaxrl_engine.core.state import EngineState, EpisodeStats, Metrics


class TorchBatchSim(Protocol):
    num_envs: int
    obs_shape: tuple[int, ...]
    num_actions: int  # discrete actions

    def reset(self) -> torch.Tensor: ...

    def step(self, actions: torch.Tensor) -> tuple[Any, Any, Any, Any, dict[str, Any]]: ...


class TorchCartPole:
    """CartPole-v1 with gymnax's constants, vectorised over `num_envs` torch tensors.

    Reward 1 per step; terminated when the pole falls or the cart leaves the track; truncated
    at `max_steps`. obs: f32[num_envs, 4]; actions: int[num_envs] in {0, 1}.
    """

    obs_shape = (4,)
    num_actions = 2
    gravity, masscart, masspole, length = 9.8, 1.0, 0.1, 0.5
    force_mag, tau = 10.0, 0.02
    theta_threshold = 12 * 2 * math.pi / 360
    x_threshold = 2.4

    def __init__(self, num_envs: int, max_steps: int = 500, seed: int = 0, device: str = "cpu"):
        import torch

        self.num_envs, self.max_steps, self.device = num_envs, max_steps, device
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.state = torch.zeros((num_envs, 4), device=device)
        self.steps = torch.zeros((num_envs,), dtype=torch.int32, device=device)

    def _initial(self, n: int) -> torch.Tensor:
        import torch

        u = torch.rand((n, 4), generator=self.generator, device=self.device)
        return u * 0.1 - 0.05

    def reset(self) -> torch.Tensor:
        self.state = self._initial(self.num_envs)
        self.steps.zero_()
        return self.state.clone()

    def step(self, actions: torch.Tensor):
        import torch

        x, x_dot, theta, theta_dot = self.state.unbind(-1)
        force = torch.where(actions.reshape(-1) == 1, self.force_mag, -self.force_mag)
        total_mass = self.masscart + self.masspole
        polemass_length = self.masspole * self.length
        cos, sin = torch.cos(theta), torch.sin(theta)
        temp = (force + polemass_length * theta_dot**2 * sin) / total_mass
        theta_acc = (self.gravity * sin - cos * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * cos**2 / total_mass)
        )
        x_acc = temp - polemass_length * theta_acc * cos / total_mass
        x = x + self.tau * x_dot
        x_dot = x_dot + self.tau * x_acc
        theta = theta + self.tau * theta_dot
        theta_dot = theta_dot + self.tau * theta_acc
        final = torch.stack([x, x_dot, theta, theta_dot], -1)
        self.steps += 1
        terminated = (
            (x < -self.x_threshold)
            | (x > self.x_threshold)
            | (theta < -self.theta_threshold)
            | (theta > self.theta_threshold)
        )
        truncated = (self.steps >= self.max_steps) & ~terminated
        done = terminated | truncated
        reward = torch.ones((self.num_envs,), device=self.device)
        fresh = self._initial(self.num_envs)
        self.state = torch.where(done[:, None], fresh, final)
        self.steps = torch.where(done, 0, self.steps).to(torch.int32)
        return self.state.clone(), reward, terminated, truncated, {"final_observation": final}


def check_sim_obs(spec: EnvSpec, sim: TorchBatchSim, where: str, obs: Any) -> None:
    """ValueError unless `obs` is a tensor `[sim.num_envs, *obs_shape]` of the spec's dtype."""
    want = ((sim.num_envs, *spec.obs_shape), str(jax.dtypes.canonicalize_dtype(spec.obs_dtype)))
    got = (tuple(getattr(obs, "shape", ())), str(getattr(obs, "dtype", type(obs).__name__)))
    if (got[0], got[1].removeprefix("torch.")) != want:
        raise ValueError(
            f"torch simulator {type(sim).__name__}: {where} gives observations of shape "
            f"{list(got[0])} and dtype {got[1]}; the engine's env spec says {list(want[0])} "
            f"{want[1]} (num_envs x obs_shape, obs_dtype)"
        )


def check_sim_step(spec: EnvSpec, sim: TorchBatchSim, out: Any) -> None:
    """`sim.step`'s outputs are what the protocol says (module docstring), each one named."""
    name = type(sim).__name__
    if not (isinstance(out, tuple) and len(out) == 5):
        raise ValueError(
            f"torch simulator {name}: step(actions) returns (obs, reward, terminated, "
            f"truncated, info), not {type(out).__name__}"
            + (f" of {len(out)}" if isinstance(out, tuple) else "")
        )
    obs, reward, terminated, truncated, info = out
    check_sim_obs(spec, sim, "step()", obs)
    n = sim.num_envs
    for what, value, kinds in (
        ("reward", reward, ("float", "int")),
        ("terminated", terminated, ("bool",)),
        ("truncated", truncated, ("bool",)),
    ):
        shape, dtype = tuple(getattr(value, "shape", ())), str(getattr(value, "dtype", ""))
        if shape != (n,) or not any(k in dtype for k in kinds):
            raise ValueError(
                f"torch simulator {name}: step() gives {what} of shape {list(shape)} and "
                f"dtype {dtype or type(value).__name__}; the engine takes [{n}] "
                + ("bool" if kinds == ("bool",) else "numbers")
            )
    if not isinstance(info, dict) or "final_observation" not in info:
        got = f"a dict of {sorted(info)}" if isinstance(info, dict) else type(info).__name__
        raise ValueError(
            f"torch simulator {name}: step()'s info is {got}, without 'final_observation': it "
            "must hold each env's observation before its auto-reset"
        )
    check_sim_obs(spec, sim, "step()'s info['final_observation']", info["final_observation"])


class TorchSimRollout:
    """Rollout (and evaluation) of an `Engine`'s policy over a torch batch simulator.

    `sim.num_envs` must equal `env.num_envs` and its observation/action spaces the engine's
    env spec (the engine is built for a spec-identical JAX env, e.g. gymnax CartPole-v1 for
    `TorchCartPole`). `epoch(state)` = host rollout, then the engine's jitted update_dataset,
    train and sync_weights. `report` records how every tensor crossed.
    """

    def __init__(self, engine: Engine, sim: TorchBatchSim):
        spec = engine.spec
        problems = []
        if sim.num_envs != engine.num_envs:
            problems.append(f"sim.num_envs={sim.num_envs} but env.num_envs={engine.num_envs}")
        if tuple(sim.obs_shape) != tuple(spec.obs_shape):
            problems.append(f"sim obs shape {sim.obs_shape} but the policy's is {spec.obs_shape}")
        if spec.action.num_actions != getattr(sim, "num_actions", None):
            problems.append(
                f"sim has {getattr(sim, 'num_actions', None)} discrete actions, the policy "
                f"{spec.action.num_actions}"
            )
        if problems:
            raise ValueError("torch simulator does not match the engine: " + "; ".join(problems))
        self.engine, self.sim, self.algo = engine, sim, engine.algo
        self.report = BridgeReport(keep=False)
        self._obs: torch.Tensor | None = None
        self._outputs_checked = False
        self._fresh = False  # the simulator was reset since the last rollout
        self.act = jax.jit(self._act, static_argnums=3)
        self.finish = jax.jit(self._finish)
        # The engine's rollout hooks (nan_guard, offload placement, user hooks) run eagerly
        # around the host loop, as they run traced around the JAX rollout; the metric names are the
        # JAX rollout's, so nan_guard's indices name the same quantities.
        self.rollout = chain(*engine.phase_hooks["rollout"])(self._rollout)

    def _act(self, params: Any, obs: jax.Array, key: jax.Array, deterministic: bool):
        action, extras = self.algo.act(params, obs, key, deterministic)
        # `obs + 0` is an XLA output (a new buffer): the stored transition owns its copy.
        return action, extras, obs + 0

    def _finish(
        self, params: Any, stats: EpisodeStats, steps: list[Transition], fresh: Any
    ) -> tuple[EpisodeStats, Transition, Metrics]:
        """The steps stacked into the `[T, N]` trajectory, the episode statistics advanced over
        it as the JAX rollout does (`episode_stats`, before `complete_trajectory`), and the
        trajectory completed. fresh: the simulator was reset before these steps, so every env
        started a new episode: the running return and length start from 0."""
        trajectory = jax.tree.map(lambda *xs: jnp.stack(xs), *steps)
        stats = stats.replace(  # (traced: one compiled function whether fresh or not)
            current_return=jnp.where(fresh, 0.0, stats.current_return),
            current_length=jnp.where(fresh, 0, stats.current_length),
        )
        done = trajectory.terminated | trajectory.truncated  # [T, N]
        stats, metrics = episode_stats(stats, trajectory.reward, done)
        return stats, self.algo.complete_trajectory(params, trajectory), metrics

    def reset(self) -> None:
        """Resets the simulator; its envs' episodes (and their running return and length in
        `state.stats`, at the next rollout) start again."""
        self._obs = self.sim.reset()
        self._fresh = True

    def _rollout(self, state: EngineState) -> tuple[EngineState, Metrics]:
        """`algo.num_steps` host steps; writes the trajectory to `state.buffer` and advances
        `state.stats` (the JAX rollout's episode statistics and metrics)."""
        if isinstance(state.rng, jax.core.Tracer):  # before the simulator is touched
            raise TypeError(
                "TorchSimRollout: a rollout hook traced the host rollout (jre.every and other "
                "hooks built on lax.cond or jax.eval_shape trace the phase they wrap); the "
                "torch simulator steps eagerly, so its rollout takes hooks that call the phase "
                "(state -> phase(state)), and jre.every goes on the engine's other phases"
            )
        if self._obs is None:
            self.reset()
            check_sim_obs(self.engine.spec, self.sim, "reset()", self._obs)
        num_steps = self.engine.num_steps
        rng, key = jax.random.split(state.rng)
        keys = jax.random.split(key, num_steps)
        steps: list[Transition] = []
        for t in range(num_steps):
            # Zero-copy where DLPack can alias; a strided view (a slice of a wider buffer)
            # crosses as one copy, counted in `report`.
            obs = from_torch(self._obs, copy="if_needed", report=self.report)
            action, extras, obs_kept = self.act(state.eval_params, obs, keys[t], False)
            out = self.sim.step(to_torch(action, report=self.report))
            if not self._outputs_checked:
                check_sim_step(self.engine.spec, self.sim, out)
                self._outputs_checked = True
            obs_t, reward, terminated, truncated, info = out
            steps.append(
                Transition(
                    obs=obs_kept,
                    action=action,
                    extras=extras,
                    **from_torch(
                        {
                            "reward": reward.float(),
                            "terminated": terminated,
                            "truncated": truncated,
                            "next_obs": info["final_observation"].float(),
                        },
                        copy="always",  # the sim may reuse these tensors
                        report=self.report,
                    ),
                )
            )
            self._obs = obs_t
        stats, trajectory, metrics = self.finish(state.eval_params, state.stats, steps, self._fresh)
        self._fresh = False
        last_obs = from_torch(self._obs, copy="always", report=self.report)
        state = state.replace(
            env=state.env.replace(
                obs=last_obs, done=trajectory.terminated[-1] | trajectory.truncated[-1]
            ),
            stats=stats,
            rng=rng,
        )
        state = self.engine.builder.store(state, trajectory)
        return state, metrics

    def epoch(self, state: EngineState) -> tuple[EngineState, Metrics]:
        """Host rollout, then the engine's jitted update_dataset -> train -> sync_weights.

        Each phase is timed into `engine.timer` (so `engine.timing_summary()` covers it).
        """
        state, rolled = timed("rollout", self.engine.timer)(self.rollout)(state)
        metrics = dict(rolled)
        for name in EPOCH_PHASES[1:]:
            state, m = self.engine.timed_call(name, state)
            merge_metrics(metrics, m, name)
        return state, metrics

    def evaluate(self, state: EngineState, sim: TorchBatchSim, max_steps: int) -> float:
        """Mean return of one deterministic episode per env of a fresh `sim`."""
        import torch

        obs = sim.reset()
        check_sim_obs(self.engine.spec, sim, "reset()", obs)
        ret = torch.zeros(sim.num_envs)
        active = torch.ones(sim.num_envs, dtype=torch.bool)
        key = jax.random.key(0)
        for t in range(max_steps):
            action, _, _ = self.act(state.eval_params, from_torch(obs, copy="if_needed"), key, True)
            out = sim.step(to_torch(action))
            if t == 0:
                check_sim_step(self.engine.spec, sim, out)
            obs, reward, terminated, truncated, _ = out
            ret += torch.where(active, reward, 0.0)
            active &= ~(terminated | truncated)
            if not bool(active.any()):
                break
        return float(ret.mean())

    def train(self, state: EngineState, num_epochs: int) -> tuple[EngineState, dict[str, float]]:
        """`num_epochs` epochs; returns the state and timing (steps/s of the whole loop)."""
        start = time.perf_counter()
        metrics: Metrics = {}
        for _ in range(num_epochs):
            state, metrics = self.epoch(state)
            host_metrics = jax.device_get(metrics)
            check_guards(host_metrics, self.engine.guarded_names, int(state.counters.epoch))
        jax.block_until_ready(state)
        seconds = time.perf_counter() - start
        steps = num_epochs * self.engine.steps_per_epoch
        return state, {
            "seconds": seconds,
            "steps_per_second": steps / seconds,
            **{
                k: float(v)
                for k, v in metrics.items()
                if np.ndim(v) == 0 and not k.startswith("guard/")
            },
        }
