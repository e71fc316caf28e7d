"""Torch network factories that configs name (`algo.torch_policy.factory`).

A factory is `factory(in_shape, out_dim, out_scale, **kwargs) -> nn.Module`; the engine calls
it for the actor (out_dim = action dim, out_scale 0.01) and, with `critic: torch`, for the
critic (out_dim 1, out_scale 1.0). Any importable function with that signature works:
`"my_package.nets:make_policy"`.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Sequence
from typing import Any

TORCH_ACTIVATIONS = ("tanh", "relu", "gelu", "silu")


def mlp(
    in_shape: Sequence[int],
    out_dim: int,
    out_scale: float = 1.0,
    hidden_sizes: Sequence[int] = (64, 64),
    activation: str = "tanh",
) -> Any:
    """nn.Sequential MLP with CleanRL's orthogonal init (sqrt 2 hidden, `out_scale` last)."""
    from torch import nn

    acts = {"tanh": nn.Tanh, "relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU}
    if activation not in acts:
        raise ValueError(f"activation {activation!r}: valid choices {sorted(acts)}")
    layers: list[nn.Module] = [nn.Flatten()] if len(in_shape) > 1 else []
    width = math.prod(in_shape)
    for hidden in hidden_sizes:
        layers += [_orthogonal(nn.Linear(width, hidden), math.sqrt(2)), acts[activation]()]
        width = hidden
    layers.append(_orthogonal(nn.Linear(width, out_dim), out_scale))
    return nn.Sequential(*layers)


def cnn(
    in_shape: Sequence[int],
    out_dim: int,
    out_scale: float = 1.0,
    channels: Sequence[int] = (16, 32),
    hidden: int = 64,
) -> Any:
    """Conv2d stack (3x3, stride 2) + LayerNorm + MLP head for [C, H, W] observations."""
    from torch import nn

    c, h, w = in_shape
    layers: list[nn.Module] = []
    for out_c in channels:
        layers += [_orthogonal(nn.Conv2d(c, out_c, 3, stride=2, padding=1), math.sqrt(2))]
        layers.append(nn.ReLU())
        c, h, w = out_c, (h + 1) // 2, (w + 1) // 2
    layers += [nn.Flatten(), nn.LayerNorm(c * h * w)]
    layers += [_orthogonal(nn.Linear(c * h * w, hidden), math.sqrt(2)), nn.ReLU()]
    layers.append(_orthogonal(nn.Linear(hidden, out_dim), out_scale))
    return nn.Sequential(*layers)


def _orthogonal(layer: Any, gain: float) -> Any:
    from torch import nn

    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def resolve_factory(spec: str) -> Callable[..., Any]:
    """`"package.module:function"` -> the function (errors name the spec and what failed)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(
            f"torch factory {spec!r} must be 'package.module:function', "
            "e.g. 'jaxrl_engine.interop.torch_nets:mlp'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"torch factory {spec!r}: cannot import {module_name!r}: {e}") from e
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"torch factory {spec!r}: {module_name} has no function {attr!r}")
    return fn
