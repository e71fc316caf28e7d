# %% [markdown]
# # A torch policy trained by the JAX engine, deployed in torch
#
# Your own `torch.nn.Module` can be PPO's acting policy. On the **fast path** its weights are
# bridged by DLPack into native JAX ops, so rollout and the PPO update run compiled at JAX
# speed; the **universal path** would call any module through a host callback. After training,
# the weights go back into the module, which then runs with no JAX at all. (The command-line
# route is `configs/ppo_torch_policy.yaml`; `examples/torch_policy.py` is a longer script.)
# Plain-script twin: `examples/torch_interop.py`. Needs torch (`pip install 'jaxrl-engine[torch]'`).

# %%
import jax
import torch
from torch import nn

import jaxrl_engine as jre
from jaxrl_engine.compose import num_epochs
from jaxrl_engine.envs import make_env
from jaxrl_engine.export.evaluate import evaluate_run
from jaxrl_engine.interop import from_torch, shares_memory
from jaxrl_engine.interop.torch_env import TorchCartPole
from jaxrl_engine.interop.torch_policy import TorchActorCritic

torch.manual_seed(0)
actor = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2))
nn.init.orthogonal_(actor[-1].weight, 0.01)  # near-uniform first policy
nn.init.zeros_(actor[-1].bias)

# %% [markdown]
# ## Zero-copy: torch tensors as JAX arrays
# `from_torch` maps a pytree of torch tensors to JAX arrays through DLPack; on CPU (and on one
# GPU) they share memory.

# %%
weights = from_torch(dict(actor.state_dict()))
print({name: tuple(w.shape) for name, w in weights.items()})
print("shares memory with torch:", shares_memory(weights["0.weight"], actor[0].weight))


# %% [markdown]
# ## Train it with the engine
# `TorchActorCritic` puts the module behind the network interface PPO uses (a flax critic beside
# it); the PPO algorithm is injected into `jre.build`.


# %%
def greedy_return(module, episodes=16):
    """Mean return of the torch module alone on a torch CartPole (no JAX involved)."""
    sim = TorchCartPole(episodes, seed=123)
    obs, total = sim.reset(), torch.zeros(episodes)
    active = torch.ones(episodes, dtype=torch.bool)
    with torch.no_grad():
        for _ in range(sim.max_steps):
            obs, reward, terminated, truncated, _ = sim.step(module(obs).argmax(-1))
            total += torch.where(active, reward, 0.0)
            active &= ~(terminated | truncated)
    return float(total.mean())


print(f"torch actor before training: return {greedy_return(actor):.1f}")
cfg = jre.load_config(None, ["name=torch_interop", "total_env_steps=150000", "progress=false"])
env = make_env(cfg.env.id)
network = TorchActorCritic(actor, action_dim=2, discrete=True, path="fast")
algorithm = cfg.algo.build(env.spec(env.params), cfg.env.num_envs, num_epochs(cfg), network=network)
engine = jre.build(cfg, env=env, algorithm=algorithm)
state, summary = engine.run(engine.init(jax.random.key(cfg.seed)))
print(f"engine: eval return {summary['final_eval_return']:.1f}")

# %% [markdown]
# ## Back to torch
# `export_to_torch` writes the trained JAX params into the module's own storage (one copy per
# tensor, so the module never aliases buffers JAX may free). The module then plays CartPole in
# plain torch.

# %%
written = network.export_to_torch(state.train.params)
print(f"wrote {written:,} bytes of trained weights into the torch module")
print(f"torch actor after training: return {greedy_return(actor):.1f}")

# %% [markdown]
# The run also exported its JAX artefact (the fast path is plain JAX ops, so `jax.export`
# serializes it): `runs/torch_interop/policy/`, playable with `jaxrl-engine eval`.

# %%
stats = evaluate_run(summary["run_dir"], episodes=16)
print(f"exported policy, 16 episodes: return {stats['return_mean']:.1f}")
