"""The engine state: one pytree holding everything that changes during training."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl_engine.core.protocols import Metrics


class EnvCarry(struct.PyTreeNode):
    """Batched env state and the last observation (leading axis `num_envs`)."""

    state: Any
    obs: jax.Array  # [num_envs, *obs_shape]
    done: jax.Array  # bool[num_envs]: the last step ended an episode
    explore: Any = None  # the algorithm's `Explore` state per env (None: it has none)


class Counters(struct.PyTreeNode):
    """The engine's progress counters (int32 scalars, saved and restored with the state).

    epoch: finished epochs (`sync_weights` adds 1; a checkpoint is named after it).
    env_steps: env steps stored by rollouts, over all envs (`num_steps * num_envs` an epoch).
    grad_steps: gradient steps the `train` phase took: the algorithm's `grad_steps_per_epoch`
        per call, none for a call that idled (its `train/learning` metric 0: off-policy before
        `learning_starts`); an off-policy run's equals its `train.schedule.grad_steps`.
    """

    epoch: jax.Array  # int32[]
    env_steps: jax.Array  # int32[]
    grad_steps: jax.Array  # int32[]

    @classmethod
    def zeros(cls) -> Counters:
        z = jnp.zeros((), jnp.int32)
        return cls(epoch=z, env_steps=z, grad_steps=z)


class EpisodeStats(struct.PyTreeNode):
    """Running episode accumulators, fixed size (no growing histories)."""

    current_return: jax.Array  # f32[num_envs]
    current_length: jax.Array  # i32[num_envs]
    last_return: jax.Array  # f32[]: mean return of the episodes completed in the last rollout
    last_length: jax.Array  # f32[]
    episodes: jax.Array  # i32[]: episodes completed since init

    @classmethod
    def zeros(cls, num_envs: int) -> EpisodeStats:
        return cls(
            current_return=jnp.zeros((num_envs,), jnp.float32),
            current_length=jnp.zeros((num_envs,), jnp.int32),
            last_return=jnp.full((), jnp.nan, jnp.float32),
            last_length=jnp.full((), jnp.nan, jnp.float32),
            episodes=jnp.zeros((), jnp.int32),
        )


class EngineState(struct.PyTreeNode):
    """Everything that changes; static configuration lives on the `Engine`.

    train: the algorithm's learner state (params, optimizer state, step count, normalisers).
    eval_params / eval_version: what rollout and evaluate act with; `sync_weights` refreshes them.
    env: batched env state and last observation. buffer: rollout or replay storage.
    batch: what `update_dataset` prepared for `train`. rng: PRNG key. counters, stats.
    hparams: the algorithm's numeric hyperparameters (traced: `vmap` sweeps them).
    """

    train: Any
    eval_params: Any
    eval_version: jax.Array
    env: EnvCarry
    buffer: Any
    batch: Any
    rng: jax.Array
    counters: Counters
    stats: EpisodeStats
    hparams: Any


# `typing.Callable`, not `collections.abc.Callable`: only a `typing` alias takes a docstring
# (what `help(jre.Phase)` shows).
Phase = typing.Callable[[EngineState], tuple[EngineState, Metrics]]
Phase.__doc__ = """A phase: a pure function `state -> (state, metrics)` of the `EngineState`.

