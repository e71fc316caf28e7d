"""Offload: RLightning's `enable_offload` as traced hooks moving state subtrees between memory kinds.

Offloading is `jax.device_put` to a sharding with `memory_kind="pinned_host"` inside the jitted
phase; reloading is the same to `"device"`. On a CPU both kinds are the same RAM (nothing is
saved); on an accelerator the idle params and optimizer state leave device memory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_engine.core.hooks import Hook
from jaxrl_engine.core.state import EngineState, Metrics, Phase, get_path, set_path

# RLightning's `enable_offload` placement. Gradients live only inside `train`'s scan here, so
# "params and grads offloaded after sync" is params (and optimizer state) after sync.
OFFLOAD_PLACEMENT: dict[str, dict[str, tuple[str, ...]]] = {
    "rollout": {"reload": ("eval_params",), "offload": ("eval_params",)},
    "evaluate": {"reload": ("eval_params",), "offload": ("eval_params",)},
    "update_dataset": {"reload": (), "offload": ()},
    "train": {"reload": ("train.params", "train.opt_state"), "offload": ("train.opt_state",)},
    "sync_weights": {"reload": (), "offload": ("train.params", "eval_params")},
}
OFFLOADED_BETWEEN_EPOCHS = ("eval_params", "train.params", "train.opt_state")


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


def placement_hooks(phase: str, mesh: Mesh) -> list[Hook]:
    """The reload/offload hooks `OFFLOAD_PLACEMENT` gives `phase` (innermost first)."""
    place = OFFLOAD_PLACEMENT.get(phase, {"reload": (), "offload": ()})
    hooks = []
    if place["reload"]:
        hooks.append(reload_before(place["reload"], mesh))
    if place["offload"]:
        hooks.append(offload_after(place["offload"], mesh))
    return hooks


def host_subtrees(tree: Any) -> list[str]:
    """The dotted paths of the largest subtrees of `tree` (arrays or `ShapeDtypeStruct`s with
    shardings) whose leaves are all in host memory, e.g. `["train.params"]`."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    named = [
        (
            tuple(jax.tree_util.keystr((k,), simple=True, separator=".") for k in path),
            getattr(getattr(leaf, "sharding", None), "memory_kind", None) == "pinned_host",
        )
        for path, leaf in leaves
    ]
    on_host: dict[tuple[str, ...], bool] = {}  # every prefix: whether all its leaves are
    for keys, host in named:
        for i in range(1, len(keys) + 1):
            on_host[keys[:i]] = on_host.get(keys[:i], True) and host
    return [
        ".".join(keys)
        for keys, host in on_host.items()
        if host and not any(on_host.get(keys[:i]) for i in range(1, len(keys)))
    ]
