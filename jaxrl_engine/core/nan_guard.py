"""The NaN/Inf guard: a traced hook flags the first non-finite quantity; the host raises.

Inside jit nothing can raise, so `nan_guard` adds a `guard/<phase>` metric (-1, or the index
of the first bad quantity) and the driver's `check_guards` turns it into `NonFiniteError`
naming phase, quantity and epoch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_engine.core.hooks import Hook
from jaxrl_engine.core.state import EngineState, Metrics, Phase, get_path

# What nan_guard checks besides each phase's metrics.
GUARDED_STATE = {"rollout": ("env.obs",), "train": ("train.params",)}
# NaN by meaning until the first episode ends (not an error).
MAY_BE_NAN = ("rollout/episode_return", "rollout/episode_length")


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

    def transform(phase: Phase) -> Phase:
        def wrapped(state: EngineState) -> tuple[EngineState, Metrics]:
            state, metrics = phase(state)
            names = guarded_quantities(list(metrics), state_paths, skip)
            metric_names = names[: len(names) - len(state_paths)]
            values = [metrics[n] for n in metric_names] + [get_path(state, p) for p in state_paths]
            working = metrics.get(working_key(phase_name))
            if working is not None:  # an idle phase's metrics are not checked
                values[: len(metric_names)] = [
                    jnp.where(working > 0, v, jnp.zeros_like(v))
                    for v in values[: len(metric_names)]
                ]
            return state, {**metrics, guard_key(phase_name): first_non_finite(values)}

        return wrapped

    return transform


class GuardNames(Mapping[str, list[str]]):
    """Per guarded phase, the names behind its `guard/<phase>` index, found only when asked
    for: `names_of(phase)` traces the phase (about 0.1 s each), which a run needs only when a
    guard fires, so a run that stays finite never pays for it."""

    def __init__(self, phases: Sequence[str], names_of: Callable[[str], list[str]]):
        self._phases, self._names_of = tuple(phases), names_of
        self._found: dict[str, list[str]] = {}

    def __getitem__(self, phase: str) -> list[str]:
        if phase not in self._phases:
            raise KeyError(phase)
        if phase not in self._found:
            self._found[phase] = self._names_of(phase)
        return self._found[phase]

    def __contains__(self, phase: object) -> bool:  # (Mapping's would trace the phase)
        return phase in self._phases

    def __iter__(self) -> Iterator[str]:
        return iter(self._phases)

    def __len__(self) -> int:
        return len(self._phases)


class NonFiniteError(FloatingPointError):
    """A `nan_guard` fired: names phase, quantity and epoch."""

    def __init__(self, phase: str, quantity: str, epoch: int):
        self.phase, self.quantity, self.epoch = phase, quantity, epoch
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
            f"non-finite value in phase '{phase}', quantity '{quantity}', epoch {epoch}: {advice}"
        )


def check_guards(metrics: dict[str, Any], guarded: Mapping[str, list[str]], epoch: int) -> None:
    """Raise `NonFiniteError` for the first phase whose guard fired (host side).

    guarded: per phase in order, the names behind its index (looked up only for a phase whose
    guard fired: see `GuardNames`). epoch: counted from 1, as in `metrics.jsonl` (the epoch
    whose phases produced `metrics`).
    """
    for phase in guarded:
        index = metrics.get(guard_key(phase))
        if index is not None and int(np.asarray(index).max()) >= 0:
            raise NonFiniteError(phase, guarded[phase][int(np.asarray(index).max())], epoch)
