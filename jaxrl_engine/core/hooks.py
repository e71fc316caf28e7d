"""Hooks: transforms `Phase -> Phase`, composed with `chain` the way `optax.chain` composes.

Two kinds, kept apart:
- traced hooks (safe inside jit): `offload_after`, `reload_before` (`core.offload`),
  `nan_guard` (`core.nan_guard`), `every` (here);
- host transforms, applied by the Python driver around a compiled call: `timed`
  (`core.timing`). The run's logging, progress, checkpoints, summary and export are host hooks
  of another shape (objects with start/end events: `jaxrl_engine.run.host_hooks`).

A hook sees only the phase it wraps and the state it is given; it never reaches into another
hook. `chain(a, b)(phase) == b(a(phase))`: `a` wraps the phase first, so `b` is outermost
(its "before" work runs first and its "after" work runs last).
"""

from __future__ import annotations

import typing
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_engine.core.state import EngineState, Metrics, Phase

Hook = typing.Callable[[Phase], Phase]
Hook.__doc__ = """A hook: a function `phase -> phase` (a transform of a phase, as an optax
transformation is of gradients). It wraps the phase it is given, may change the state it
passes in and the state and metrics it returns, and sees no other hook; `chain` composes
hooks, `every(n, hook)` applies one every n epochs. Traced with the phase (inside jit)."""


def chain(*hooks: Hook) -> Hook:
    """Compose hooks; the first listed wraps the phase first (innermost)."""

    def transform(phase: Phase) -> Phase:
        for hook in hooks:
            what = getattr(hook, "__name__", type(hook).__name__)
            try:
                phase = hook(phase)
            except TypeError as e:  # (most often a hook of another signature)
                raise TypeError(
                    f"hook {what} failed when given its phase: {e} (a hook takes one phase and "
                    "returns a phase)"
                ) from e
            if not callable(phase):
                raise TypeError(
                    f"hook {what} returned {type(phase).__name__}, not a phase: a hook takes a "
                    "phase and returns a phase (state -> (state, metrics)); a phase of your "
                    "own replaces one with phases={name: fn}"
                )
        return phase

    return transform


def every(n: int, hook: Hook) -> Hook:
    """Apply `hook` only on epochs where `counters.epoch % n == 0` (`lax.cond`, traced).

    Metrics that only the hooked branch produces are NaN on the other epochs (an integer or
    bool one is logged as float32 for that), a `guard/*` metric -1 ("nothing found").
    """
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
        raise ValueError(f"every(n={n!r}, ...): n is a whole number of epochs >= 1")
    if not callable(hook):
        raise TypeError(f"every(n, hook): hook is {hook!r}, a function from a phase to a phase")

    def transform(phase: Phase) -> Phase:
        hooked = hook(phase)

        def wrapped(state: EngineState) -> tuple[EngineState, Metrics]:
            shapes = [jax.eval_shape(f, state)[1] for f in (hooked, phase)]
            keys = sorted(set(shapes[0]) | set(shapes[1]))
            ref = {**shapes[1], **shapes[0]}
            one_sided = set(shapes[0]) ^ set(shapes[1])

            def dtype(k: str) -> Any:  # an int or bool metric of one branch goes float (NaN)
                if k in one_sided and not (
                    k.startswith("guard/") or jnp.issubdtype(ref[k].dtype, jnp.inexact)
                ):
                    return jnp.float32
                return None  # (as it is: a metric of both branches keeps its own type)

            def skipped(k: str) -> jax.Array:  # NaN; a guard's "nothing found", -1
                fill = -1 if k.startswith("guard/") else jnp.nan
                return jnp.full(ref[k].shape, fill, dtype(k) or ref[k].dtype)

            def padded(f):
                def run(s):
                    s, m = f(s)
                    out = {k: m[k] if k in m else skipped(k) for k in keys}
                    return s, {k: jnp.asarray(v, dtype(k)) for k, v in out.items()}

                return run

            try:
                return jax.lax.cond(
                    state.counters.epoch % n == 0, padded(hooked), padded(phase), state
                )
            except TypeError as e:
                if "branches must have equal output types" not in str(e):
                    raise  # (an error inside a branch: the phase's or the hook's own)
                what = getattr(hook, "__name__", type(hook).__name__)
                raise TypeError(
                    f"every({n}, {what}): the hook changes the type (dtype or shape) of a "
                    f"metric or state leaf, so the epochs it skips cannot return the same. "
                    + next((x for x in str(e).splitlines() if x.startswith("The output")), "")
                ) from None

        return wrapped

    return transform
