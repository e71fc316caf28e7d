"""How well can any policy do on gymnax's Pendulum-v1? (issue 14's Pendulum anchor of -130)

Pendulum is a deterministic two-dimensional control problem: state (theta, theta_dot), torque u
in [-2, 2], reward -(angle(theta)^2 + 0.1 theta_dot^2 + 0.001 u^2) on the state before the step,
200 steps, episodes starting at theta ~ U[-pi, pi], theta_dot ~ U[-1, 1]. Its optimal policy can
therefore be computed, not guessed: finite-horizon dynamic programming on a (theta, theta_dot)
grid, backwards over the 200 steps,

    V_200 = 0,   V_t(s) = max_u  r(s, u) + V_{t+1}(f(s, u))     (bilinear interpolation of V)

with theta periodic and theta_dot on [-8, 8] (the env clips it there). Two figures come out:

  dp_value    the DP's own estimate of the optimal expected return: V_0 averaged over the start
              distribution (an approximation: the grid's interpolation error is in it)
  greedy      the return the DP's greedy policy actually gets in gymnax's own env (its
              `step_env`, float32, exactly what the engine trains on) from `--episodes` start
              states drawn by gymnax's `reset_env`: at each step the torque maximising
              r + V_{t+1}(f) over a finer action set. This is a policy's measured return, so the
              optimum is at least this (up to the sampling error, reported)

Several grid sizes show whether the figures have converged. The greedy policy's episode
returns also give the chance that a 164-episode mean (gymnax-blines' test rollouts behind the
-130 anchor) reaches -130 under the optimal policy (resampling the measured episodes).
`--gammas 0.99` solves the discounted problem an agent with that discount learns instead.
`--policy RUN_DIR ...` (runs of `jaxrl-engine train` on Pendulum-v1) also evaluates each run's
exported greedy policy from the same start states and reports where it loses return against
the DP's policy (the last grid's), episode by episode.

    .venv/bin/python benchmarks/pendulum_optimum.py [--grids 201 401 801] [--episodes 100000]
        [--policy runs/sac_pendulum ...]
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from pathlib import Path

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
from gymnax.environments.classic_control.pendulum import angle_normalize

import jaxrl_engine as jre
from jaxrl_engine.export.policy import acting_function, load_params

HORIZON = 200
MAX_SPEED = 8.0
MAX_TORQUE = 2.0


def dynamics(theta: jax.Array, theta_dot: jax.Array, u: jax.Array, p) -> tuple:
    """gymnax's Pendulum step (reward on the state before the step), broadcasting."""
    reward = -(angle_normalize(theta) ** 2 + 0.1 * theta_dot**2 + 0.001 * u**2)
    new_dot = theta_dot + (3 * p.g / (2 * p.l) * jnp.sin(theta) + 3.0 / (p.m * p.l**2) * u) * p.dt
    new_dot = jnp.clip(new_dot, -p.max_speed, p.max_speed)
    return theta + new_dot * p.dt, new_dot, reward


def interpolate(v: jax.Array, theta: jax.Array, theta_dot: jax.Array) -> jax.Array:
    """Bilinear interpolation of v[n_theta, n_dot]: theta periodic (grid at -pi + 2 pi i / n),
    theta_dot on [-8, 8] (grid at -8 + 16 j / (n - 1))."""
    n_th, n_dot = v.shape
    x = (angle_normalize(theta) + jnp.pi) / (2 * jnp.pi) * n_th
    y = (jnp.clip(theta_dot, -MAX_SPEED, MAX_SPEED) + MAX_SPEED) / (2 * MAX_SPEED) * (n_dot - 1)
    i0 = jnp.floor(x)
    j0 = jnp.clip(jnp.floor(y), 0, n_dot - 2)
    fx, fy = x - i0, y - j0
    i0 = i0.astype(jnp.int32) % n_th
    i1 = (i0 + 1) % n_th
    j0 = j0.astype(jnp.int32)
    j1 = j0 + 1
    return (
        (1 - fx) * (1 - fy) * v[i0, j0]
        + fx * (1 - fy) * v[i1, j0]
        + (1 - fx) * fy * v[i0, j1]
        + fx * fy * v[i1, j1]
    )


