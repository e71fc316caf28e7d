# %% [markdown]
# # A phase of your own: a fixed reward scale in `update_dataset`
#
# RLightning's engines subclass `BaseEngine` and override its phases. Here a phase is a pure
# function `state -> (state, metrics)`, and `jre.build(cfg, phases={"update_dataset": mine})`
# replaces the default one. The engine treats a replaced phase exactly like its own: warm-up
# compiles it, `nan_guard` checks it, offload places around it, your hooks wrap it, `profile`
# times it and the fused epoch (and the driver) run it.
#
# The example: PPO on gymnax Pendulum-v1, whose reward per step lies in [-16.3, 0]. Instead of
# the running return normalisation (`algo.normalize_reward`), the phase below divides the
# rewards by a fixed 16 before PPO computes advantages and value targets, so the critic learns
# values of order 1. Under a minute on a CPU. Plain-script twin: `examples/custom_phase.py`.

# %%
import jax
import jax.numpy as jnp
import numpy as np

import jaxrl_engine as jre
from jaxrl_engine.compose import make_algorithm
from jaxrl_engine.envs.gymnax_env import make_env

REWARD_SCALE = 1.0 / 16.0  # Pendulum's worst step is -16.27: scaled rewards lie in [-1.02, 0]

# `configs/ppo_pendulum.yaml`'s keys, a shorter run, and no running reward normalisation: the
# fixed scale of the phase below takes its place.
PENDULUM = [
    "env.id=Pendulum-v1",
    "env.num_envs=16",
    "eval.num_envs=16",
    "algo.num_steps=128",
    "algo.update_epochs=4",
    "algo.num_minibatches=8",
    "algo.lr=1e-3",
    "algo.gamma=0.9",
    "algo.ent_coef=0.0",
    "algo.normalize_reward=false",
    "offload=true",  # idle params and optimizer state in host memory between phases
    "progress=false",
]

# %% [markdown]
# ## The phase
# The default `update_dataset` (`jaxrl_engine/core/phases.py`) splits the state's key, calls the
# algorithm's `update_dataset(train_state, buffer, key, hparams)` and stores the new learner
# state, the batch `train` will use and the advanced key. Ours does the same on a copy of the
# rollout buffer whose rewards are scaled, and adds a metric. The buffer in the state keeps the
# env's own rewards; only what PPO learns from (advantages, value targets) sees the scale.
#
# The phase needs the algorithm bundle it calls, so a small factory closes over it; the engine
# must be built with that same bundle (`algorithm=`): `make_algorithm` makes it from the config
# as `jre.build` would, for the env `make_env` makes.


# %%
def reward_scaled_update_dataset(algo: jre.Algorithm, scale: float) -> jre.Phase:
    """`update_dataset` on the buffer's rewards times `scale`, then the algorithm's own."""

    def update_dataset(state: jre.EngineState) -> tuple[jre.EngineState, jre.Metrics]:
        rng, key = jax.random.split(state.rng)  # as the default phase does
        buffer = state.buffer._replace(reward=state.buffer.reward * scale)
        train, batch, metrics = algo.update_dataset(state.train, buffer, key, state.hparams)
        metrics = {**metrics, "update_dataset/reward_scale": jnp.float32(scale)}
        return state.replace(train=train, batch=batch, rng=rng), metrics

    return update_dataset


cfg = jre.load_config(None, [*PENDULUM, "name=custom_phase", "total_env_steps=40000"])
env = make_env(cfg.env.id, cfg.env.params)
algo = make_algorithm(cfg, env.spec(env.params))
scaled = reward_scaled_update_dataset(algo, REWARD_SCALE)
engine = jre.build(cfg, env=env, algorithm=algo, phases={"update_dataset": scaled})
default_engine = jre.build(cfg, env=env, algorithm=algo)  # the default phase, for comparison
state = engine.init(jax.random.key(cfg.seed))

# %% [markdown]
# ## Warm-up compiles it
# `warm_up` lowers and compiles the phases named (and those whose output they take, as rollout's
# for update_dataset): our replaced one, the other per-phase calls, and what the driver runs: the
# fused loop over epochs (our phase inside it) and the evaluation. `engine.run` below finds them compiled, and so does the profiling run at the end
# (one compiled call per phase).

# %%
state = engine.warm_up(
    state, phases=["update_dataset", "train", "sync_weights", "epochs", "evaluate"]
)
for name in ("rollout", "update_dataset", "train", "sync_weights", "epochs"):
    print(f"{name:<15} compiled in {engine.compile_report[name]['compile_s']:5.2f} s")

