"""Torch interoperability through DLPack: data, weights, policies, learners and simulators.

Importing `jaxrl_engine` never imports torch; these modules import it when first used
(`pip install 'jaxrl-engine[torch]'`).

- `dlpack`: `from_torch` / `to_torch` over pytrees with `copy="never" | "if_needed" | "always"`,
  every trap of NOTES-jax-torch.md as an error or a reported copy (`BridgeReport`),
  `shares_memory`, `check_donatable`.
- `convert`: the fast path's translator (`module_to_jax`): nn.Sequential stacks, and modules
  whose forward composes supported layers (traced with torch.fx).
- `torch_policy`: `TorchFunction` (fast or universal path), `TorchActorCritic` (PPO's network;
  `algo.torch_policy` in the config), `export_to_torch`.
- `torch_learner`: `TorchPPOLearner`, PPO's `train` phase in torch (`learner: torch`).
- `torch_env`: `TorchCartPole` and `TorchSimRollout`, the host adapter for torch batch simulators.

Where weights cross, and what it costs:

| from -> to | how | copies |
| --- | --- | --- |
| torch module -> fast/universal params, at `init` | `TorchFunction.params()` then `jnp.array` | one, so the learner never aliases torch (donation stays valid) |
| torch learner -> JAX actor, inside the jitted epoch | the `train` io_callback returns the weights | one per epoch, counted in `TorchPPOLearner.bytes_to_jax` |
| torch learner -> JAX, outside jit | `TorchPPOLearner.acting_params()` | none (DLPack) |
| JAX learner -> JAX actor | `sync_weights` (inside jit); `acting_dtype: bfloat16` makes a cast copy | at most one (XLA may share the buffer); a cast is one |
| JAX learner -> torch actor | `export_to_torch` / `TorchActorCritic.export_to_torch` into the module's own storage (casting to its dtype) | one; `to_torch` alone is zero-copy |
"""

from jaxrl_engine.interop.dlpack import (
    BridgeError,
    BridgeReport,
    Transfer,
    check_donatable,
    from_torch,
    shares_memory,
    to_torch,
    to_torch_shards,
    torch_views,
)

__all__ = [
    "BridgeError",
    "BridgeReport",
    "Transfer",
    "check_donatable",
    "from_torch",
    "shares_memory",
    "to_torch",
    "to_torch_shards",
    "torch_views",
]