def solve(n: int, actions: jax.Array, p, gamma: float = 1.0) -> jax.Array:
    """V_t for t = 0..HORIZON on an n x n grid: [HORIZON + 1, n, n] (float32).

    gamma < 1: the discounted problem an agent with that discount learns (truncation at 200
    bootstrapped, so no horizon): value iteration to its fixed point, the same V at every t."""
    theta = -jnp.pi + 2 * jnp.pi * jnp.arange(n) / n
    theta_dot = jnp.linspace(-MAX_SPEED, MAX_SPEED, n)
    th, dot = jnp.meshgrid(theta, theta_dot, indexing="ij")

    def backup(v_next, _):
        def one_action(best, u):
            nth, ndot, r = dynamics(th, dot, u, p)
            return jnp.maximum(best, r + gamma * interpolate(v_next, nth, ndot)), None

        v, _ = jax.lax.scan(one_action, jnp.full_like(v_next, -jnp.inf), actions)
        return v, v

    if gamma < 1.0:  # gamma ** iterations < 1e-4
        iterations = math.ceil(math.log(1e-4) / math.log(gamma))
        v, _ = jax.lax.scan(backup, jnp.zeros((n, n)), None, length=iterations)
        return jnp.broadcast_to(v, (HORIZON + 1, n, n))
    _, vs = jax.lax.scan(backup, jnp.zeros((n, n)), None, length=HORIZON)
    return jnp.concatenate([vs[::-1], jnp.zeros((1, n, n))])  # vs[-1] is V_0