# %% [markdown]
# ## What changes, what does not
# One rollout, then the default phase and ours on the same state. The rollout is the engine's:
# the same data in both. The value targets PPO trains the critic on are about 16 times
# smaller (exactly so for the reward part; the bootstrap values are the critic's own), and the
# `nan_guard` wraps our phase as any other: `guard/update_dataset` is -1 when every metric is
# finite, and its index names the metric otherwise.

# %%
rolled, _ = engine.call("rollout", state)
after_default, m_default = default_engine.update_dataset(rolled)
after_scaled, m_scaled = engine.call("update_dataset", rolled)
print(f"rollout reward mean:       {float(rolled.buffer.reward.mean()):8.3f}")
for key in ("update_dataset/return_target_mean", "update_dataset/advantage_mean"):
    print(f"{key}: default {float(m_default[key]):8.3f}   scaled {float(m_scaled[key]):8.3f}")
print("update_dataset/reward_scale:", float(m_scaled["update_dataset/reward_scale"]))
print("guard/update_dataset:", int(m_scaled["guard/update_dataset"]))
print("quantities it guards:", engine.guarded_names["update_dataset"])
print(
    "same key advanced as the default phase:",
    bool(jnp.all(jax.random.key_data(after_default.rng) == jax.random.key_data(after_scaled.rng))),
)

# %% [markdown]
# ## Train
# `engine.run` runs the epochs as one compiled loop over rollout -> our update_dataset -> train
# -> sync_weights; each epoch's record carries our metric. The critic's loss is in scaled units.

# %%
state, summary = engine.run(state)
print(f"{'epoch':>5} {'reward_scale':>12} {'target_mean':>11} {'value_loss':>10} {'eval':>8}")
for r in summary["records"]:
    if r["epoch"] % 4 == 0 or "evaluate/episode_return" in r:
        print(
            f"{r['epoch']:>5} {r['update_dataset/reward_scale']:>12.4f} "
            f"{r['update_dataset/return_target_mean']:>11.3f} {r['train/value_loss']:>10.4f} "
            f"{r.get('evaluate/episode_return', np.nan):>8.1f}"
        )
print(f"final eval return {summary['final_eval_return']:.1f} after {summary['env_steps']:,} steps")

# %% [markdown]
# ## nan_guard stops a run in our phase
# Hyperparameters are traced values in the state, so a bad one needs no recompile: a NaN
# discount makes the advantages our phase computes NaN, and the run stops at once with
# `NonFiniteError` naming the phase, the quantity and the epoch (the failing batch is written
# to the run directory).

# %%
bad = engine.with_hparams(engine.init(jax.random.key(1)), engine.hparams.replace(gamma=np.nan))
try:
    engine.run(bad, run_dir="runs/custom_phase_nan")
except jre.NonFiniteError as e:
    print(f"NonFiniteError: phase {e.phase!r}, quantity {e.quantity!r}, epoch {e.epoch}")

# %% [markdown]
# ## Offload
# The run above had `offload: true`: between phases the idle params and optimizer state sit in
# host memory. Our phase needs neither (it reads the rollout and the learner's normalisers), so
# nothing is moved around it, as with the default phase. The placement follows the phase's
# name, not what your code reads: a replacement `update_dataset` that reads
# `state.train.params` reloads them itself, with
# `hooks={"update_dataset": [jre.reload_before(p, mesh), jre.offload_after(p, mesh)]}` for
# `p = ("train.params",)` and the engine's `mesh`.

# %%
parts = {
    "train.params": state.train.params,
    "train.opt_state": state.train.opt_state,
    "eval_params": state.eval_params,
    "buffer": state.buffer,
    "batch": state.batch,
}
for part, tree in parts.items():
    print(f"{part:<16} {sorted({x.sharding.memory_kind for x in jax.tree.leaves(tree)})}")

# %% [markdown]
# ## The timing table
# `profile: true` runs each phase of an epoch as its own timed call instead of the fused loop;
# `engine.timing_summary()` then lists our phase beside the others. Here a driver for the
# same config with `profile=true` runs 4 epochs of a fresh state on the same engine (the
# phases warm-up compiled, nothing new); `jre.build` of that config does the same with
# `engine.run`.

# %%
profile_cfg = jre.load_config(
    None, [*PENDULUM, "name=custom_phase_profile", "total_env_steps=40000", "profile=true"]
)
_, p_summary = jre.Driver(profile_cfg).run(engine, engine.init(jax.random.key(2)), num_epochs=4)
print("reward_scale per epoch:", [r["update_dataset/reward_scale"] for r in p_summary["records"]])
print()
engine.timing_summary()
