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


class TorchPolicyError(ValueError):
    """The torch policy of `algo.torch_policy` cannot be set up (factory, kwargs or shapes)."""


def first_line(e: BaseException) -> str:
    """`Type: first line of the message` (at most 200 characters) for one-line reports."""
    text = str(e).strip()
    line = text.splitlines()[0] if text else ""
    line = line if len(line) <= 200 else line[:197] + "..."
    return f"{type(e).__name__}: {line}" if line else type(e).__name__


def resolve_factory(spec: str) -> Callable[..., Any]:
    """`"package.module:function"` -> the function; `TorchPolicyError` naming what failed."""
    where = f"algo.torch_policy.factory {spec!r}"
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise TorchPolicyError(
            f"{where} must be 'package.module:function', e.g. 'jaxrl_engine.interop.torch_nets:mlp'"
        )
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is None or not (module_name + ".").startswith(e.name + "."):
            msg = f"{where}: importing {module_name!r} raised {first_line(e)}"
            raise TorchPolicyError(msg) from None
        if module_name.endswith(".py") or "/" in module_name:
            raise TorchPolicyError(
                f"{where}: name a module in dotted form ('nets:make' for nets.py), not a file"
            ) from None
        raise TorchPolicyError(
            f"{where}: no module named {e.name!r}; the module must be importable: installed, "
            "or in a directory on PYTHONPATH (the jaxrl-engine command does not search the "
            "current directory: run PYTHONPATH=. jaxrl-engine ... for a module there)"
        ) from None
    except Exception as e:  # the module's own code failed
        raise TorchPolicyError(
            f"{where}: importing {module_name!r} raised {first_line(e)}"
        ) from None
    if not hasattr(module, attr):
        raise TorchPolicyError(f"{where}: module {module_name} has no {attr!r}")
    fn = getattr(module, attr)
    if not callable(fn):
        raise TorchPolicyError(f"{where}: {attr} is not callable ({type(fn).__name__})")
    return fn