def start_value(v0: jax.Array, samples: int = 1_000) -> float:
    """V_0 averaged over theta ~ U[-pi, pi], theta_dot ~ U[-1, 1] (midpoint rule)."""
    th = -jnp.pi + 2 * jnp.pi * (jnp.arange(samples) + 0.5) / samples
    dot = -1.0 + 2.0 * (jnp.arange(samples // 4) + 0.5) / (samples // 4)
    t, d = jnp.meshgrid(th, dot, indexing="ij")
    return float(jnp.mean(interpolate(v0, t, d)))


def start_states(episodes: int, seed: int):
    """`episodes` start states drawn by gymnax's own `reset_env`."""
    env, params = gymnax.make("Pendulum-v1")
    keys = jax.random.split(jax.random.key(seed), episodes)
    return jax.vmap(env.reset_env, in_axes=(0, None))(keys, params)[1]


def greedy_returns(
    values: jax.Array, fine_actions: jax.Array, episodes: int, seed: int, gamma: float = 1.0
):
    """Episode returns of the DP's greedy policy in gymnax's own Pendulum-v1."""
    env, params = gymnax.make("Pendulum-v1")
    states = start_states(episodes, seed)

    def act(state, t):
        nth, ndot, r = dynamics(
            state.theta[..., None], state.theta_dot[..., None], fine_actions, params
        )
        q = r + gamma * interpolate(values[t + 1], nth, ndot)
        return fine_actions[jnp.argmax(q, axis=-1)]

    def step(states, t):
        u = act(states, t)
        step_env = jax.vmap(env.step_env, in_axes=(None, 0, 0, None))
        _, states, reward, _, _ = step_env(jax.random.key(0), states, u[:, None], params)
        return states, reward

    _, rewards = jax.lax.scan(step, states, jnp.arange(HORIZON))
    return np.asarray(rewards.sum(0))


def policy_returns(run_dir: str, episodes: int, seed: int) -> np.ndarray:
    """Episode returns of a trained run's exported greedy policy, from `start_states`."""
    cfg = jre.load_config(str(Path(run_dir) / "config.yaml"), ["compile_cache_dir=null"])
    if cfg.env.id != "Pendulum-v1":
        raise SystemExit(f"--policy {run_dir}: env.id is {cfg.env.id!r}, not Pendulum-v1")
    engine = jre.build(cfg)
    params = load_params(engine, Path(run_dir) / "policy")
    act = acting_function(engine)
    env, env_params = gymnax.make("Pendulum-v1")

    def step(states, _):
        u = act(params, jax.vmap(env.get_obs)(states))
        step_env = jax.vmap(env.step_env, in_axes=(None, 0, 0, None))
        _, states, reward, _, _ = step_env(jax.random.key(0), states, u, env_params)
        return states, reward

    _, rewards = jax.jit(lambda s: jax.lax.scan(step, s, None, length=HORIZON))(
        start_states(episodes, seed)
    )
    return np.asarray(rewards.sum(0))


def check_dynamics(p) -> float:
    """Largest difference between `dynamics` and gymnax's `step_env` on random states."""
    env, _ = gymnax.make("Pendulum-v1")
    k1, k2, k3 = jax.random.split(jax.random.key(1), 3)
    th = jax.random.uniform(k1, (1000,), minval=-10, maxval=10)
    dot = jax.random.uniform(k2, (1000,), minval=-8, maxval=8)
    u = jax.random.uniform(k3, (1000,), minval=-3, maxval=3)
    state = env.reset_env(k1, p)[1]
    states = jax.vmap(lambda a, b: state.replace(theta=a, theta_dot=b))(th, dot)
    step_env = jax.vmap(env.step_env, in_axes=(None, 0, 0, None))
    _, out, reward, _, _ = step_env(k1, states, u[:, None], p)
    nth, ndot, r = dynamics(th, dot, jnp.clip(u, -MAX_TORQUE, MAX_TORQUE), p)
    return max(
        float(jnp.max(jnp.abs(nth - out.theta))),
        float(jnp.max(jnp.abs(ndot - out.theta_dot))),
        float(jnp.max(jnp.abs(r - reward))),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grids", type=int, nargs="+", default=[201, 401, 801])
    parser.add_argument("--actions", type=int, default=41, help="torques in the DP's max")
    parser.add_argument("--fine-actions", type=int, default=401, help="torques for the policy")
    parser.add_argument("--episodes", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--gammas",
        type=float,
        nargs="+",
        default=[1.0],
        help="1: the 200-step return itself; < 1: the policy optimal for that discount",
    )
    parser.add_argument("--anchor", type=float, default=-130.0)
    parser.add_argument("--anchor-episodes", type=int, default=164)
    parser.add_argument("--policy", nargs="*", default=[], help="run directories to compare")
    args = parser.parse_args()

    _, p = gymnax.make("Pendulum-v1")
    err = check_dynamics(p)
    print(f"dynamics vs gymnax step_env: max abs difference {err:.2e}")
    assert err < 1e-5, "the DP's dynamics are not gymnax's"
    actions = jnp.linspace(-MAX_TORQUE, MAX_TORQUE, args.actions)
    fine = jnp.linspace(-MAX_TORQUE, MAX_TORQUE, args.fine_actions)
    rng = np.random.default_rng(args.seed)
    print(
        f"| grid | gamma | DP actions | dp_value | greedy mean ({args.episodes} episodes) | std | "
        f"s.e. | median | min | P({args.anchor_episodes}-episode mean >= {args.anchor}) | s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, gamma in itertools.product(args.grids, args.gammas):
        t0 = time.perf_counter()
        values = jax.jit(solve, static_argnums=(0, 3))(n, actions, p, gamma)
        dp_value = start_value(values[0]) if gamma == 1.0 else math.nan
        returns = greedy_returns(values, fine, args.episodes, args.seed, gamma)
        means = rng.choice(returns, size=(20_000, args.anchor_episodes)).mean(1)
        chance = float(np.mean(means >= args.anchor))
        print(
            f"| {n} x {n} | {gamma} | {args.actions} | {dp_value:.2f} | {returns.mean():.2f} | "
            f"{returns.std():.1f} | {returns.std() / math.sqrt(len(returns)):.2f} | "
            f"{np.median(returns):.1f} | {returns.min():.1f} | {chance:.4f} | "
            f"{time.perf_counter() - t0:.0f} |",
            flush=True,
        )
    if not args.policy:
        return
    print(
        f"\nAgainst the last row's DP policy, the same {args.episodes} start states:\n"
        "| run | mean | std | median | min | mean gap | episodes > 1 worse | > 10 worse | "
        "share of the gap from the episodes > 10 worse | "
        f"P({args.anchor_episodes}-episode mean >= {args.anchor}) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for run_dir in args.policy:
        mine = policy_returns(run_dir, args.episodes, args.seed)
        gap = returns - mine
        worse = gap > 10
        means = rng.choice(mine, size=(20_000, args.anchor_episodes)).mean(1)
        print(
            f"| {run_dir} | {mine.mean():.2f} | {mine.std():.1f} | {np.median(mine):.1f} | "
            f"{mine.min():.1f} | {gap.mean():.2f} | {np.mean(gap > 1):.3f} | "
            f"{np.mean(worse):.3f} | {gap[worse].sum() / gap.sum():.2f} | "
            f"{np.mean(means >= args.anchor):.4f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
