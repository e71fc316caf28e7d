"""Torch network factories that configs name (`algo.torch_policy.factory`).

A factory is `factory(in_shape, out_dim, out_scale, **kwargs) -> nn.Module`; the engine calls
it for the actor (out_dim = action dim, out_scale 0.01) and, with `critic: torch`, for the
critic (out_dim 1, out_scale 1.0). Any importable function with that signature works:
`"my_package.nets:make_policy"`.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import math
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from jaxrl_engine.io.user_code import first_line, import_from_here

TORCH_ACTIVATIONS = ("tanh", "relu", "gelu", "silu")


@contextlib.contextmanager
def _float32_default() -> Iterator[None]:
    """Layers built (and initialised) in float32 whatever `torch.set_default_dtype` says: the
    same weights as in a process that never changed it (a decorator of the factories)."""
    import torch

    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


@_float32_default()
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


@_float32_default()
def cnn(
    in_shape: Sequence[int],
    out_dim: int,
    out_scale: float = 1.0,
    channels: Sequence[int] = (16, 32),
    hidden: int = 64,
    obs_layout: str = "hwc",
    in_channels: int | None = None,
) -> Any:
    """Conv2d stack (3x3, stride 2) + LayerNorm + MLP head for image observations.

    obs_layout: the axis order of `in_shape`: "hwc" ([H, W, C], gymnax and gymnasium; a
    `ChannelsFirst` layer comes first) or "chw" ([C, H, W], EnvPool). The engine passes the
    env spec's layout, or `algo.torch_policy.obs_layout`. ValueError when the shape contradicts
    the layout: `in_channels` (if given) is not the size of the layout's channel axis, or the
    two axes the layout calls height and width are not square while the other pair is (e.g.
    [10, 10, 4] read as chw would build Conv2d(10, ...) over 10x4 images).
    """
    from torch import nn

    from jaxrl_engine.interop.torch_layers import ChannelsFirst

    shape = tuple(int(n) for n in in_shape)
    check_image_layout(shape, obs_layout, in_channels)
    h, w, c = shape if obs_layout == "hwc" else (shape[1], shape[2], shape[0])
    layers: list[nn.Module] = [ChannelsFirst()] if obs_layout == "hwc" else []
    for out_c in channels:
        layers += [_orthogonal(nn.Conv2d(c, out_c, 3, stride=2, padding=1), math.sqrt(2))]
        layers.append(nn.ReLU())
        c, h, w = out_c, (h + 1) // 2, (w + 1) // 2
    layers += [nn.Flatten(), nn.LayerNorm(c * h * w)]
    layers += [_orthogonal(nn.Linear(c * h * w, hidden), math.sqrt(2)), nn.ReLU()]
    layers.append(_orthogonal(nn.Linear(hidden, out_dim), out_scale))
    return nn.Sequential(*layers)


def check_image_layout(
    shape: tuple[int, ...], obs_layout: str, in_channels: int | None = None
) -> None:
    """ValueError when image observations of `shape` cannot be in `obs_layout` (see `cnn`)."""
    if obs_layout not in ("hwc", "chw"):
        raise ValueError(f"obs_layout={obs_layout!r}: valid choices 'hwc', 'chw'")
    if len(shape) != 3:
        raise ValueError(
            f"observations of shape {list(shape)} are not images ([H, W, C] or [C, H, W])"
        )
    channels = shape[2] if obs_layout == "hwc" else shape[0]
    if in_channels is not None and in_channels != channels:
        raise ValueError(
            f"in_channels={in_channels}, but observations {list(shape)} read as "
            f"{obs_layout} have {channels} channels"
        )
    other = "chw" if obs_layout == "hwc" else "hwc"
    square_as_other = shape[1] == shape[2] if obs_layout == "hwc" else shape[0] == shape[1]
    square_as_given = shape[0] == shape[1] if obs_layout == "hwc" else shape[1] == shape[2]
    if square_as_other and not square_as_given:
        raise ValueError(
            f"observations {list(shape)} look {other} (a square image), not {obs_layout}: "
            f"set algo.torch_policy.obs_layout={other}"
        )


def _orthogonal(layer: Any, gain: float) -> Any:
    from torch import nn

    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class TorchPolicyError(ValueError):
    """The torch policy of `algo.torch_policy` cannot be set up (factory, kwargs or shapes)."""


def _module_from_file(where: str, path: Path) -> Any:
    """The module that the Python file `path` defines, loaded under a name of its own."""
    if not path.is_file():
        raise TorchPolicyError(f"{where}: no file {str(path)!r} (from {os.getcwd()})")
    resolved = path.resolve()
    name = f"_jaxrl_engine_factory_{resolved.stem}_{abs(hash(str(resolved))):x}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, resolved)
    if spec is None or spec.loader is None:
        raise TorchPolicyError(f"{where}: {str(path)!r} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def resolve_factory(spec: str) -> Callable[..., Any]:
    """`"package.module:function"` or `"path/to/nets.py:function"` -> the function;
    `TorchPolicyError` naming what failed. A dotted module is imported as Python would, then
    (not found) from the current directory, as `python -m` would; a file path is loaded as a
    module of its own."""
    where = f"algo.torch_policy.factory {spec!r}"
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise TorchPolicyError(
            f"{where} must be 'package.module:function' or 'path/to/file.py:function', e.g. "
            "'jaxrl_engine.interop.torch_nets:mlp'"
        )
    try:
        if module_name.endswith(".py") or os.sep in module_name or "/" in module_name:
            module = _module_from_file(where, Path(module_name))
        else:
            module = import_from_here(module_name)
    except TorchPolicyError:
        raise
    except ModuleNotFoundError as e:
        if e.name is None or not (module_name + ".").startswith(e.name + "."):
            msg = f"{where}: importing {module_name!r} raised {first_line(e)}"
            raise TorchPolicyError(msg) from None
        raise TorchPolicyError(
            f"{where}: no module named {e.name!r}, installed or in the current directory "
            f"({os.getcwd()}); name its file instead, e.g. 'path/to/{e.name}.py:{attr}'"
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
