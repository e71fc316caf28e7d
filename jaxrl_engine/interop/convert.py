"""The fast path's converter: a torch `nn.Sequential` -> a native JAX function of its weights.

`module_to_jax(module)` returns `(apply, params)`: `params` is the module's state dict bridged
by DLPack (zero-copy: the arrays alias torch's live weights), `apply(params, x)` is pure JAX
(jit/vmap/grad work) and computes what `module(x)` computes in eval mode. Weights keep
torch's layouts (Linear [out, in], Conv2d OIHW), contracted with `lax.dot_general` /
`lax.conv_general_dilated`, so bridging needs no transpose and jit sees default layouts: an
MLP compiles with no transpose at all. (XLA:CPU itself runs convolutions in NHWC, so a Conv2d
layer's NCHW activations and OIHW weights are re-laid out inside the compiled call; that is
XLA's choice for any NCHW convolution, not the bridge's.)

Supported: `nn.Sequential` (nested) of Linear, Conv2d, LayerNorm, Flatten, Identity, Dropout
(identity: acting is eval mode), the activations in `ACTIVATIONS` and `torch_layers.ChannelsFirst`
(a transpose: a CNN on [H, W, C] observations puts it before its first Conv2d, so the conv
layers and the flatten before the first Linear see torch's NCHW order in both paths). Anything else raises
`UnsupportedModuleError` naming the module and pointing to the universal path (any module,
called through a callback). PyPI `torch2jax` 0.1.0 also translates modules with our pins (its
t2j direction works; its j2t calls the removed `jax.dlpack.to_dlpack`); we keep this small
converter because it refuses what it cannot translate up front and keeps torch's layouts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
from jax import lax

from jaxrl_engine.interop.dlpack import BridgeReport, from_torch

if TYPE_CHECKING:
    import torch

Params = dict[str, jax.Array]
Layer = Callable[[Params, jax.Array], jax.Array]


class UnsupportedModuleError(TypeError):
    """The fast path cannot translate this module; the universal path can run it."""


def _activations() -> dict[type, Callable[[Any], Callable[[jax.Array], jax.Array]]]:
    from torch import nn

    return {
        nn.ReLU: lambda m: jax.nn.relu,
        nn.Tanh: lambda m: jnp.tanh,
        nn.Sigmoid: lambda m: jax.nn.sigmoid,
        nn.SiLU: lambda m: jax.nn.silu,
        nn.GELU: lambda m: lambda x: jax.nn.gelu(x, approximate=m.approximate == "tanh"),
        nn.ELU: lambda m: lambda x: jax.nn.elu(x, m.alpha),
        nn.LeakyReLU: lambda m: lambda x: jax.nn.leaky_relu(x, m.negative_slope),
        nn.Softplus: lambda m: (
            lambda x: jnp.where(x * m.beta > m.threshold, x, jax.nn.softplus(x * m.beta) / m.beta)
        ),
        nn.Mish: lambda m: lambda x: x * jnp.tanh(jax.nn.softplus(x)),
        nn.Softmax: lambda m: lambda x: jax.nn.softmax(x, axis=m.dim if m.dim is not None else -1),
        nn.LogSoftmax: lambda m: (
            lambda x: jax.nn.log_softmax(x, axis=m.dim if m.dim is not None else -1)
        ),
        nn.Identity: lambda m: lambda x: x,
        nn.Dropout: lambda m: lambda x: x,
    }


SUPPORTED = (
    "Sequential, Linear, Conv2d, LayerNorm, Flatten, Identity, Dropout, ReLU, Tanh, Sigmoid, "
    "SiLU, GELU, ELU, LeakyReLU, Softplus, Mish, Softmax, LogSoftmax, ChannelsFirst"
)


def _linear(prefix: str, m: torch.nn.Linear) -> Layer:
    def apply(p: Params, x: jax.Array) -> jax.Array:
        w = p[f"{prefix}weight"]  # [out, in], torch's layout: contract `in` on both
        y = lax.dot_general(x, w, (((x.ndim - 1,), (1,)), ((), ())))
        return y + p[f"{prefix}bias"] if m.bias is not None else y

    return apply


def _conv2d(prefix: str, m: torch.nn.Conv2d) -> Layer:
    if m.padding_mode != "zeros":
        raise UnsupportedModuleError(
            f"module {prefix[:-1] or '<root>'}: Conv2d padding_mode={m.padding_mode!r} is not "
            "supported by the fast path (only 'zeros'); use the universal path "
            "(algo.torch_policy.path=universal)"
        )
    if isinstance(m.padding, str):
        padding: Any = m.padding.upper()
    else:
        padding = [(int(p), int(p)) for p in m.padding]

    def apply(p: Params, x: jax.Array) -> jax.Array:
        y = lax.conv_general_dilated(
            x,
            p[f"{prefix}weight"],
            window_strides=tuple(m.stride),
            padding=padding,
            rhs_dilation=tuple(m.dilation),
            dimension_numbers=("NCHW", "OIHW", "NCHW"),
            feature_group_count=m.groups,
        )
        return y + p[f"{prefix}bias"][:, None, None] if m.bias is not None else y

    return apply


def _layer_norm(prefix: str, m: torch.nn.LayerNorm) -> Layer:
    axes = tuple(range(-len(m.normalized_shape), 0))

    def apply(p: Params, x: jax.Array) -> jax.Array:
        mean = x.mean(axes, keepdims=True)
        var = ((x - mean) ** 2).mean(axes, keepdims=True)
        y = (x - mean) * lax.rsqrt(var + m.eps)
        if m.elementwise_affine:
            y = y * p[f"{prefix}weight"]
            if m.bias is not None:
                y = y + p[f"{prefix}bias"]
        return y

    return apply


def _flatten(m: torch.nn.Flatten) -> Layer:
    def apply(p: Params, x: jax.Array) -> jax.Array:
        start = m.start_dim % x.ndim
        end = m.end_dim % x.ndim
        return x.reshape((*x.shape[:start], -1, *x.shape[end + 1 :]))

    return apply


def _layers(module: torch.nn.Module, prefix: str) -> list[Layer]:
    from torch import nn

    from jaxrl_engine.interop.torch_layers import ChannelsFirst

    if isinstance(module, nn.Sequential):
        out: list[Layer] = []
        for name, child in module.named_children():
            out += _layers(child, f"{prefix}{name}.")
        return out
    if type(module) is nn.Linear:
        return [_linear(prefix, module)]
    if type(module) is nn.Conv2d:
        return [_conv2d(prefix, module)]
    if type(module) is nn.LayerNorm:
        return [_layer_norm(prefix, module)]
    if type(module) is nn.Flatten:
        return [_flatten(module)]
    if type(module) is ChannelsFirst:
        return [lambda p, x: jnp.moveaxis(x, -1, -3)]
    activation = _activations().get(type(module))
    if activation is not None:
        fn = activation(module)
        return [lambda p, x: fn(x)]
    where = prefix[:-1] or "<root>"
    raise UnsupportedModuleError(
        f"module {where} ({type(module).__name__}) is not supported by the fast path, which "
        f"translates nn.Sequential stacks of: {SUPPORTED}. Use the universal path instead "
        "(algo.torch_policy.path=universal, or TorchFunction(module, path='universal') in "
        "jaxrl_engine.interop.torch_policy), which calls any module through a callback"
    )


def module_to_jax(
    module: torch.nn.Module, report: BridgeReport | None = None
) -> tuple[Callable[[Params, jax.Array], jax.Array], Params]:
    """(apply, params) for `module`: `apply(params, x)` == `module.eval()(x)` in pure JAX.

    params alias the module's weights (zero-copy, via DLPack): an in-place torch optimizer
    step changes them. Raises `UnsupportedModuleError` for modules the fast path cannot run.
    """
    layers = _layers(module, "")
    params = from_torch(dict(module.state_dict()), copy="never", report=report)

    def apply(params: Params, x: jax.Array) -> jax.Array:
        for layer in layers:
            x = layer(params, x)
        return x

    return apply, params
