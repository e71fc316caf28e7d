"""The fast path's converter: a torch module -> a native JAX function of its weights.

`module_to_jax(module)` returns `(apply, params)`: `params` is the module's state dict bridged
by DLPack (zero-copy: the arrays alias torch's live weights), `apply(params, x)` is pure JAX
(jit/vmap/grad work) and computes what `module(x)` computes in eval mode. Weights keep
torch's layouts (Linear [out, in], Conv2d OIHW), contracted with `lax.dot_general` /
`lax.conv_general_dilated`, so bridging needs no transpose and jit sees default layouts: an
MLP compiles with no transpose at all. (XLA:CPU itself runs convolutions in NHWC, so a Conv2d
layer's NCHW activations and OIHW weights are re-laid out inside the compiled call; that is
XLA's choice for any NCHW convolution, not the bridge's.)

Supported: the layers in `SUPPORTED` (Linear, Conv2d, LayerNorm, Flatten, Identity, Dropout
(identity: acting is eval mode), the activations in `_activations`, `torch_layers.ChannelsFirst`)
as an `nn.Sequential` (nested), and any module whose `forward(x)` composes them: such a module
is traced with `torch.fx` and its graph translated node by node, the layers as above and the
tensor functions and methods in `_functions()` / `_METHODS` (arithmetic, activations, reshapes,
concatenation, reductions). Anything else raises `UnsupportedModuleError` naming the first
module or operation the fast path cannot run and pointing to the universal path (any module,
called through a callback). PyPI `torch2jax` 0.1.0 also translates modules with our pins (its
t2j direction works; its j2t calls the removed `jax.dlpack.to_dlpack`); we keep this small
converter because it refuses what it cannot translate up front and keeps torch's layouts.
"""

from __future__ import annotations

import operator
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
        return y + _trailing(p[f"{prefix}bias"], y) if m.bias is not None else y

    return apply


def _trailing(param: jax.Array, like: jax.Array) -> jax.Array:
    """`param` (the trailing axes of `like`) broadcast to it explicitly: torch's broadcasting
    without JAX's rank promotion (which `jax_numpy_rank_promotion="raise"` refuses)."""
    return jnp.broadcast_to(param, like.shape)


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
        return y + _trailing(p[f"{prefix}bias"][:, None, None], y) if m.bias is not None else y

    return apply


def _layer_norm(prefix: str, m: torch.nn.LayerNorm) -> Layer:
    axes = tuple(range(-len(m.normalized_shape), 0))

    def apply(p: Params, x: jax.Array) -> jax.Array:
        mean = x.mean(axes, keepdims=True)
        var = ((x - mean) ** 2).mean(axes, keepdims=True)
        y = (x - mean) * lax.rsqrt(var + m.eps)
        if m.elementwise_affine:
            y = y * _trailing(p[f"{prefix}weight"], y)
            if m.bias is not None:
                y = y + _trailing(p[f"{prefix}bias"], y)
        return y

    return apply


def _flatten(m: torch.nn.Flatten) -> Layer:
    return lambda p, x: _flat(x, m.start_dim, m.end_dim)


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
    if type(module).forward is not nn.Module.forward and not _is_torch_layer(module):
        return [_traced(module, prefix)]  # a module of the user's: its forward's graph
    raise _unsupported(f"module {prefix[:-1] or '<root>'} ({type(module).__name__})")


def _is_torch_layer(module: Any) -> bool:
    """A layer of torch.nn itself (BatchNorm1d, GRU, ...): torch.fx would not look inside it."""
    return type(module).__module__.startswith("torch.nn")


def _unsupported(what: str) -> UnsupportedModuleError:
    return UnsupportedModuleError(
        f"{what} is not supported by the fast path, which translates the layers "
        f"{SUPPORTED} and modules whose forward composes them with the tensor operations "
        f"{', '.join(_operation_names())}. Use the universal path instead "
        "(algo.torch_policy.path=universal, or TorchFunction(module, path='universal') in "
        "jaxrl_engine.interop.torch_policy), which calls any module through a callback"
    )


# Tensor attributes the graph may read (x.shape[0], ...): the same on a JAX array.
_ATTRIBUTES = ("shape", "ndim", "T")

