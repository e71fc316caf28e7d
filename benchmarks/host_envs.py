"""Host envs (issue 12): env steps/s of PPO training on envs stepped on the host.

Rows, each PPO with configs/ppo_gym_cartpole.yaml's hyperparameters (16 envs x 128 steps, 4 x 4
minibatches, 64x64 tanh), timed over `--epochs` epochs of `engine.run` (evaluation only at the
end; compile excluded: the run's `train_s`) three ways: training env steps over the whole run
(the summary's steps/s: the final evaluation's time counted, its env steps not); all env steps
over the whole run (the evaluation episodes' steps counted too: the env's stepping rate while
the engine runs, comparable with the random-policy limit below); and over the epoch calls
alone (without the final evaluation, logging and checkpoint: the work Stable-Baselines3's
`learn()` times). Rows alternate `--repeats` times in this one process, medians reported:

  gymnasium CartPole-v1, overlap off / on
  envpool CartPole-v1, overlap off / on          (when envpool is installed)
  gymnasium CartPole busy, overlap off / on      (each env step busy-waits `--slow-us` us on
                                                  this CPU: env and learner share the cores)
  gymnasium CartPole sleeping, overlap off / on  (each batch step sleeps `--sleep-us` us: a
                                                  simulator whose time is spent elsewhere;
                                                  a 256x256 PPO, 10 update epochs, so that
                                                  learner and env times are comparable)
  gymnasium InvertedPendulum-v5, overlap off / on (when mujoco is installed)

and, per env, the limit: the vector env's own stepping rate under uniformly random actions
(no network, no learning; measured in each round after the rows, median) next to the engine's
rollout phase alone (acting network + envs, no learning), and what `offload: true` costs per
env-set switch (the idle set closed, the other made and reset; twice per evaluation). With
`--sb3-python PATH` (a Python with stable-baselines3 and torch, NOT a dependency of this
package) Stable-Baselines3 PPO with matched hyperparameters trains CartPole-v1 (16 DummyVecEnv
envs) for the same env steps in that interpreter: its steps/s.

    .venv/bin/python benchmarks/host_envs.py [--epochs 30] [--repeats 3] [--sb3-python PY]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time

import gymnasium
import jax
from gymnasium.envs.classic_control import CartPoleEnv

import jaxrl_engine as jre
from jaxrl_engine.envs import envpool_env
from jaxrl_engine.envs.gymnasium_env import GymnasiumEnv, steps_per_second_of_random_policy

PPO = [
    "env.num_envs=16",
    "algo.num_steps=128",
    "algo.update_epochs=4",
    "algo.num_minibatches=4",
    "algo.lr=5e-4",
    "algo.hidden_sizes=[64,64]",
    "progress=false",
    "compile_cache_dir=null",  # compiles measured cold
    "loggers=[jsonl]",
    "save_interval=0",
]


# A learner as slow as the sleeping env's rollout (about 160 ms an epoch here), so that env
# time and learner time are comparable: what overlap is for.
HEAVY_LEARNER = ["algo.hidden_sizes=[256,256]", "algo.update_epochs=10"]


class SlowCartPole(CartPoleEnv):
    """CartPole whose step takes `slow_us` microseconds more: busy-waiting in every env (a
    simulator's compute on this CPU, holding the GIL), or, with `sleep`, one sleep per batch of
    16 env steps (a batched simulator whose time is spent elsewhere: a GPU, another machine, a
    robot; the GIL and the cores stay free)."""

    calls = 0  # env steps of every instance: the sleeping variant sleeps once per 16

    def __init__(self, slow_us: float = 0.0, sleep: bool = False):
        super().__init__()
        self.slow_s, self.sleep = slow_us * 1e-6, sleep

    def step(self, action):
        if self.sleep:
            SlowCartPole.calls += 1
            if SlowCartPole.calls % 16 == 0:
                time.sleep(self.slow_s)
        else:
            until = time.perf_counter() + self.slow_s
            while time.perf_counter() < until:
                pass
        return super().step(action)


gymnasium.register("SlowCartPole-v1", entry_point=SlowCartPole, max_episode_steps=500)


def engine_rate(overrides: list[str], epochs: int, run_dir: str) -> tuple[float, float, float]:
    """(env steps/s of the run, of the run with its evaluation's steps counted, of its epochs
    alone) of one `engine.run` of `epochs` epochs.

    The run's rate is its summary's: training env steps over `train_s` (the epochs, the final
    evaluation, logging and the final checkpoint), so the evaluation's time counts and its env
    steps do not. The second counts them too (its episodes' steps: the env's stepping rate
    over the whole run, what the random-policy limit is a rate of). The epochs' rate counts
    only the driver's epoch calls (the engine timer's "epoch": rollouts and learning, what
    Stable-Baselines3's `learn()` does)."""
    steps = epochs * 16 * 128
    cfg = jre.load_config(
        None,
        [
            *PPO,
            f"total_env_steps={steps}",
            f"eval.interval={epochs}",
            f"run_dir={run_dir}",
            *overrides,
        ],
    )
    engine = jre.build(cfg)
    _, summary = engine.run(engine.init(jax.random.key(0)))
    engine.env.close()
    epochs_s = engine.timer.summary()["epoch"]["total_s"]
    final = summary["records"][-1]
    eval_steps = summary["eval_episodes"] * final["evaluate/episode_length"]
    all_steps = (summary["env_steps"] + eval_steps) / summary["train_s"]
    return summary["steps_per_second"], all_steps, summary["env_steps"] / epochs_s


def host_env(overrides: list[str]) -> GymnasiumEnv:
    """The 16-env host env (training and evaluation sets) of a row's overrides."""
    cfg = jre.load_config(None, [*PPO, *overrides])
    suite = envpool_env.EnvPoolEnv if cfg.env.suite == "envpool" else GymnasiumEnv
    return suite(cfg.env.id, 16, 16, cfg.env.params)


def limit_rate(overrides: list[str]) -> float:
    """The env's own stepping rate under uniformly random actions (20,000 steps; no network,
    no learning): the limit of any engine stepping it."""
    env = host_env(overrides)
    if isinstance(env, envpool_env.EnvPoolEnv):
        rate = envpool_env.steps_per_second_of_random_policy(env, 20000)
    else:
        rate = steps_per_second_of_random_policy(env, 20000)
    env.close()
    return rate


def rollout_rate(overrides: list[str], calls: int = 10) -> float:
    """Env steps/s of the engine's rollout phase alone (the acting network in XLA, the envs
    on the host through the io_callback; no learning), median of `calls` calls."""
    cfg = jre.load_config(None, [*PPO, *overrides, "run_dir=unused"])
    engine = jre.build(cfg)
    state = engine.warm_up(engine.init(jax.random.key(0)), phases=["rollout"])
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        state, _ = jax.block_until_ready(engine.call("rollout", state))
        times.append(time.perf_counter() - start)
    engine.env.close()
    return 16 * 128 / statistics.median(times)


def sb3_rate(python: str, steps: int) -> float:
    script = f"""
import time, torch, gymnasium
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
torch.set_num_threads(2)
env = make_vec_env("CartPole-v1", n_envs=16, seed=0)
model = PPO("MlpPolicy", env, n_steps=128, batch_size=512, n_epochs=4, learning_rate=5e-4,
            gamma=0.99, gae_lambda=0.95, clip_range=0.2, ent_coef=0.01, vf_coef=0.5,
            max_grad_norm=0.5, policy_kwargs=dict(net_arch=[64, 64], activation_fn=torch.nn.Tanh),
            device="cpu", seed=0, verbose=0)
model.learn(16 * 128)  # warm-up
start = time.perf_counter()
model.learn({steps}, reset_num_timesteps=False)
print({steps} / (time.perf_counter() - start))
"""
    out = subprocess.run([python, "-c", script], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def offload_switch_seconds(env: GymnasiumEnv, switches: int = 20) -> float:
    """Median seconds of one env-set switch under `offload: true`: the idle set closed, the
    other made again and reset (what each evaluation costs twice: eval set in, training set
    back)."""
    import numpy as np

    env.offload = True
    train, evaluation = env.params, env.eval_set({})
    times = []
    for i in range(switches):
        params = evaluation if i % 2 == 0 else train
        start = time.perf_counter()
        env._host_reset(params, np.array([i], np.uint32))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--slow-us", type=float, default=40.0)
    parser.add_argument("--sleep-us", type=float, default=1000.0)
    parser.add_argument("--sb3-python", help="a Python with stable-baselines3 and torch")
    args = parser.parse_args()

    envs = {
        "gymnasium CartPole-v1": ["env.suite=gymnasium", "env.id=CartPole-v1"],
        f"gymnasium CartPole-v1 busy {args.slow_us:g} us/env step": [
            "env.suite=gymnasium",
            "env.id=SlowCartPole-v1",
            f"env.params={{slow_us: {args.slow_us}}}",
        ],
        f"gymnasium CartPole-v1 sleeping {args.sleep_us:g} us/batch step, 256x256 x10": [
            "env.suite=gymnasium",
            "env.id=SlowCartPole-v1",
            f"env.params={{slow_us: {args.sleep_us}, sleep: true}}",
            *HEAVY_LEARNER,
        ],
    }
    if importlib.util.find_spec("envpool") is not None:
        envs["envpool CartPole-v1"] = ["env.suite=envpool", "env.id=CartPole-v1"]
    if importlib.util.find_spec("mujoco") is not None:
        envs["gymnasium InvertedPendulum-v5"] = [
            "env.suite=gymnasium",
            "env.id=InvertedPendulum-v5",
        ]
    rows = {(name, overlap): [] for name in envs for overlap in (False, True)}
    all_rows: dict[tuple[str, bool], list[float]] = {key: [] for key in rows}
    epoch_rows: dict[tuple[str, bool], list[float]] = {key: [] for key in rows}
    limit_runs: dict[str, list[float]] = {name: [] for name in envs}
    with tempfile.TemporaryDirectory() as run_dir:
        for repeat in range(args.repeats):
            for (name, overlap), rates in rows.items():
                rate, all_rate, epochs_rate = engine_rate(
                    [*envs[name], f"env.overlap={str(overlap).lower()}", f"name=r{repeat}"],
                    args.epochs,
                    run_dir,
                )
                rates.append(rate)
                all_rows[name, overlap].append(all_rate)
                epoch_rows[name, overlap].append(epochs_rate)
                print(
                    f"  {name}, overlap {overlap}: {rate:,.0f} steps/s "
                    f"({all_rate:,.0f} with its evaluation's steps, {epochs_rate:,.0f} in its "
                    "epochs)",
                    file=sys.stderr,
                )
            # The limits in the same rounds as the rows (the machine's state drifts).
            for name, overrides in envs.items():
                limit_runs[name].append(limit_rate(overrides))
                print(f"  {name}: limit {limit_runs[name][-1]:,.0f} steps/s", file=sys.stderr)
    limits = {name: statistics.median(rates) for name, rates in limit_runs.items()}
    switch_s, rollouts = {}, {}
    for name, overrides in envs.items():
        rollouts[name] = rollout_rate(overrides)
        env = host_env(overrides)
        switch_s[name] = offload_switch_seconds(env)
        env.close()
    result = {
        "machine": f"{jax.devices()[0].platform}, {jax.device_count()} device(s)",
        "epochs": args.epochs,
        "repeats": args.repeats,
        "rows": {
            f"{name}, overlap {'on' if overlap else 'off'}": statistics.median(rates)
            for (name, overlap), rates in rows.items()
        },
        "with_evaluation_steps": {
            f"{name}, overlap {'on' if overlap else 'off'}": statistics.median(rates)
            for (name, overlap), rates in all_rows.items()
        },
        "epochs_only": {
            f"{name}, overlap {'on' if overlap else 'off'}": statistics.median(rates)
            for (name, overlap), rates in epoch_rows.items()
        },
        "random_policy_limit": limits,
        "random_policy_limit_runs": limit_runs,
        "offload_switch_s": switch_s,
        "rollout_only": rollouts,
    }
    if args.sb3_python:
        result["sb3_ppo_cartpole"] = statistics.median(
            sb3_rate(args.sb3_python, args.epochs * 16 * 128) for _ in range(args.repeats)
        )
    print(
        "| row | env steps/s (run) | of the env's limit | with the evaluation's steps | of the "
        "limit | epochs only | of the limit |"
    )
    print("|---|---|---|---|---|---|---|")
    for row, rate in result["rows"].items():
        limit = limits[row.rsplit(", overlap", 1)[0]]
        all_rate = result["with_evaluation_steps"][row]
        epochs_rate = result["epochs_only"][row]
        print(
            f"| {row} | {rate:,.0f} | {rate / limit:.2f} | {all_rate:,.0f} | "
            f"{all_rate / limit:.2f} | {epochs_rate:,.0f} | {epochs_rate / limit:.2f} |"
        )
    for name, limit in limits.items():
        rate = rollouts[name]
        print(
            f"| {name}: engine rollout phase only (acting, no learning) | {rate:,.0f} | "
            f"{rate / limit:.2f} | | | | |"
        )
        print(
            f"| {name}: random policy, no learning (the limit, median of {args.repeats}) | "
            f"{limit:,.0f} | 1.00 | | | | |"
        )
    if "sb3_ppo_cartpole" in result:
        sb3 = result["sb3_ppo_cartpole"]
        for overlap in ("off", "on"):
            row = f"gymnasium CartPole-v1, overlap {overlap}"
            ours, epochs_rate = result["rows"][row], result["epochs_only"][row]
            print(
                f"| engine / Stable-Baselines3 PPO ({sb3:,.0f}), CartPole-v1, overlap "
                f"{overlap} | {ours / sb3:.2f}x | | | | {epochs_rate / sb3:.2f}x | |"
            )
    print("\n| env (16 envs per set) | offload: one env-set switch (close, make, reset) |")
    print("|---|---|")
    for name, seconds in switch_s.items():
        print(f"| {name} | {seconds * 1e3:.1f} ms |")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
