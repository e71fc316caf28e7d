"""Train a torch policy with the JAX engine, then use it in plain torch.

1. Your own `nn.Sequential` actor (any Linear/Conv2d/LayerNorm/activation stack) becomes PPO's
   acting policy on the fast path: its weights are bridged into native JAX ops, so rollout and
   the PPO update run compiled (`path="universal"` would call any module through a callback).
2. The engine trains it on gymnax CartPole-v1 (`engine.run`: progress, eval, run directory).
3. `export_to_torch` writes the trained weights back into the torch module, which then drives
   the torch-native `TorchCartPole` with no JAX involved.
4. The same engine acts in the torch simulator through the host adapter (`TorchSimRollout`):
   observations and actions cross by DLPack without copies.

    .venv/bin/python examples/torch_policy.py [--steps 300000] [--path fast|universal]

The config-file route to the same thing is `configs/ppo_torch_policy.yaml`:
    .venv/bin/jaxrl-engine train configs/ppo_torch_policy.yaml
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax
import torch
from torch import nn

import jaxrl_engine as jre
from jaxrl_engine.compose import num_epochs
from jaxrl_engine.envs import make_env
from jaxrl_engine.interop.torch_env import TorchCartPole, TorchSimRollout
from jaxrl_engine.interop.torch_policy import TorchActorCritic


def make_actor() -> nn.Sequential:
    """A user's own torch policy: CartPole observation (4) -> 2 action logits."""
    actor = nn.Sequential(
        nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2)
    )
    nn.init.orthogonal_(actor[-1].weight, 0.01)  # near-uniform first policy, as CleanRL does
    nn.init.zeros_(actor[-1].bias)
    return actor


def torch_episode_return(actor: nn.Module, num_envs: int = 16) -> float:
    """Mean return of the torch module alone (greedy) on the torch CartPole."""
    sim = TorchCartPole(num_envs, seed=123)
    obs, ret = sim.reset(), torch.zeros(num_envs)
    active = torch.ones(num_envs, dtype=torch.bool)
    with torch.no_grad():
        for _ in range(sim.max_steps):
            obs, reward, terminated, truncated, _ = sim.step(actor(obs).argmax(-1))
            ret += torch.where(active, reward, 0.0)
            active &= ~(terminated | truncated)
    return float(ret.mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300_000, help="env steps to train")
    parser.add_argument("--path", choices=["fast", "universal"], default="fast")
    args = parser.parse_args()

    torch.manual_seed(0)
    actor = make_actor()
    print(f"torch actor before training: return {torch_episode_return(actor):.1f}")

    cfg = jre.load_config(
        Path(__file__).resolve().parents[1] / "configs" / "ppo_cartpole.yaml",  # (any cwd)
        [f"total_env_steps={args.steps}", "name=example_torch_policy", "progress=false"],
    )
    env = make_env(cfg.env.id)
    spec = env.spec(env.params)
    network = TorchActorCritic(actor, action_dim=2, discrete=True, path=args.path)
    algorithm = cfg.algo.build(spec, cfg.env.num_envs, num_epochs(cfg), network=network)
    engine = jre.build(cfg, env=env, algorithm=algorithm)
    state, summary = engine.run(engine.init(jax.random.key(cfg.seed)))
    print(f"engine: final eval return {summary['final_eval_return']:.1f}")

    written = network.export_to_torch(state.train.params)
    print(f"exported {written} bytes of trained weights into the torch module")
    print(f"torch actor after training: return {torch_episode_return(actor):.1f}")

    host = TorchSimRollout(engine, TorchCartPole(cfg.env.num_envs, seed=7))
    ret = host.evaluate(state, TorchCartPole(16, seed=8), max_steps=500)
    state, _ = host.rollout(state)
    print(
        f"JAX policy in the torch simulator: return {ret:.1f}; one host rollout moved "
        f"{host.report.zero_copy_bytes} bytes zero-copy, copied {host.report.copied_bytes}"
    )


if __name__ == "__main__":
    main()