# Tensor methods the graph may call (x.view(...), x.relu(), ...): name -> f(x, *args, **kwargs).
_METHODS: dict[str, Callable[..., Any]] = {
    "size": lambda x, dim=None: x.shape if dim is None else x.shape[dim],
    "dim": lambda x: x.ndim,
    "view": lambda x, *shape: x.reshape(*shape),
    "reshape": lambda x, *shape: x.reshape(*shape),
    "flatten": lambda x, start_dim=0, end_dim=-1: _flat(x, start_dim, end_dim),
    "permute": lambda x, *dims: jnp.transpose(x, dims[0] if len(dims) == 1 else dims),
    "transpose": lambda x, a, b: jnp.swapaxes(x, a, b),
    "movedim": lambda x, source, destination: jnp.moveaxis(x, source, destination),
    "unsqueeze": lambda x, dim: jnp.expand_dims(x, dim),
    "squeeze": lambda x, dim=None: jnp.squeeze(x, dim),
    "contiguous": lambda x: x,
    "float": lambda x: x.astype(jnp.float32),
    "relu": jax.nn.relu,
    "tanh": jnp.tanh,
    "sigmoid": jax.nn.sigmoid,
    "exp": jnp.exp,
    "abs": jnp.abs,
    "mean": lambda x, dim=None, keepdim=False: x.mean(dim, keepdims=keepdim),
    "sum": lambda x, dim=None, keepdim=False: x.sum(dim, keepdims=keepdim),
    "clamp": lambda x, min=None, max=None: jnp.clip(x, min, max),
    "add": lambda x, y: x + y,
    "mul": lambda x, y: x * y,
}


def _operation_names() -> list[str]:
    """The tensor functions and methods a forward may use, for messages: `torch.cat`,
    `F.gelu`, the Python operators by symbol, methods as `.view()`."""
    import torch

    symbols = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "matmul": "@", "neg": "-x"}
    names = set()
    for f in _functions():
        name = getattr(f, "__name__", str(f))
        if getattr(operator, name, None) is f:
            names.add(symbols.get(name, "x[...]" if name == "getitem" else name))
        elif getattr(torch, name, None) is f:
            names.add(f"torch.{name}")
        else:
            names.add(f"F.{name}")
    return sorted(names) + [f".{m}()" for m in sorted(_METHODS)] + [f".{a}" for a in _ATTRIBUTES]


def _flat(x: jax.Array, start_dim: int = 0, end_dim: int = -1) -> jax.Array:
    start, end = start_dim % x.ndim, end_dim % x.ndim
    return x.reshape((*x.shape[:start], -1, *x.shape[end + 1 :]))


def _functions() -> dict[Any, Callable[..., Any]]:
    """torch functions the graph may call (torch.relu, F.gelu, x + y, ...): target -> f."""
    import torch
    import torch.nn.functional as F

    def softmax(fn: Callable[..., Any]) -> Callable[..., Any]:
        return lambda x, dim=-1, **_: fn(x, axis=-1 if dim is None else dim)

    return {
        operator.add: operator.add,
        operator.sub: operator.sub,
        operator.mul: operator.mul,
        operator.truediv: operator.truediv,
        operator.matmul: operator.matmul,
        operator.neg: operator.neg,
        operator.getitem: operator.getitem,
        torch.add: lambda x, y: x + y,
        torch.mul: lambda x, y: x * y,
        torch.cat: lambda tensors, dim=0: jnp.concatenate(tensors, axis=dim),
        torch.concat: lambda tensors, dim=0: jnp.concatenate(tensors, axis=dim),
        torch.stack: lambda tensors, dim=0: jnp.stack(tensors, axis=dim),
        torch.flatten: _flat,
        torch.relu: jax.nn.relu,
        torch.tanh: jnp.tanh,
        torch.sigmoid: jax.nn.sigmoid,
        torch.exp: jnp.exp,
        torch.clamp: lambda x, min=None, max=None: jnp.clip(x, min, max),
        torch.mean: lambda x, dim=None, keepdim=False: x.mean(dim, keepdims=keepdim),
        torch.sum: lambda x, dim=None, keepdim=False: x.sum(dim, keepdims=keepdim),
        torch.matmul: jnp.matmul,
        torch.softmax: softmax(jax.nn.softmax),
        torch.log_softmax: softmax(jax.nn.log_softmax),
        F.relu: lambda x, inplace=False: jax.nn.relu(x),
        F.tanh: jnp.tanh,
        F.sigmoid: jax.nn.sigmoid,
        F.silu: lambda x, inplace=False: jax.nn.silu(x),
        F.gelu: lambda x, approximate="none": jax.nn.gelu(x, approximate=approximate == "tanh"),
        F.elu: lambda x, alpha=1.0, inplace=False: jax.nn.elu(x, alpha),
        F.leaky_relu: lambda x, negative_slope=0.01, inplace=False: jax.nn.leaky_relu(
            x, negative_slope
        ),
        F.softmax: softmax(jax.nn.softmax),
        F.log_softmax: softmax(jax.nn.log_softmax),
    }


