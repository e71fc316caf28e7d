# %% [markdown]
# # The functional API: phases by hand, a hook of your own, many seeds in one compiled call
#
# Every phase of the engine is a pure function `state -> (state, metrics)` over one
# `EngineState` pytree; hooks are functions `Phase -> Phase`; the whole training is a pure
# `train(key)`. This notebook uses each of those directly (a few minutes on a CPU at most).
# Plain-script twin: `examples/functional_api.py`.

# %%
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import optax

import jaxrl_engine as jre

cfg = jre.load_config(
    None,
    [
        "name=functional_api",
        "env.num_envs=8",
        "algo.num_steps=64",
        "algo.num_minibatches=4",
        "total_env_steps=100000",
        "eval.interval=10",
        "progress=false",
    ],
)
engine = jre.build(cfg)
state = engine.init(jax.random.key(0))

# %% [markdown]
# ## Warm-up: compile every phase ahead of time
# `warm_up` lowers and compiles each phase along the real data flow, checks shapes, and
# records compile time and XLA's cost analysis. Nothing runs, so the state is unchanged.

# %%
state = engine.warm_up(state)
for name, report in engine.compile_report.items():
    print(f"{name:<15} compile {report['compile_s']:5.2f} s   {report['flops'] / 1e6:8.1f} MFLOP")

# %% [markdown]
# ## The phases by hand
# RLightning's epoch order: rollout -> update_dataset -> train -> sync_weights. Each is a
# jitted pure function; `engine.epoch` is the four fused into one compiled call.

# %%
state, m_rollout = engine.rollout(state)
state, m_dataset = engine.update_dataset(state)
state, m_train = engine.train(state)
state, m_sync = engine.sync_weights(state)
_, m_eval = engine.evaluate(state)  # evaluation never advances the state
for metrics in (m_rollout, m_dataset, m_train, m_sync, m_eval):
    print({k: round(float(v), 4) for k, v in metrics.items() if not k.startswith("guard/")})
print("epoch counter:", int(state.counters.epoch), " env steps:", int(state.counters.env_steps))

# %% [markdown]
# ## A hook of your own
# A hook transforms a phase. This one adds the parameter norm to `train`'s metrics; `every(2,
# hook)` applies it where `counters.epoch % 2 == 0` as the phase runs. The counter counts the
# epochs finished before this one, so here the 1st and 3rd epochs (a `lax.cond` inside the
# compiled phase: it costs nothing on the others, whose value is NaN).


# %%
def param_norm(phase):
    def wrapped(state):
        state, metrics = phase(state)
        return state, {**metrics, "train/param_norm": optax.tree.norm(state.train.params)}

    return wrapped


hooked = jre.build(cfg, hooks={"train": [jre.every(2, param_norm)]})
s = hooked.init(jax.random.key(0))
for _ in range(4):
    s, metrics = hooked.epoch(s)
    print(
        f"epoch {int(s.counters.epoch)}: train/param_norm = {float(metrics['train/param_norm']):.3f}"
    )

# %% [markdown]
# ## Many seeds in one compiled call: `jax.jit(jax.vmap(train))`
# `make_train(cfg)` returns a pure `train(key)` (a `lax.scan` over epochs with evaluation every
# `eval.interval` epochs). `vmap` over keys trains 4 seeds at once.

# %%
train = jre.make_train(cfg)
keys = jax.vmap(jax.random.key)(jnp.arange(4))
start = time.perf_counter()
states, metrics = jax.block_until_ready(jax.jit(jax.vmap(train))(keys))
print(
    f"4 seeds x {cfg.total_env_steps:,} env steps in {time.perf_counter() - start:.1f} s (incl. compile)"
)
returns = np.asarray(metrics["evaluate/episode_return"])  # [seed, evaluation]
print("final eval return per seed:", returns[:, -1].round(1))

# %%
epochs_per_eval = cfg.eval.interval
steps_per_epoch = train.engine.steps_per_epoch
eval_steps = (np.arange(returns.shape[1]) + 1) * epochs_per_eval * steps_per_epoch
eval_steps[-1] = min(eval_steps[-1], train.engine.num_epochs * steps_per_epoch)
fig, ax = plt.subplots(figsize=(6, 3.5))
for seed, curve in enumerate(returns):
    ax.plot(eval_steps, curve, alpha=0.5, label=f"seed {seed}")
ax.plot(eval_steps, returns.mean(0), color="black", linewidth=2, label="mean")
ax.set_xlabel("env steps")
ax.set_ylabel("eval return")
ax.legend(fontsize="small")
out = Path(cfg.run_dir) / "functional_api"  # a folder of its own under run_dir, not the cwd
out.mkdir(parents=True, exist_ok=True)
fig.savefig(out / "seeds.png")
print("plot:", out / "seeds.png")
