"""Hooks: transforms `Phase -> Phase`, composed with `chain` the way `optax.chain` composes.

Two kinds, kept apart:
- traced hooks (safe inside jit): `offload_after`, `reload_before`, `nan_guard`, `every`;
- host hooks (the Python driver applies them around a compiled phase): `timed`.

A hook sees only the phase it wraps and the state it is given; it never reaches into another
hook. `chain(a, b)(phase) == b(a(phase))`: `a` wraps the phase first, so `b` is outermost
(its "before" work runs first and its "after" work runs last).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_engine.core.state import EngineState, Metrics, Phase

Hook = Callable[[Phase], Phase]


def chain(*hooks: Hook) -> Hook:
    """Compose hooks; the first listed wraps the phase first (innermost)."""

    def transform(phase: Phase) -> Phase:
        for hook in hooks:
            phase = hook(phase)
        return phase

    return transform


def get_path(tree: Any, path: str) -> Any:
    """`get_path(state, "train.opt_state")`: attribute (or dict key) access by dotted path."""
    for part in path.split("."):
        tree = tree[part] if isinstance(tree, dict) else getattr(tree, part)
    return tree


def set_path(tree: Any, path: str, value: Any) -> Any:
    """A copy of `tree` with the leaf at the dotted `path` replaced (dataclass `.replace`)."""
    head, _, rest = path.partition(".")
    child = tree[head] if isinstance(tree, dict) else getattr(tree, head)
    new = set_path(child, rest, value) if rest else value
    if isinstance(tree, dict):
        return {**tree, head: new}
    return tree.replace(**{head: new})


def move_to(
    paths: Sequence[str], mesh: Mesh, memory_kind: str
) -> Callable[[EngineState], EngineState]:
    """A traced function moving the (replicated) subtrees at `paths` to `memory_kind`."""
    target = NamedSharding(mesh, PartitionSpec(), memory_kind=memory_kind)

    def move(state: EngineState) -> EngineState:
        for path in paths:
            subtree = get_path(state, path)
            state = set_path(
                state, path, jax.tree.map(lambda x: jax.device_put(x, target), subtree)
            )
        return state

    return move


def offload_after(paths: Sequence[str], mesh: Mesh, memory_kind: str = "pinned_host") -> Hook:
    """After the phase, move the subtrees at `paths` (replicated leaves) to host memory."""
    move = move_to(paths, mesh, memory_kind)

    def transform(phase: Phase) -> Phase:
        def wrapped(state: EngineState) -> tuple[EngineState, Metrics]:
            state, metrics = phase(state)
            return move(state), metrics

        return wrapped

    return transform


def reload_before(paths: Sequence[str], mesh: Mesh, memory_kind: str = "device") -> Hook:
    """Before the phase, move the subtrees at `paths` back to device memory."""
    move = move_to(paths, mesh, memory_kind)

    def transform(phase: Phase) -> Phase:
        def wrapped(state: EngineState) -> tuple[EngineState, Metrics]:
            return phase(move(state))

        return wrapped

    return transform


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
        index = jnp.searchsorted(jnp.asarray(ends), first, side="right")
        return jnp.where(bad.any(), index, -1).astype(jnp.int32)

    def transform(phase: Phase) -> Phase:
        def wrapped(state: EngineState) -> tuple[EngineState, Metrics]:
            state, metrics = phase(state)
            names = guarded_quantities(list(metrics), state_paths, skip)
            metric_names = names[: len(names) - len(state_paths)]
            values = [metrics[n] for n in metric_names] + [get_path(state, p) for p in state_paths]
            return state, {**metrics, guard_key(phase_name): first_non_finite(values)}

        return wrapped

    return transform


class NonFiniteError(FloatingPointError):
    """A `nan_guard` fired: names phase, quantity and epoch."""

    def __init__(self, phase: str, quantity: str, epoch: int):
        self.phase, self.quantity, self.epoch = phase, quantity, epoch
        super().__init__(
            f"non-finite value in phase '{phase}', quantity '{quantity}', epoch {epoch}: "
            "lower the learning rate, enable observation/reward normalisation, or check the env"
        )


def check_guards(metrics: dict[str, Any], guarded: dict[str, list[str]], epoch: int) -> None:
    """Raise `NonFiniteError` for the first phase whose guard fired (host side).

    epoch: counted from 1, as in `metrics.jsonl` (the epoch whose phases produced `metrics`).
    """
    for phase, names in guarded.items():
        index = metrics.get(guard_key(phase))
        if index is not None and int(np.asarray(index).max()) >= 0:
            raise NonFiniteError(phase, names[int(np.asarray(index).max())], epoch)


def every(n: int, hook: Hook) -> Hook:
    """Apply `hook` only on epochs where `counters.epoch % n == 0` (`lax.cond`, traced).

    Metrics that only the hooked branch produces are NaN on the other epochs.
    """

    def transform(phase: Phase) -> Phase:
        hooked = hook(phase)

        def wrapped(state: EngineState) -> tuple[EngineState, Metrics]:
            shapes = [jax.eval_shape(f, state)[1] for f in (hooked, phase)]
            keys = sorted(set(shapes[0]) | set(shapes[1]))
            ref = {**shapes[1], **shapes[0]}

            def padded(f):
                def run(s):
                    s, m = f(s)
                    return s, {
                        k: m[k] if k in m else jnp.full(ref[k].shape, jnp.nan, ref[k].dtype)
                        for k in keys
                    }

                return run

            return jax.lax.cond(state.counters.epoch % n == 0, padded(hooked), padded(phase), state)

        return wrapped

    return transform


class Timer:
    """Count, total and average seconds per phase (host side).

    `record(name, seconds, count)` books one measurement that covered `count` runs of the phase
    (the driver times several epochs per compiled call); the average is per run.
    """

    def __init__(self) -> None:
        self.records: dict[str, list[tuple[float, int]]] = {}

    def record(self, name: str, seconds: float, count: int = 1) -> None:
        if count > 0:
            self.records.setdefault(name, []).append((seconds, count))

    def summary(self) -> dict[str, dict[str, float]]:
        out = {}
        for name, records in self.records.items():
            total = float(sum(s for s, _ in records))
            count = sum(c for _, c in records)
            out[name] = {"count": count, "total_s": total, "avg_s": total / count}
        return out

    def table(self) -> str:
        rows = self.summary()
        lines = [f"{'phase':<16}{'count':>8}{'total (s)':>12}{'avg (ms)':>12}"]
        for name, r in rows.items():
            lines.append(
                f"{name:<16}{r['count']:>8d}{r['total_s']:>12.3f}{1e3 * r['avg_s']:>12.3f}"
            )
        return "\n".join(lines)


def timed(name: str, timer: Timer) -> Hook:
    """Host hook: time a compiled phase, measured after `block_until_ready`."""

    def transform(phase: Phase) -> Phase:
        def wrapped(state: EngineState) -> tuple[EngineState, Metrics]:
            start = time.perf_counter()
            out = jax.block_until_ready(phase(state))
            timer.record(name, time.perf_counter() - start)
            return out

        return wrapped

    return transform
