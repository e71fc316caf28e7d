"""`ordered_host_call`: a host env's step as an ordered host callback, without the per-call
cost of `jax.experimental.io_callback`'s argument conversion.

`io_callback(ordered=True)` is how a host env runs inside the jitted rollout: one call per env
step for the whole batch. On jax 0.10 its implementation `device_put`s the numpy arrays XLA
hands it into jax Arrays before calling the function: ~30 us of a ~55 us call on this 2-core
CPU (`benchmarks/host_step_costs.py`), against a 16-env gymnasium CartPole step of ~130 us.
`ordered_host_call` is the same primitive semantics, bound by its own primitive: jax's ordered
IO effect (so calls run one after another in program order and across compiled programs, as
with `ordered=True`, and are never dropped), the same lowering (`emit_python_callback` with
the same op sharding), the same output checks (jax's wrapper checks each result's shape and
dtype), but the function gets XLA's numpy arrays (copies it owns, read-only) directly.

It uses jax internals (`jax._src.callback`'s ordered IO effect, op-sharding rule and result
check, `jax._src.dispatch.apply_primitive` for eager calls, `ShapedArray`, and the signatures
of `emit_python_callback` and the lowering context's tokens). Where the installed jax lacks
them (`FAST` is False) or the primitive does not lower with them (checked once per process,
with a warning), the call is `io_callback(..., ordered=True)`, with the same results
(`tests/envs/test_host_callback.py`). It runs under jit and eagerly; like an ordered
io_callback it cannot be vmapped, differentiated or exported (errors that say so).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.experimental import io_callback


class _Function:
    """The host function as a primitive parameter, hashed and compared by identity: each
    bind gets its own, so tracing never compares two functions' behaviour."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn

    def __call__(self, *args: np.ndarray) -> tuple[Any, ...]:
        return tuple(self.fn(*args))

    def __hash__(self) -> int:
        return id(self.fn)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Function) and other.fn is self.fn


def _no_vmap(*args: Any, **params: Any) -> Any:
    raise ValueError(
        "a host env steps its whole env batch in one host call per step and cannot be "
        "vmapped (sweeps and jax.vmap over training need a JAX env: env.suite gymnax or brax)"
    )


def _no_jvp(*args: Any, **params: Any) -> Any:
    raise ValueError("a host call (a host env's step) cannot be differentiated")


def _register() -> Any:
    """The primitive, registered with jax (its effect, eager rule, lowering, vmap and JVP
    refusals); raises when this jax lacks an internal it uses."""
    from jax._src import callback as callback_impl
    from jax._src import dispatch
    from jax._src.core import ShapedArray
    from jax.extend.core import Primitive
    from jax.interpreters import ad, batching, mlir

    effect = callback_impl._OrderedIOEffect
    op_sharding = callback_impl._callback_op_sharding

    primitive = Primitive("jaxrl_engine_host_call")
    primitive.multiple_results = True

    def abstract_eval(*avals: Any, fn: _Function, result_avals: tuple[Any, ...]) -> Any:
        return result_avals, {effect}

    def lowering(ctx: Any, *args: Any, fn: _Function, result_avals: tuple[Any, ...]) -> Any:
        token = ctx.tokens_in.get(effect)
        results, token, _ = mlir.emit_python_callback(
            ctx,
            fn,
            token,
            list(args),
            ctx.avals_in,
            ctx.avals_out,
            has_side_effect=True,
            returns_token=True,
            sharding=op_sharding(ctx.module_context.axis_context, None, ctx.avals_out),
        )
        ctx.set_tokens_out(ctx.tokens_in.update_tokens(mlir.TokenSet({effect: token})))
        return results

    # Outside jit (eagerly, or under jax.disable_jit) the primitive runs as its own compiled
    # program, as io_callback's does.
    primitive.def_impl(functools.partial(dispatch.apply_primitive, primitive))
    primitive.def_effectful_abstract_eval(abstract_eval)
    mlir.register_lowering(primitive, lowering, cacheable=False)
    batching.primitive_batchers[primitive] = _no_vmap
    ad.primitive_jvps[primitive] = _no_jvp

    def avals(structs: list[Any]) -> tuple[Any, ...]:
        for struct in structs:  # io_callback's trace-time check: no 64-bit result without x64
            callback_impl._check_shape_dtype(struct)
        return tuple(ShapedArray(s.shape, s.dtype) for s in structs)

    return primitive, avals, effect


try:
    host_call_p, _result_avals, _EFFECT = _register()
    FAST = True
except Exception:  # a jax without these internals (any failure): io_callback
    FAST = False


def _fast_path() -> bool:
    """FAST, and the primitive lowers: the internals it uses are there but their signatures
    are not jax's promise, so the first call lowers a one-value program through it (a few ms,
    once per process); a failure warns once and every call takes io_callback."""
    return FAST and _lowers()


@functools.cache
def _lowers() -> bool:
    struct = jax.ShapeDtypeStruct((), np.float32)
    try:
        jax.jit(lambda x: _bind(lambda a: (a,), (struct,), x)).lower(struct)
    except Exception as e:  # any failure: the public path instead
        warnings.warn(
            f"jaxrl_engine: host envs step through jax.experimental.io_callback (slower): "
            f"this jax's internals do not take the fast host call ({type(e).__name__}: {e})",
            stacklevel=4,
        )
        return False
    return True


def ordered_host_call(fn: Callable[..., Any], result_shape_dtypes: Any, *args: Any) -> Any:
    """`io_callback(fn, result_shape_dtypes, *args, ordered=True)`, with `fn` given numpy
    arrays. `result_shape_dtypes`: a pytree of `jax.ShapeDtypeStruct`; `fn` returns the
    matching pytree of arrays (a flat tuple for a tuple of structs)."""
    if not _fast_path():
        return io_callback(fn, result_shape_dtypes, *args, ordered=True)
    return _bind(fn, result_shape_dtypes, *args)


def _bind(fn: Callable[..., Any], result_shape_dtypes: Any, *args: Any) -> Any:
    structs, tree = jax.tree.flatten(result_shape_dtypes)
    flat_args, args_tree = jax.tree.flatten(args)

    def flat_fn(*flat: np.ndarray) -> list[Any]:
        out = fn(*jax.tree.unflatten(args_tree, flat))
        return jax.tree.leaves(out)

    results = host_call_p.bind(
        *flat_args,
        fn=_Function(flat_fn),
        result_avals=_result_avals(structs),
    )
    return jax.tree.unflatten(tree, results)
