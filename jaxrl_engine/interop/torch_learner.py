"""A torch learner as PPO's `train` phase: train in torch, act in JAX.

`algo.torch_policy.learner: torch` (with `critic: torch`). Inside the jitted epoch, `train`
hands the batch that `update_dataset` prepared (observations already normalised, actions,
old log-probs and values, advantages, returns) to torch through `jax.experimental.io_callback`;
inside the callback every array reaches torch by DLPack without a copy (`to_torch`, checked
by pointer). A torch optimizer (Adam at the traced `hparams.lr`, annealed as configured, eps 1e-5,
global-norm clipping) runs the same clipped-PPO epochs x minibatches as the JAX learner; the
numeric hyperparameters cross into the callback with the batch. `with_torch_learner(ppo, ...)`
swaps a PPO bundle's `train` for this one (the composition root does it for `learner: torch`). The callback returns the new
weights: that is ONE copy of the weights per epoch (numpy views of torch's storage copied into
XLA's output buffers), counted in `bytes_to_jax`; `sync_weights` then makes them the acting
params of the fast-path (native JAX) policy.

The torch modules and optimizer live on the host, outside `EngineState`: this learner is
stateful (a fresh `engine.init` does not reset torch), and `make_train` cannot `vmap` it over
seeds: that raises a `ValueError` (a `custom_vmap` rule) instead of letting every seed step the
same torch module in turn. Outside jit, `acting_params()` bridges the current
torch weights zero-copy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from jaxrl_engine.algos.ppo import PPOBatch, PPOHParams, PPOState, normalize
from jaxrl_engine.buffers.rollout import Transition
from jaxrl_engine.core.protocols import Algorithm
from jaxrl_engine.interop.dlpack import BridgeReport, from_torch, to_torch
from jaxrl_engine.interop.torch_policy import float_state

if TYPE_CHECKING:
    from jaxrl_engine.interop.torch_policy import TorchActorCritic

HPARAMS = ("lr", "clip_eps", "vf_coef", "ent_coef", "max_grad_norm")
METRICS = (
    "train/loss",
    "train/policy_loss",
    "train/value_loss",
    "train/entropy",
    "train/approx_kl",
    "train/clip_fraction",
    "train/grad_norm",
    "train/lr",
)


class TorchPPOLearner:
    """Clipped PPO in torch over the actor/critic modules of a `TorchActorCritic`."""

    def __init__(
        self,
        network: TorchActorCritic,
        *,
        update_epochs: int,
        num_minibatches: int,
        total_grad_steps: int | None,
        normalize_obs: bool,
    ):
        import torch

        critic = network.critic_module
        if critic is None:
            raise ValueError(
                "algo.torch_policy.learner=torch needs torch modules for actor and critic "
                "(algo.torch_policy.critic=torch)"
            )
        self.discrete, self.normalize_obs = network.discrete, normalize_obs
        self.update_epochs, self.num_minibatches = update_epochs, num_minibatches
        self.actor, self.critic = network.actor_module, critic
        params = [*self.actor.parameters(), *self.critic.parameters()]
        self.log_std = None
        if not network.discrete:
            self.log_std = torch.nn.Parameter(torch.zeros(network.action_dim))
            params.append(self.log_std)
        self.params = params
        self.optimizer = torch.optim.Adam(params, lr=1.0, eps=1e-5)  # lr set per step
        self.total_grad_steps = total_grad_steps  # None: no annealing
        self.steps = 0
        self.bytes_to_jax = 0  # weights copied into XLA by the callback, all epochs together
        self.batch_report = BridgeReport(keep=False)  # how the batches crossed (zero-copy expected)

    # ------------------------------------------------------------- in jit
    def train(
        self,
        train_state: PPOState,
        buffer: Transition,
        batch: PPOBatch,
        key: jax.Array,
        hp: PPOHParams,
    ):
        T, N = buffer.reward.shape
        flat = lambda x: x.reshape((T * N, *x.shape[2:]))  # noqa: E731
        data = (
            flat(normalize(batch.obs_norm, buffer.obs, self.normalize_obs)),
            flat(buffer.action),
            flat(buffer.extras["log_prob"]),
            flat(buffer.extras["value"]),
            flat(batch.advantages),
            flat(batch.returns),
        )
        numbers = jnp.stack(
            [jnp.asarray(getattr(hp, k), jnp.float32) for k in HPARAMS]
        )  # the traced hyperparameters, as one f32[5] for the callback
        seed = jax.random.randint(key, (), 0, np.iinfo(np.int32).max)
        params = train_state.params
        shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
        metric_shapes = {k: jax.ShapeDtypeStruct((), jnp.float32) for k in METRICS}

        @jax.custom_batching.custom_vmap
        def torch_train(data: Any, numbers: jax.Array, seed: jax.Array) -> Any:
            return io_callback(
                self._train_host, (shapes, metric_shapes), data, numbers, seed, ordered=False
            )

        @torch_train.def_vmap
        def _refuse(axis_size, in_batched, data, numbers, seed):
            raise ValueError(
                "algo.torch_policy.learner=torch cannot be vmapped (e.g. make_train over seeds): "
                "one torch module and optimizer would be stepped by every seed in turn. Run one "
                "seed per process, or use learner=jax (the JAX learner vmaps)"
            )

        new_params, metrics = torch_train(data, numbers, seed)
        return train_state.replace(params=new_params), metrics

    # ------------------------------------------------------------- on host
    def _train_host(self, data: tuple[Any, ...], numbers: Any, seed: Any):
        import torch

        hp = dict(zip(HPARAMS, np.asarray(numbers).tolist(), strict=True))
        obs, action, old_log_prob, old_value, adv_all, target_all = to_torch(
            tuple(data), report=self.batch_report
        )
        n = obs.shape[0]
        mb_size = n // self.num_minibatches
        generator = torch.Generator().manual_seed(int(seed))
        sums = dict.fromkeys(METRICS, 0.0)
        count = 0
        self.actor.train()
        self.critic.train()
        for _ in range(self.update_epochs):
            perm = torch.randperm(n, generator=generator)
            for idx in perm[: mb_size * self.num_minibatches].split(mb_size):
                metrics = self._minibatch(
                    hp,
                    obs[idx],
                    action[idx],
                    old_log_prob[idx],
                    old_value[idx],
                    adv_all[idx],
                    target_all[idx],
                )
                for k, v in metrics.items():
                    sums[k] += v
                count += 1
        self.actor.eval()
        self.critic.eval()
        out = self._weights_numpy()
        self.bytes_to_jax += sum(a.nbytes for a in jax.tree.leaves(out))
        means = {k: np.float32(v / max(count, 1)) for k, v in sums.items()}
        # the learning rate of the last update, as the JAX learner logs it (not a mean)
        means["train/lr"] = np.float32(self.optimizer.param_groups[0]["lr"])
        return out, means

    def _minibatch(
        self, hp: dict[str, float], obs, action, old_log_prob, old_value, adv, target
    ) -> dict[str, float]:
        import torch

        clip_eps = hp["clip_eps"]
        head = self.actor(obs)
        value = self.critic(obs)[..., 0]
        if self.discrete:
            dist: Any = torch.distributions.Categorical(logits=head)
            log_prob = dist.log_prob(action.long())
            entropy = dist.entropy().mean()
        else:
            assert self.log_std is not None
            std = self.log_std.exp().expand_as(head)
            dist = torch.distributions.Normal(head, std)
            log_prob = dist.log_prob(action.reshape(head.shape)).sum(-1)
            entropy = dist.entropy().sum(-1).mean()
        value_clipped = old_value + (value - old_value).clamp(-clip_eps, clip_eps)
        value_loss = (
            0.5 * torch.maximum((value - target) ** 2, (value_clipped - target) ** 2).mean()
        )
        ratio = (log_prob - old_log_prob).exp()
        adv = (adv - adv.mean()) / (adv.std(unbiased=False) + 1e-8)
        clipped = ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps)
        policy_loss = -torch.minimum(ratio * adv, clipped * adv).mean()
        loss = policy_loss + hp["vf_coef"] * value_loss - hp["ent_coef"] * entropy
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, hp["max_grad_norm"])
        anneal = 1.0
        if self.total_grad_steps:
            anneal = max(0.0, 1.0 - self.steps / self.total_grad_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = hp["lr"] * anneal
        self.optimizer.step()
        self.steps += 1
        with torch.no_grad():
            approx_kl = ((ratio - 1.0) - ratio.log()).mean()
            clip_frac = ((ratio - 1.0).abs() > clip_eps).float().mean()
        return {
            "train/loss": float(loss.detach()),
            "train/policy_loss": float(policy_loss.detach()),
            "train/value_loss": float(value_loss.detach()),
            "train/entropy": float(entropy.detach()),
            "train/approx_kl": float(approx_kl),
            "train/clip_fraction": float(clip_frac),
            "train/grad_norm": float(grad_norm),
        }

    def _weights_numpy(self) -> dict[str, Any]:
        """The learner's weights in the layout of `PPOState.params` (numpy views, no copy)."""
        out: dict[str, Any] = {
            "actor": {k: v.detach().numpy() for k, v in float_state(self.actor).items()},
            "critic": {k: v.detach().numpy() for k, v in float_state(self.critic).items()},
        }
        if self.log_std is not None:
            out["log_std"] = self.log_std.detach().numpy()
        return out

    def acting_params(self, report: BridgeReport | None = None) -> dict[str, Any]:
        """The current torch weights as JAX params, zero-copy (outside jit)."""
        out: dict[str, Any] = {
            "actor": from_torch(float_state(self.actor), report=report),
            "critic": from_torch(float_state(self.critic), report=report),
        }
        if self.log_std is not None:
            out["log_std"] = from_torch(self.log_std, detach=True, report=report)
        return out


def with_torch_learner(
    algorithm: Algorithm,
    network: TorchActorCritic,
    *,
    update_epochs: int,
    num_minibatches: int,
    total_grad_steps: int | None,
    normalize_obs: bool,
) -> Algorithm:
    """A PPO bundle whose `train` runs in torch (`static["torch_learner"]` is the learner)."""
    learner = TorchPPOLearner(
        network,
        update_epochs=update_epochs,
        num_minibatches=num_minibatches,
        total_grad_steps=total_grad_steps,
        normalize_obs=normalize_obs,
    )
    return algorithm._replace(
        train=learner.train, static={**algorithm.static, "torch_learner": learner}
    )
