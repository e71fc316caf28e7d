# %% [markdown]
# # Off-policy: DQN on CartPole and SAC on Pendulum
#
# Off-policy algorithms use the same engine phases as PPO: `rollout` writes transitions into a
# fixed-shape replay buffer in the state, `update_dataset` samples from it, `train` runs
# `train_ratio * env steps` gradient steps, and `sync_weights` refreshes the acting weights
# every `sync_every` epochs (a bounded staleness, as asynchronous actors would have). Short
# runs, a few minutes on a CPU at most. Plain-script twin: `examples/off_policy.py`.

# %%
import jax
import matplotlib.pyplot as plt

import jaxrl_engine as jre
from jaxrl_engine.export.evaluate import evaluate_run

# %% [markdown]
# ## DQN on CartPole-v1
# Double DQN with hard target updates and epsilon-greedy exploration. The keys are those of
# `configs/dqn_cartpole.yaml`, set here for a run of 100k env steps (that config's published
# settings take 500k): 8 envs, learning from 5k steps, a larger learning rate annealed to 0,
# and the target copied every 250 gradient steps.

# %%
dqn_cfg = jre.load_config(
    None,
    [
        "name=off_policy_dqn",
        "algo.name=dqn",
        "total_env_steps=100000",
        "env.num_envs=8",
        "eval.interval=25",
        "algo.num_steps=16",
        "algo.learning_starts=5000",
        "algo.lr=5e-4",
        "algo.anneal_lr=true",
        "algo.target_update_interval=250",
        "algo.exploration_fraction=0.4",
        "progress=false",
    ],
)
dqn = jre.build(dqn_cfg)
dqn_state, dqn_summary = dqn.run(dqn.init(jax.random.key(0)))
print(f"DQN: eval return {dqn_summary['final_eval_return']:.1f} in {dqn_summary['wall_s']:.0f} s")
buffer = (
    dqn_state.buffer
)  # a fixed-shape pytree inside the state: [capacity / num_envs, num_envs, ...]
stored = min(int(buffer.count), buffer.data.obs.shape[0]) * dqn_cfg.env.num_envs
print(
    f"replay buffer: {stored:,} of {dqn_cfg.algo.buffer_size:,} transitions; obs {buffer.data.obs.shape}"
)

# %% [markdown]
# ## SAC on Pendulum-v1
# Twin Q critics, a tanh-squashed Gaussian actor and automatic entropy tuning; one gradient
# step per env step. Smaller networks than `configs/sac_pendulum.yaml` to stay quick on a CPU.

# %%
sac_cfg = jre.load_config(
    None,
    [
        "name=off_policy_sac",
        "algo.name=sac",
        "env.id=Pendulum-v1",
        "env.num_envs=4",
        "total_env_steps=12000",
        "eval.interval=125",
        "algo.num_steps=4",
        "algo.buffer_size=20000",
        "algo.learning_starts=1000",
        "algo.actor_lr=1e-3",
        "algo.critic_lr=1e-3",
        "algo.alpha_lr=1e-3",
        "algo.hidden_sizes=[64,64]",
        "progress=false",
    ],
)
sac = jre.build(sac_cfg)
sac_state, sac_summary = sac.run(sac.init(jax.random.key(0)))
print(f"SAC: eval return {sac_summary['final_eval_return']:.1f} in {sac_summary['wall_s']:.0f} s")

# %% [markdown]
# ## Learning curves

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
for ax, (title, summary) in zip(
    axes, (("DQN, CartPole-v1", dqn_summary), ("SAC, Pendulum-v1", sac_summary)), strict=True
):
    evals = [r for r in summary["records"] if "evaluate/episode_return" in r]
    ax.plot(
        [r["env_steps"] for r in evals], [r["evaluate/episode_return"] for r in evals], marker="o"
    )
    ax.set_title(title)
    ax.set_xlabel("env steps")
axes[0].set_ylabel("eval return")
fig.savefig(f"{dqn_summary['run_dir']}/off_policy_curves.png")  # into a run directory
print("plot:", f"{dqn_summary['run_dir']}/off_policy_curves.png")

# %% [markdown]
# ## The exported policies
# Both runs exported their greedy / mean action as a `jax.export` artefact in
# `runs/<name>/policy/`, played here for 32 episodes (what `jaxrl-engine eval` does).

# %%
for summary in (dqn_summary, sac_summary):
    stats = evaluate_run(summary["run_dir"], episodes=32)
    print(f"{stats['env_id']}: return {stats['return_mean']:.1f} +- {stats['return_std']:.1f}")