def _traced(module: torch.nn.Module, prefix: str) -> Layer:
    """A module of the user's, through its torch.fx graph: each node becomes the JAX op of its
    layer, function or method (the layers' weights read from `params` under `prefix`)."""
    from torch import fx

    where = f"{prefix[:-1] or '<root>'} ({type(module).__name__})"
    try:
        graph = fx.symbolic_trace(module).graph
    except Exception as e:  # data-dependent control flow, an op fx cannot trace
        raise _unsupported(
            f"module {where}, whose forward torch.fx cannot trace ({type(e).__name__}: "
            f"{str(e).splitlines()[0][:200] if str(e) else ''}),"
        ) from None
    functions = _functions()
    steps: list[tuple[Any, Callable[..., Any], Any, Any]] = []  # (node, fn, args, kwargs)
    inputs = [node for node in graph.nodes if node.op == "placeholder"]
    if len(inputs) != 1:
        raise _unsupported(f"module {where}: a forward of {len(inputs)} inputs (one: x)")
    output: Any = None
    for node in graph.nodes:
        if node.op == "placeholder":
            continue
        if node.op == "output":
            output = node.args[0]
        elif node.op == "call_module":
            layers = _layers(module.get_submodule(node.target), f"{prefix}{node.target}.")

            def run(p: Params, x: Any, _layers: list[Layer] = layers) -> Any:
                for layer in _layers:
                    x = layer(p, x)
                return x

            steps.append((node, run, node.args, node.kwargs))
        elif node.op == "get_attr":  # a weight used directly (x @ self.w): from params
            if node.target not in module.state_dict():
                raise _unsupported(f"the attribute {node.target!r} of module {where}")
            steps.append((node, lambda p, _name=f"{prefix}{node.target}": p[_name], (), {}))
        elif node.op == "call_function" and node.target is getattr:  # x.shape, x.ndim, x.T
            name = node.args[1] if len(node.args) == 2 else None
            if name not in _ATTRIBUTES:
                raise _unsupported(
                    f"the tensor attribute {name!r} in the forward of module {where}"
                )
            steps.append((node, lambda p, x, _name=name: getattr(x, _name), node.args[:1], {}))
        elif node.op == "call_function" and node.target in functions:
            fn = functions[node.target]
            steps.append((node, lambda p, *a, _fn=fn, **k: _fn(*a, **k), node.args, node.kwargs))
        elif node.op == "call_method" and node.target in _METHODS:
            fn = _METHODS[node.target]
            steps.append((node, lambda p, *a, _fn=fn, **k: _fn(*a, **k), node.args, node.kwargs))
        else:
            target = getattr(node.target, "__name__", str(node.target))
            kind = {"call_method": "method", "call_function": "function"}.get(node.op, node.op)
            raise _unsupported(f"the {kind} {target!r} in the forward of module {where}")

    def apply(p: Params, x: jax.Array) -> jax.Array:
        values: dict[Any, Any] = {inputs[0]: x}

        def value(a: Any) -> Any:
            return fx.node.map_arg(a, lambda n: values[n])

        for node, fn, args, kwargs in steps:
            values[node] = fn(p, *value(args), **value(kwargs))
        return value(output)

    return apply


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
