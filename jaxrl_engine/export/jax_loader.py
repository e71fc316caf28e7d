"""A policy exported by jaxrl_engine; needs only jax, numpy and flatbuffers (not jaxrl_engine).

    import policy                                   # this file, from the policy directory
    act, params = policy.load()                     # or policy.load("path/to/policy")
    action = act(params, obs)                       # obs: [batch, *obs_shape] -> [batch, ...]

`act` is the engine's deterministic action (what `evaluate` sends to the env, continuous actions
clipped to the action bounds), serialized with `jax.export` (StableHLO; any batch size; cpu and
cuda). `params` is a flat dict of numpy arrays (`net.params.MLP_0.Dense_0.kernel`, ...): replace
them with other params of the same names and shapes (e.g. a later export) and `act` uses them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def load(directory: str | Path | None = None) -> tuple[Callable[[Any, Any], Any], dict[str, Any]]:
    """(act, params) of the policy directory (default: the directory holding this file)."""
    directory = Path(directory) if directory is not None else Path(__file__).resolve().parent
    meta = _read(directory / "meta.json", lambda p: json.loads(p.read_text()))
    exported = _read(
        directory / "act.jaxexport", lambda p: jax.export.deserialize(bytearray(p.read_bytes()))
    )
    params = _read(directory / "params.npz", _load_params)
    (wanted, _), _ = jax.tree.unflatten(exported.in_tree, exported.in_avals)
    for name, aval in wanted.items():  # bfloat16 is saved as raw 2-byte records: its bits
        have = params.get(name)
        if have is not None and have.dtype.kind == "V" and have.dtype.itemsize == 2:
            params[name] = have.view(aval.dtype)
    obs_dtype = np.dtype(meta["obs_dtype"])
    no_actions = jnp.zeros((0, *meta["action_shape"]), meta["action_dtype"])

    def act(params: dict[str, Any], obs: Any) -> Any:
        """obs: [batch, *obs_shape] -> action: [batch, *action_shape] (a jax.Array)."""
        given = np.asarray(obs)
        with np.errstate(invalid="ignore", over="ignore"):
            obs = given.astype(obs_dtype, copy=False)
        if obs is not given and obs_dtype.kind in "biu" and not np.array_equal(obs, given):
            raise ValueError(
                f"act(params, obs): obs holds {given.dtype} values that {obs_dtype} cannot "
                f"hold exactly (this policy's observations are {obs_dtype}, as its env gives "
                "them: e.g. images as 0..255 integers, not scaled to [0, 1])"
            )
        want = tuple(meta["obs_shape"])
        if obs.shape[1:] != want or obs.ndim != len(want) + 1:
            one = " (one observation: obs[None])" if obs.shape == want else ""
            raise ValueError(
                f"act(params, obs): obs has shape {list(obs.shape)}, this policy takes "
                f"[batch{''.join(f', {d}' for d in want)}]{one}"
            )
        if obs.shape[0] == 0:  # (the graph's batch dimension is >= 1)
            return no_actions
        return exported.call(params, obs)

    return act, params


def _load_params(path: Path) -> dict[str, Any]:
    with np.load(path) as data:
        return {name: data[name] for name in data.files}


def _read(path: Path, read: Callable[[Path], Any]) -> Any:
    """`read(path)`; a file missing, damaged or not this format is an error naming it."""
    try:
        return read(path)
    except Exception as e:  # (json, zipfile, flatbuffers and numpy each raise their own)
        raise ValueError(
            f"{path} cannot be read as a policy file ({type(e).__name__}: {e}); export the "
            "policy again (jaxrl-engine export RUN_DIR --checkpoint)"
        ) from e
