# %% [markdown]
# # Quickstart: train PPO on CartPole, plot the learning curve, act with the trained policy
#
# `jaxrl_engine` trains reinforcement-learning agents with every phase (rollout, GAE, PPO
# update, weight sync, evaluation) compiled by JAX. This notebook runs on a CPU in about a
# minute. Its plain-script twin is `examples/quickstart.py` (same code, same cells).
#
# On Colab: install the package first (`pip install jaxrl-engine`, or `pip install -e .`
# from a checkout of the repository).

# %%
import sys

import jax
import matplotlib.pyplot as plt
import numpy as np

import jaxrl_engine as jre
from jaxrl_engine.export.evaluate import evaluate_run
from jaxrl_engine.io.plot import plot_runs

# %% [markdown]
# ## Train
# The built-in default config is PPO on gymnax CartPole-v1 (`configs/ppo_cartpole.yaml` spells
# it out). Dotted overrides change any key; here a shorter run (200k env steps) that evaluates
# every 5 epochs. `engine.run` is the driver: it compiles every phase once, trains, evaluates,
# and writes `runs/quickstart/` (config, `metrics.jsonl`, TensorBoard events, `summary.json`,
# and the exported policy).

# %%
cfg = jre.load_config(
    None, ["name=quickstart", "total_env_steps=200000", "eval.interval=5", "progress=false"]
)
engine = jre.build(cfg)
state = engine.init(jax.random.key(cfg.seed))
state, summary = engine.run(state)
print(
    f"eval return {summary['final_eval_return']:.1f} after {summary['env_steps']:,} env steps; "
    f"{summary['steps_per_second']:,.0f} steps/s, compile {summary['compile_s']:.1f} s"
)

# %% [markdown]
# ## Plot the learning curve
# `summary["records"]` holds one record per epoch (the same records as `metrics.jsonl`); evaluation
# epochs carry `evaluate/episode_return`.

# %%
evals = [r for r in summary["records"] if "evaluate/episode_return" in r]
steps = np.array([r["env_steps"] for r in evals])
mean = np.array([r["evaluate/episode_return"] for r in evals])
std = np.array([r["evaluate/episode_return_std"] for r in evals])
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(steps, mean, marker="o", label="eval return (16 episodes)")
ax.fill_between(steps, mean - std, mean + std, alpha=0.2)
ax.set_xlabel("env steps")
ax.set_ylabel("episode return")
ax.set_title("PPO on CartPole-v1")
ax.legend()
fig.savefig(f"{summary['run_dir']}/quickstart_curve.png")

# %% [markdown]
# The command line draws the same curves from run directories, with mean and spread when
# several runs differ only in the seed: `jaxrl-engine plot runs/quickstart` (also as a
# function, below). `tensorboard --logdir runs` shows every metric.

# %%
plot_runs([summary["run_dir"]], f"{summary['run_dir']}/curves.svg")

# %% [markdown]
# ## Act with the trained policy
# `jre.make_policy` gives a jittable `policy(obs) -> action` (deterministic by default), from
# the engine and its state or from a run directory (`jre.make_policy(summary["run_dir"])`).
# One CartPole episode, stepped from Python with a jitted step.

# %%
env, env_params = engine.env, engine.env_params
policy = jre.make_policy((engine, state))


@jax.jit
def policy_step(obs, env_state, key):
    action = policy(obs[None])[0]
    obs, env_state, reward, terminated, truncated, _ = env.step(key, env_state, action, env_params)
    return obs, env_state, reward, terminated | truncated


key = jax.random.key(42)
obs, env_state = env.reset(key, env_params)
episode_return, done = 0.0, False
while not done:
    key, step_key = jax.random.split(key)
    obs, env_state, reward, done = policy_step(obs, env_state, step_key)
    episode_return += float(reward)
print(f"one episode with the trained policy: return {episode_return:.0f}")

# %% [markdown]
# ## The exported policy: no engine needed
# Every run exports its policy to `runs/<name>/policy/`: `act(params, obs)` serialized with
# `jax.export` plus `params.npz`, and a loader `policy.py` that imports only jax and numpy.
# This is what you ship; `jaxrl-engine eval runs/quickstart --episodes 100` plays it.

# %%
policy_dir = f"{summary['run_dir']}/policy"
sys.path.insert(0, policy_dir)
import policy as exported  # noqa: E402  (the exported loader, from the run directory)

act, params = exported.load(policy_dir)
observations = np.stack([np.asarray(env.reset(k, env_params)[0]) for k in jax.random.split(key, 8)])
print("actions for 8 start states:", np.asarray(act(params, observations)))

stats = evaluate_run(summary["run_dir"], episodes=32)
print(f"32 episodes: return {stats['return_mean']:.1f} +- {stats['return_std']:.1f}")
