"""The NaN/Inf guard: a traced hook flags the first non-finite quantity; the host raises.

Inside jit nothing can raise, so `nan_guard` adds a `guard/<phase>` metric (-1, or the index
of the first bad quantity) and the driver's `check_guards` turns it into `NonFiniteError`
naming phase, quantity and epoch.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_engine.core.hooks import Hook
from jaxrl_engine.core.phases import EPOCH_PHASES
from jaxrl_engine.core.state import EngineState, Metrics, Phase, get_path

# What nan_guard checks besides each phase's metrics.
GUARDED_STATE = {"rollout": ("env.obs",), "train": ("train.params",)}
# NaN by meaning until the first episode ends (not an error).
MAY_BE_NAN = ("rollout/episode_return", "rollout/episode_length")
# Which guard names a failure when several fire in one epoch: the epoch's phases in the order
# they run (a NaN spreads downstream), then evaluation, then guards of other names.
GUARD_ORDER = (*EPOCH_PHASES, "evaluate")
# While `recorded_names` traces phases: each nan_guard traced puts its names here.
_RECORDING: contextvars.ContextVar[dict[str, list[str]] | None] = contextvars.ContextVar(
    "nan_guard_names", default=None
)


def working_key(phase_name: str) -> str:
    """A phase that may idle (off-policy `train` before `learning_starts`) reports this metric,
    1 when it worked; while it is 0 the phase's other metrics are NaN by meaning (nothing was
    computed: logged as null, not as a loss of 0) and the guard does not check them."""
    return f"{phase_name}/learning"


def guard_key(phase_name: str) -> str:
    return f"guard/{phase_name}"


def guarded_quantities(
    metric_names: Sequence[str], state_paths: Sequence[str], skip: Sequence[str] = ()
) -> list[str]:
    """The names behind a `nan_guard` index: the phase's metrics (sorted, less `skip`), then
    the state paths."""
    return sorted(n for n in metric_names if n not in skip and not n.startswith("guard/")) + list(
        state_paths
    )


def nan_guard(phase_name: str, state_paths: Sequence[str] = (), skip: Sequence[str] = ()) -> Hook:
    """Flag the first non-finite metric or state subtree after the phase.

    Adds the metric `guard/<phase>`: -1 when everything is finite, else the index of the first
    bad quantity in `guarded_quantities(...)`. Inside jit nothing can raise, so the driver
    (`check_guards`) turns a flag into `NonFiniteError` naming phase, quantity and epoch.
    skip: metrics that are NaN by meaning (e.g. "no episode finished yet", or what `every`
    pads on epochs it skips).
    """

    def first_non_finite(values: list[Any]) -> jax.Array:
        """Index of the first value holding a NaN/Inf, else -1; one check over everything
        (concatenated), not one reduction per value: the guard runs every epoch."""
        parts, ends, size = [], [], 0
        for value in values:
            for leaf in jax.tree.leaves(value):
                leaf = jnp.asarray(leaf)
                if jnp.issubdtype(leaf.dtype, jnp.inexact) and leaf.size:
                    parts.append(leaf.ravel())
                    size += leaf.size
            ends.append(size)
        if not parts:
            return jnp.int32(-1)
        bad = ~jnp.isfinite(jnp.concatenate(parts))  # promotes to the widest float type
        first = jnp.argmax(bad)  # the first bad element; its value is the first ending after it
        # (= searchsorted(ends, first, side="right"): one compare and sum over the few ends,
        # where searchsorted compiles a loop)
        index = jnp.sum(np.asarray(ends) <= first, dtype=jnp.int32)
        return jnp.where(bad.any(), index, -1).astype(jnp.int32)

    key = guard_key(phase_name)
    skip = (*MAY_BE_NAN, *skip)  # (NaN by meaning, whoever guards them)

    def transform(phase: Phase) -> Phase:
        def wrapped(state: EngineState) -> tuple[EngineState, Metrics]:
            state, metrics = phase(state)
            if key in metrics:
                raise ValueError(
                    f"nan_guard({phase_name!r}) wraps a phase that already reports {key!r} (the "
                    f"engine's own guard of phase {phase_name!r}, config `nan_guard: true`, or "
                    "another nan_guard of that name): give this guard another name"
                )
            names = guarded_quantities(list(metrics), state_paths, skip)
            recording = _RECORDING.get()
            if recording is not None:
                recording[phase_name] = names
            metric_names = names[: len(names) - len(state_paths)]
            values = [metrics[n] for n in metric_names] + [get_path(state, p) for p in state_paths]
            for i, name in enumerate(metric_names):  # an idle phase's metrics are not checked
                working = metrics.get(working_key(name.split("/", 1)[0]))
                if working is not None:
                    values[i] = jnp.where(working > 0, values[i], jnp.zeros_like(values[i]))
            return state, {**metrics, key: first_non_finite(values)}

        return wrapped

    return transform


def recorded_names(trace: Callable[[], Any]) -> dict[str, list[str]]:
    """Per guard name, the quantities behind its index, as recorded by every `nan_guard` that
    `trace()` traces (e.g. a `jax.eval_shape` of hooked phases)."""
    seen: dict[str, list[str]] = {}
    token = _RECORDING.set(seen)
    try:
        trace()
    finally:
        _RECORDING.reset(token)
    return seen


class GuardNames(Mapping[str, list[str]]):
    """Per guard name (the engine's, `guard/<phase>`, and any `nan_guard` of the user's hooks),
    the names behind its index, found only when asked for: `trace(phase)` traces a hooked phase
    (about 0.1 s each) while `recorded_names` listens, which a run needs only when a guard
    fires, so a run that stays finite never pays for it. The phase of the guard's own name is
    traced first, then the others until the guard is found."""

    def __init__(self, phases: Sequence[str], trace: Callable[[str], Any]):
        self._phases, self._trace = tuple(phases), trace
        self._found: dict[str, list[str]] = {}
        self._phase_of: dict[str, str] = {}
        self._traced: set[str] = set()

    def phase_of(self, guard: str) -> str:
        """The phase whose hooks hold the guard `guard` (its own name when not found)."""
        self._trace_until(guard)
        return self._phase_of.get(guard, guard)

    def _trace_until(self, guard: str | None) -> None:
        for phase in sorted(self._phases, key=lambda p: p != guard):
            if guard in self._found:
                return
            if phase not in self._traced:
                self._traced.add(phase)
                found = recorded_names(functools.partial(self._trace, phase))
                self._phase_of.update({g: phase for g in found if g not in self._found})
                self._found.update(found)

    def __getitem__(self, guard: str) -> list[str]:
        self._trace_until(guard)
        return self._found[guard]

    def __iter__(self) -> Iterator[str]:
        self._trace_until(None)
        return iter(dict(self._found))

    def __len__(self) -> int:
        self._trace_until(None)
        return len(self._found)


class NonFiniteError(FloatingPointError):
    """A `nan_guard` fired: names phase, quantity and epoch."""

    def __init__(self, phase: str, quantity: str, epoch: int, guard: str | None = None):
        self.phase, self.quantity, self.epoch = phase, quantity, epoch
        self.guard = phase if guard is None else guard  # the nan_guard's name
        self.summary: dict[str, Any] | None = None  # the run's summary, when a driver stopped
        advice = (
            "check the env's rewards and observations for the actions it was given (a policy "
            "whose params went non-finite in training acts with NaN too: then lower the "
            "learning rate)"
            if phase == "rollout"
            else "lower the learning rate, enable observation/reward normalisation, or check "
            "the env"
        )
        super().__init__(
            f"non-finite value in phase '{phase}'"
            + (f" (nan_guard {self.guard!r})" if self.guard != phase else "")
            + f", quantity '{quantity}', epoch {epoch}: {advice}"
        )


def check_guards(metrics: dict[str, Any], guarded: Mapping[str, list[str]], epoch: int) -> None:
    """Raise `NonFiniteError` for the first guard that fired (host side): every `guard/<name>`
    metric counts, the engine's and those of `nan_guard`s in the user's hooks.

    guarded: per guard name, the names behind its index (looked up only for a guard that fired:
    see `GuardNames`). epoch: counted from 1, as in `metrics.jsonl` (the epoch whose phases
    produced `metrics`).
    """
    fired = {
        key.removeprefix("guard/"): index
        for key, value in metrics.items()
        if key.startswith("guard/") and (index := int(np.asarray(value).max())) >= 0
    }
    if not fired:
        return
    name = min(
        fired, key=lambda n: (GUARD_ORDER.index(n) if n in GUARD_ORDER else len(GUARD_ORDER), n)
    )
    index = fired[name]
    names = guarded.get(name)
    quantity = (
        names[index]
        if names is not None and index < len(names)
        else f"#{index} of its guard (its names were not found)"
    )
    phase = guarded.phase_of(name) if isinstance(guarded, GuardNames) else name
    raise NonFiniteError(phase, quantity, epoch, guard=name)
