# %% [markdown]
# # Offload and timing
#
# `offload: true` installs RLightning's placement: idle acting params, learner params and
# optimizer state live in host memory (`pinned_host`) between the phases that use them, moved
# by `jax.device_put` inside the compiled phases. `profile: true` runs the four epoch phases as
# separate compiled calls, each timed after `block_until_ready`, and prints RLightning's timing
# table. On a CPU both memory kinds are host RAM, so this shows the mechanics; on a GPU the
# offloaded bytes leave device memory. Plain-script twin: `examples/offload_and_timing.py`.

# %%
import jax
import numpy as np

import jaxrl_engine as jre

SMALL = ["env.num_envs=8", "algo.num_steps=64", "total_env_steps=40000", "eval.interval=20"]


def run(*overrides):
    cfg = jre.load_config(None, [*SMALL, "progress=false", *overrides])
    engine = jre.build(cfg)
    state, summary = engine.run(engine.init(jax.random.key(0)))
    return engine, state, summary


# %% [markdown]
# ## Where the state lives
# With offload, the parts RLightning offloads sit in `pinned_host` memory between epochs;
# the env batch, buffers and counters stay on the device.


# %%
def memory_kinds(tree):
    return sorted({leaf.sharding.memory_kind for leaf in jax.tree.leaves(tree)})


offload_engine, offloaded, offload_summary = run("name=offload", "offload=true")
for part in ("eval_params", "train.params", "train.opt_state", "env", "buffer"):
    node = offloaded
    for attr in part.split("."):
        node = getattr(node, attr)
    print(f"{part:<16} {memory_kinds(node)}")

# %% [markdown]
# Offload changes where arrays live, not what is computed: the same seed gives the same
# training with and without it.

# %%
plain_engine, plain, plain_summary = run("name=no_offload")
same = all(
    np.allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    for a, b in zip(
        jax.tree.leaves(plain.train.params), jax.tree.leaves(offloaded.train.params), strict=True
    )
)
print("same learner params with and without offload:", same)
for name, summary in (("offload", offload_summary), ("no offload", plain_summary)):
    print(f"{name:<11} final eval return {summary['final_eval_return']:.1f}")

# %% [markdown]
# ## Timing per phase
# `profile: true`: each phase is its own compiled call with a timer (same results as the
# fused epoch); `engine.timing_summary()` prints count, total and average per phase.

# %%
profile_engine, _, profile_summary = run("name=profile", "profile=true", "offload=true")
profile_engine.timing_summary()
print()
print("compile seconds per phase:")
for name, report in profile_engine.compile_report.items():
    print(f"  {name:<15} {report['compile_s']:.2f} s")
print(f"steps/s (offload, profiled): {profile_summary['steps_per_second']:,.0f}")
print(f"steps/s (offload, fused):    {offload_summary['steps_per_second']:,.0f}")
print(f"steps/s (no offload, fused): {plain_summary['steps_per_second']:,.0f}")