The engine's five (`core.phases.PHASES`: rollout, evaluate, update_dataset, train,
sync_weights) are built from the env and the algorithm; a function of this type replaces one
(`Engine(..., phases={"train": my_train})`), and a `Hook` transforms one. metrics: `Metrics`,
scalars named `<phase>/<name>` (two phases of an epoch may not return the same name).
"""


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


def strong_types(tree: Any) -> Any:
    """`tree` with every weakly typed leaf made strongly typed (same dtype). Applied to the
    state each phase returns and to `init`'s: a state's signature is then the same before and
    after any phase, so a jitted phase or epoch is not compiled a second time for the state
    it returned (gymnax's `time + 1` and a `done | False` are weakly typed)."""
    return jax.tree.map(
        lambda x: (
            jax.lax.convert_element_type(x, x.dtype)
            if hasattr(x, "dtype") and jax.typeof(x).weak_type
            else x  # (a Python number left in a phase's state: refused, naming the phase)
        ),
        tree,
    )


def check_hparams(
    hparams: Any, like: Any, where: str, scalars: bool = False, traced: bool = False
) -> None:
    """`hparams` has the structure of `like` (the algorithm's hyperparameters) and a number in
    every field, else a ValueError naming the field; with `scalars`, concrete values must be
    scalars (one setting: a stacked sweep goes through `jax.vmap` or `jre.sweep`), and traced
    ones too with `traced` (inside `jax.vmap` a member's are)."""
    if like is None:  # an algorithm without hyperparameters: nothing to hold them to
        return
    if type(hparams) is not type(like):
        raise ValueError(
            f"{where}: hparams must be a {type(like).__name__} (this engine's algorithm's "
            f"hyperparameters, e.g. engine.hparams.replace(lr=...)), not a "
            f"{type(hparams).__name__}"
        )
    if dataclasses.is_dataclass(like):
        fields = [(f".{f.name}", getattr(hparams, f.name)) for f in dataclasses.fields(like)]
    else:  # another pytree (a dict of numbers, say): its structure and leaves
        # (PyTreeDef compares equal by structure; its type stub does not say so)
        given, wanted = jax.tree.structure(hparams), jax.tree.structure(like)
        if given != wanted:  # type: ignore[operator]
            raise ValueError(
                f"{where}: hparams have the structure {given}, not the algorithm's {wanted}"
            )
        fields = [
            (jax.tree_util.keystr(p), v) for p, v in jax.tree_util.tree_leaves_with_path(hparams)
        ]
    for name, value in fields:
        if isinstance(value, bool) or not isinstance(
            value, int | float | np.number | np.ndarray | jax.Array
        ):
            raise ValueError(f"{where}: hparams{name} is {value!r}: a number is needed")
        if scalars and (traced or not isinstance(value, jax.core.Tracer)) and np.ndim(value):
            raise ValueError(
                f"{where}: hparams{name} has shape {np.shape(value)}: one setting takes "
                "scalars (several settings: jax.vmap(engine.init)(keys, stacked) or jre.sweep)"
            )


def check_hparams_shapes(hparams: Any, held: Any, where: str) -> None:
    """Each concrete value of `hparams` has the shape of the state's (`held`): scalars in one
    run's state, `[members]` in a stacked sweep's. Else a ValueError naming the field: a value
    of another shape broadcasts silently (one gamma per env) and changes the compiled program."""
    if held is None:
        return
    for (path, value), old in zip(
        jax.tree_util.tree_leaves_with_path(hparams), jax.tree.leaves(held), strict=True
    ):
        if not isinstance(value, jax.core.Tracer) and np.shape(value) != np.shape(old):
            raise ValueError(
                f"{where}: hparams{jax.tree_util.keystr(path)} has shape {np.shape(value)}, the "
                f"state's has {np.shape(old)} (one run's hparams are scalars; a sweep's state "
                "takes one value per member)"
            )


def hparams_arrays(hparams: Any) -> Any:
    """`hparams` with every leaf a (not weakly typed) array: Python floats become f32[], so
    the state's signature is the same whether the values came from a config or a sweep."""

    return jax.tree.map(lambda x: jnp.asarray(x, jnp.asarray(x).dtype), hparams)


def hparams_like(hparams: Any, like: Any) -> Any:
    """`hparams_arrays(hparams)` with each Python number, and each integer (array or traced)
    for a float leaf, in the dtype of `like`'s leaf (`gamma=1` for a float hyperparameter is
    f32, not an int32 leaf that compiles again)."""
    if like is None or jax.tree.structure(hparams) != jax.tree.structure(like):  # type: ignore[operator]
        return hparams_arrays(hparams)

    def one(x: Any, d: Any) -> jax.Array:
        want = jnp.asarray(d).dtype
        if isinstance(x, bool) or not isinstance(x, int | float):
            x = jnp.asarray(x, jnp.asarray(x).dtype)
            if not (jnp.issubdtype(x.dtype, jnp.integer) and jnp.issubdtype(want, jnp.floating)):
                return x
        return jnp.asarray(x, want)

    return jax.tree.map(one, hparams, like)
