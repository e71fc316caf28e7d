"""A policy exported by jaxrl_engine as a torch module; needs only torch (not jaxrl_engine).

    import torch_policy                             # this file, from the policy directory
    policy = torch_policy.load()                    # or torch_policy.load("path/to/policy")
    action = policy(obs)                            # obs: [batch, *obs_shape] torch tensor

The module is the actor of the trained MLP policy with its weights (`torch_policy.pt`, a state
dict): observation normalisation (when it was on), the MLP, then the deterministic action
(argmax for discrete actions; the mean clipped to the action bounds for continuous ones), i.e.
the action the engine's `evaluate` sends to the env.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "tanh": nn.Tanh,
    "relu": nn.ReLU,
    "gelu": lambda: nn.GELU(approximate="tanh"),  # flax's nn.gelu is the tanh approximation
    "silu": nn.SiLU,
}


class Policy(nn.Module):
    """obs [batch, *obs_shape] -> action [batch, *action_shape] (int64 index, or float)."""

    obs_mean: torch.Tensor
    obs_var: torch.Tensor
    low: torch.Tensor
    high: torch.Tensor

    def __init__(self, spec: dict[str, Any]):
        super().__init__()
        self.spec = spec
        sizes = [spec["in_features"], *spec["hidden_sizes"], spec["out_features"]]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(sizes))
        self.activation = ACTIVATIONS[spec["activation"]]()
        obs_shape = tuple(spec["obs_shape"])
        self.register_buffer("obs_mean", torch.zeros(obs_shape))
        self.register_buffer("obs_var", torch.ones(obs_shape))
        if not spec["discrete"]:
            self.register_buffer("low", torch.tensor(spec["low"]).reshape(spec["action_shape"]))
            self.register_buffer("high", torch.tensor(spec["high"]).reshape(spec["action_shape"]))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        want = tuple(self.spec["obs_shape"])
        if tuple(obs.shape[1:]) != want or obs.dim() != len(want) + 1:
            one = " (one observation: obs[None])" if tuple(obs.shape) == want else ""
            raise ValueError(
                f"policy(obs): obs has shape {list(obs.shape)}, this policy takes "
                f"[batch{''.join(f', {d}' for d in want)}]{one}"
            )
        x = obs.to(torch.float32)
        if self.spec["normalize_obs"]:
            x = torch.clamp((x - self.obs_mean) / torch.sqrt(self.obs_var + 1e-8), -10.0, 10.0)
        x = x.reshape(x.shape[0], self.spec["in_features"])
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = self.activation(x)
        if self.spec["discrete"]:
            return torch.argmax(x, dim=-1)
        action = x.reshape(x.shape[0], *self.spec["action_shape"])
        return torch.minimum(torch.maximum(action, self.low), self.high)


def load(directory: str | Path | None = None) -> Policy:
    """The torch policy of the directory (default: the directory holding this file), in eval mode."""
    directory = Path(directory) if directory is not None else Path(__file__).resolve().parent
    spec = _read(directory / "meta.json", lambda p: json.loads(p.read_text())["torch"])
    policy = Policy(spec)
    state = _read(directory / "torch_policy.pt", lambda p: torch.load(p, weights_only=True))
    _read(directory / "torch_policy.pt", lambda _: policy.load_state_dict(state))
    return policy.eval()


def _read(path: Path, read: Any) -> Any:
    """`read(path)`; a file missing, damaged or not this format is an error naming it."""
    try:
        return read(path)
    except Exception as e:  # (json, zipfile and torch each raise their own)
        raise ValueError(
            f"{path} cannot be read as a policy file ({type(e).__name__}: {e}); export the "
            "policy again (jaxrl-engine export RUN_DIR)"
        ) from e
