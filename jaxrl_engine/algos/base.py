"""What the algorithms share: the optimizer built from traced hyperparameters, and the
contract of an algorithm's config class.

An algorithm is three things: its config class (a `Strict` pydantic model with `name`,
`check(num_envs, total_env_steps)`, `hparams(spec)` and `build(spec, ...)`), in
`algos/configs.py` with the others, pure Python so that config errors are answered before JAX
is imported (`hparams` and `build` import the algorithm's module when called); and, in the
algorithm's module, its `HParams` pytree (the numeric hyperparameters, traced) and a factory
returning the `Algorithm` bundle of pure functions. `ALGORITHMS` (`algos.configs`, re-exported
by `jaxrl_engine.algos`) registers the config classes by name.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Protocol

import jax
import jax.numpy as jnp
import optax

from jaxrl_engine.core.protocols import Algorithm, EnvSpec
from jaxrl_engine.core.warm_up import ShapeMismatchError


def adam(
    lr: jax.Array | float,
    *,
    max_grad_norm: jax.Array | float | None = None,
    eps: jax.Array | float = 1e-8,
    anneal_steps: int | None = None,
) -> optax.GradientTransformation:
    """Global-norm clipping (optional), then Adam at `lr`, annealed linearly to 0 over
    `anneal_steps` gradient steps when given. Every number may be traced (an `HParams` leaf):
    the optimizer is rebuilt inside each traced call and its state's structure does not depend
    on the values."""
    schedule = optax.linear_schedule(lr, 0.0, anneal_steps) if anneal_steps else lr
    adam_ = optax.adam(schedule, eps=eps)
    if max_grad_norm is None:
        return adam_
    return optax.chain(optax.clip_by_global_norm(max_grad_norm), adam_)


def learning_rate(lr: jax.Array | float, anneal_steps: int | None, opt_state: Any) -> jax.Array:
    """The learning rate of the last update of `adam(lr, anneal_steps=...)` whose state is
    `opt_state` (`lr` before the first): the `train/lr` metric."""
    if not anneal_steps:
        return jnp.asarray(lr, jnp.float32)
    counts = [
        count
        for path, count in optax.tree_utils.tree_get_all_with_path(opt_state, "count")
        if getattr(path[-1], "tuple_name", None) == "ScaleByScheduleState"
    ]
    if not counts:
        raise ValueError(
            "learning_rate: opt_state holds no optax ScaleByScheduleState (an optimizer built "
            "by adam(lr, anneal_steps=...) has one)"
        )
    schedule = optax.linear_schedule(lr, 0.0, anneal_steps)
    return jnp.asarray(schedule(jnp.maximum(counts[0] - 1, 0)), jnp.float32)


def check_head(algo: str, what: str, out: Any, spec: EnvSpec, per_action: int = 1) -> None:
    """Raise `ShapeMismatchError` unless `out` (a network output, `[batch, k]`) has one entry
    per action of the env's action space (`per_action` per action dimension for a continuous
    one, e.g. 2 for a mean and a log-std). Checked when the algorithm is traced (at `build`,
    before any compile): a head of the wrong width would otherwise act outside the action
    space (an argmax over 3 logits on a 2-action env) or fail with a reshape error."""
    action = spec.action
    if action.num_actions is not None:
        need, space = action.num_actions, f"{action.num_actions} discrete actions"
    else:
        need, space = math.prod(action.shape), f"continuous actions of shape {action.shape}"
    width = None if out is None else tuple(out.shape[1:])
    if width != (need * per_action,):
        per = f" ({per_action} per action dimension)" if per_action > 1 else ""
        raise ShapeMismatchError(
            f"phase 'rollout': the {algo} network's {what} has shape {width} per observation, "
            f"but env '{spec.env_id}' has {space}: its {what} needs shape "
            f"({need * per_action},){per}"
        )


def check_values(what: str, values: Any, batch: int, phase: str = "rollout") -> None:
    """Raise `ShapeMismatchError` unless `values` (a value or Q network's output for `batch`
    observations) is `[batch]`: a `[batch, 1]` one would broadcast against `[batch]` targets
    into a `[batch, batch]` loss and train wrong without an error."""
    shape = getattr(values, "shape", None)
    if shape != (batch,):
        raise ShapeMismatchError(
            f"phase '{phase}': the {what} has shape {shape} for a batch of {batch} "
            f"observations; it must be ({batch},), one number per observation"
            + (" (squeeze the last axis: out[..., 0])" if shape == (batch, 1) else "")
        )


class AlgoConfig(Protocol):
    """The contract of an algorithm's config class (see the module docstring)."""

    name: str
    num_steps: int
    # The `algo.*` keys that are leaves of its `HParams` (traced: a sweep vmaps over them);
    # every other config key is static (it changes shapes or the compiled program).
    traced_keys: ClassVar[frozenset[str]]

    def check(self, num_envs: int, total_env_steps: int) -> None:
        """Raise ValueError naming config keys when sizes do not fit (before any compile)."""

    def hparams(self, spec: EnvSpec) -> Any:
        """The default `HParams` for this config."""

    # Optional: `check_observations(spec)`, a ValueError naming config keys when the networks
    # do not fit the env's observations (PPO, DQN: `algo.torso=cnn` on non-images).

    def build(
        self, spec: EnvSpec, num_envs: int, num_epochs: int, network: Any = None
    ) -> Algorithm:
        """The algorithm for this env spec and run length (`network`: an injected one)."""
