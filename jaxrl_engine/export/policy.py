"""Policy export: a trained policy as a self-contained artefact, usable without the engine.

`engine.run` writes one to `runs/<name>/policy/` after the last epoch (`export_policy`):

    act.jaxexport  the deterministic acting function `act(params, obs) -> action`, serialized
                   with `jax.export` (StableHLO; symbolic batch size; lowered for cpu and cuda)
    params.npz     its params, flat: `net.params.MLP_0.Dense_0.kernel`, `obs_norm.mean`, ...
    policy.py      the loader (jax + numpy only): `act, params = policy.load(directory)`
    meta.json      env id, observation and action specs, algorithm, versions, torch spec
    torch_policy.py, torch_policy.pt
                   with `torch=True` (or `jaxrl-engine export RUN --torch`): the actor as a torch
                   `nn.Module` whose weights came over DLPack; loader needs torch only
    torch_actor.pt a policy trained with `algo.torch_policy`: the state dict of your factory's
                   actor module with the trained weights (`module.load_state_dict`); written
                   on the universal path too, which has no `jax.export` form

Why `jax.export` for the JAX path rather than generated Python: the artefact is the very graph
the engine acts with (the same discrete actions for the same observations, but for an argmax
at a near-tie; continuous ones equal to float32 rounding), for
any algorithm whose `act` is JAX (PPO, DQN, SAC, torch fast-path policies) without
per-architecture code, and it runs on jax alone. Its limits: StableHLO artefacts load in jax
releases for at least 6 months after (jax's compatibility guarantee), and a policy acting
through a host callback (the universal torch path) cannot be exported. The torch module is per
architecture: the flax MLP actor-critic (PPO).
"""

from __future__ import annotations

import copy
import json
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_engine.algos.networks import ActorCritic
from jaxrl_engine.core.engine import Engine
from jaxrl_engine.interop.dlpack import to_torch
from jaxrl_engine.interop.torch_policy import export_to_torch
from jaxrl_engine.io.files import atomic_write, atomic_writer

if TYPE_CHECKING:
    import torch

POLICY_DIR = "policy"  # inside a run directory
PLATFORMS = ("cpu", "cuda")
HERE = Path(__file__).resolve().parent
ARTEFACT_FILES = (
    "act.jaxexport",
    "params.npz",
    "policy.py",
    "meta.json",
    "torch_policy.py",
    "torch_policy.pt",
    "torch_actor.pt",
)
TORCH_ACTOR = "torch_actor.pt"


class ExportError(ValueError):
    """The policy cannot be exported or loaded: says which part and what to do."""


class NoTorchForm(ExportError):
    """The policy has no torch module to export (not a flax MLP actor-critic)."""


def acting_function(engine: Engine) -> Callable[[Any, jax.Array], jax.Array]:
    """`act(params, obs) -> action`: the deterministic action `evaluate` sends to the env
    (continuous actions clipped to the bounds). obs: [batch, *obs_shape]."""

    def act(params: Any, obs: jax.Array) -> jax.Array:
        action, _ = engine.algo.act(params, obs, jax.random.key(0), True)
        return engine.spec.action.clip(action)

    return act


def flatten_params(params: Any) -> dict[str, np.ndarray]:
    """A params pytree as a flat dict `{"net.params.MLP_0.Dense_0.kernel": array, ...}`."""
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    return {
        jax.tree_util.keystr(path, simple=True, separator="."): np.asarray(jax.device_get(leaf))
        for path, leaf in leaves
    }


def unflatten_params(like: Any, flat: dict[str, Any]) -> Any:
    """`flat` (names as `flatten_params` gives them) back into the structure of `like`."""
    leaves = jax.tree_util.tree_flatten_with_path(like)
    names = [jax.tree_util.keystr(path, simple=True, separator=".") for path, _ in leaves[0]]
    missing, extra = sorted(set(names) - set(flat)), sorted(set(flat) - set(names))
    if missing or extra:
        raise ExportError(
            f"saved params do not match this engine's policy: missing {missing}, unexpected "
            f"{extra}; was the policy exported from another config?"
        )
    for (_, leaf), name in zip(leaves[0], names, strict=True):
        if tuple(np.shape(flat[name])) != tuple(leaf.shape):
            raise ExportError(
                f"saved param {name!r} has shape {tuple(np.shape(flat[name]))}, this engine's "
                f"policy expects {tuple(leaf.shape)}"
            )
    return jax.tree.unflatten(
        leaves[1],
        [
            jnp.asarray(as_saved(flat[n], x.dtype), x.dtype)
            for n, (_, x) in zip(names, leaves[0], strict=True)
        ],
    )


def as_saved(array: Any, dtype: Any) -> Any:
    """`array` read back from `params.npz` as `dtype`: numpy saves bfloat16 (no numpy dtype
    of its own) as raw 2-byte records, which are its bits."""
    array = np.asarray(array)
    if array.dtype.kind == "V" and array.dtype.itemsize == np.dtype(dtype).itemsize:
        return array.view(dtype)
    return array


def torch_spec(engine: Engine, flat: dict[str, np.ndarray]) -> dict[str, Any] | None:
    """What `torch_policy.Policy` needs to rebuild the actor; None if it is not a flax MLP."""
    network = engine.algo.static.get("network")
    if not isinstance(network, ActorCritic) or network.conv is not None:
        return None
    kernels = sorted(
        (n for n in flat if n.startswith("net.params.MLP_0.") and n.endswith(".kernel")),
        key=lambda n: int(n.split(".")[-2].removeprefix("Dense_")),
    )
    spec = engine.spec
    return {
        "kind": "mlp_actor",
        "layers": [n.removesuffix(".kernel") for n in kernels],
        "in_features": int(flat[kernels[0]].shape[0]),
        "hidden_sizes": [int(flat[k].shape[1]) for k in kernels[:-1]],
        "out_features": int(flat[kernels[-1]].shape[1]),
        "activation": network.activation,
        "discrete": spec.action.discrete,
        "normalize_obs": bool(engine.algo.static.get("normalize_obs", False)),
        "obs_shape": list(spec.obs_shape),
        "action_shape": list(spec.action.shape),
        "low": None if spec.action.low is None else list(np.ravel(spec.action.low)),
        "high": None if spec.action.high is None else list(np.ravel(spec.action.high)),
    }


def export_acting(
    engine: Engine, params: Any, platforms: tuple[str, ...] = PLATFORMS
) -> jax.export.Exported:
    """The acting function as `jax.export`'s StableHLO, its params an input (not constants): one
    export serves every params pytree of the same leaves' shapes and dtypes (a sweep's
    members). Raises `ExportError` when the acting function has no StableHLO form."""
    flat = flatten_params(params)
    names = list(flat)
    treedef = jax.tree.structure(params)
    act = acting_function(engine)

    def act_flat(flat_params: dict[str, jax.Array], obs: jax.Array) -> jax.Array:
        return act(jax.tree.unflatten(treedef, [flat_params[n] for n in names]), obs)

    (batch,) = jax.export.symbolic_shape("batch")
    obs_spec = jax.ShapeDtypeStruct((batch, *engine.spec.obs_shape), engine.spec.obs_dtype)
    try:
        return jax.export.export(jax.jit(act_flat), platforms=platforms)(
            {n: jax.ShapeDtypeStruct(v.shape, v.dtype) for n, v in flat.items()}, obs_spec
        )
    except Exception as e:
        raise ExportError(
            f"the acting function of algorithm {engine.algo.name!r} cannot be exported with "
            f"jax.export ({type(e).__name__}: {(str(e).splitlines() or [''])[0]}); a policy acting "
            f"through a host callback (algo.torch_policy.path=universal) has no StableHLO "
            f"form"
        ) from e


def export_policy(
    engine: Engine,
    params: Any,
    directory: str | Path,
    *,
    torch: bool = False,
    platforms: tuple[str, ...] = PLATFORMS,
    exported: jax.export.Exported | None = None,
) -> Path:
    """Write the policy artefact for acting params `params` (e.g. `state.eval_params`).

    exported: `export_acting(engine, params, platforms)` made once for params of these shapes
    (a sweep's members share one); None: made here."""
    directory = Path(directory)
    for name in ARTEFACT_FILES:  # never leave another policy's files beside this one's
        (directory / name).unlink(missing_ok=True)
    actor = write_torch_actor(engine, params, directory)
    flat = flatten_params(params)
    if exported is not None and [(a.shape, a.dtype) for a in exported.in_avals[:-1]] != [
        (v.shape, v.dtype) for v in jax.tree.leaves(flat)
    ]:
        raise ValueError("export_policy: `exported` was made for params of other shapes")
    try:
        if exported is None:
            exported = export_acting(engine, params, platforms)
        blob = exported.serialize()
    except ExportError as e:
        if not actor:
            raise
        raise ExportError(f"{e} (its torch actor's trained weights: {actor})") from e.__cause__
    directory.mkdir(parents=True, exist_ok=True)
    # Each file whole or not at all, never written through a symlink (`io.files`).
    atomic_write(directory / "act.jaxexport", bytes(blob))
    atomic_writer(directory / "params.npz", lambda f: np.savez(f, **flat))  # type: ignore[arg-type]
    atomic_write(directory / "policy.py", (HERE / "jax_loader.py").read_bytes())
    action = engine.spec.action
    meta = {
        "format": 1,
        "env_id": engine.spec.env_id,
        "algorithm": engine.algo.name,
        "obs_shape": list(engine.spec.obs_shape),
        "obs_dtype": np.dtype(engine.spec.obs_dtype).name,
        "action_shape": list(action.shape),
        "action_dtype": np.dtype(exported.out_avals[0].dtype).name,
        "num_actions": action.num_actions,
        "action_low": None if action.low is None else list(np.ravel(action.low)),
        "action_high": None if action.high is None else list(np.ravel(action.high)),
        "platforms": list(platforms),
        "jax_version": jax.__version__,
        "params": {n: list(v.shape) for n, v in flat.items()},
        "torch": torch_spec(engine, flat),
        "torch_actor": TORCH_ACTOR if actor else None,
    }
    atomic_write(directory / "meta.json", json.dumps(meta, indent=2))
    if torch:
        export_torch(directory, params=params)
    return directory


def torch_module(spec: dict[str, Any], params: Any) -> torch.nn.Module:
    """The actor as a `torch_policy.Policy` whose weights come from JAX `params` over DLPack.

    params: the acting params pytree (JAX arrays; read zero-copy by DLPack) or a flat dict from
    `flatten_params`. The module owns copies (JAX may free or donate its buffers later).
    """
    from jaxrl_engine.export.torch_loader import Policy

    leaves = jax.tree_util.tree_flatten_with_path(params)[0]  # a flat dict flattens to itself
    arrays = {
        jax.tree_util.keystr(path, simple=True, separator="."): jnp.asarray(leaf)
        for path, leaf in leaves
    }
    tensors = to_torch(arrays, copy="if_needed")
    policy = Policy(spec)
    state = policy.state_dict()  # load_state_dict copies: the module owns its weights
    for i, name in enumerate(spec["layers"]):
        state[f"layers.{i}.weight"] = tensors[f"{name}.kernel"].T
        state[f"layers.{i}.bias"] = tensors[f"{name}.bias"]
    state["obs_mean"] = tensors["obs_norm.mean"]
    state["obs_var"] = tensors["obs_norm.var"]
    policy.load_state_dict(state)
    return policy.eval()


def write_torch_actor(engine: Engine, params: Any, directory: Path) -> Path | None:
    """`<directory>/torch_actor.pt` for a policy whose actor is a torch module of the user's
    (`algo.torch_policy`): a copy of the module holding the acting params' actor weights
    (cast to the module's dtypes), saved as its state dict. None for any other policy."""
    network = engine.algo.static.get("network")
    module = getattr(network, "actor_module", None)
    net = params.get("net") if isinstance(params, dict) else None
    if module is None or not isinstance(net, dict) or "actor" not in net:
        return None
    import torch  # (the torch extra: a policy with a torch actor has it)

    trained = copy.deepcopy(module)  # (the engine's own module is left as the user gave it)
    export_to_torch(jax.tree.map(jnp.asarray, net["actor"]), trained)  # (host copies too)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / TORCH_ACTOR
    atomic_writer(path, lambda f: torch.save(trained.state_dict(), f))
    return path


def export_torch(directory: str | Path, params: Any = None) -> Path:
    """Add `torch_policy.py` + `torch_policy.pt` to a policy directory (params default: its
    `params.npz`). Needs torch (`pip install 'jaxrl-engine[torch]'`): ExportError without it."""
    directory = Path(directory)
    spec = json.loads((directory / "meta.json").read_text())["torch"]
    if spec is None:
        actor = directory / TORCH_ACTOR
        raise NoTorchForm(
            f"{directory}: this policy is not a flax MLP actor-critic, so there is no torch "
            "module for it; use the JAX artefact (policy.py)"
            + (
                f", or your factory's actor module with its trained weights: "
                f"module.load_state_dict(torch.load({str(actor)!r}))"
                if actor.is_file()
                else ""
            )
        )
    try:
        import torch
    except ImportError:
        raise ExportError(
            "the torch module of a policy needs torch: pip install 'jaxrl-engine[torch]' "
            "(the JAX artefact is policy.py)"
        ) from None
    if params is None:
        with np.load(directory / "params.npz") as data:
            params = {n: data[n] for n in data.files}
    module = torch_module(spec, params)
    atomic_writer(directory / "torch_policy.pt", lambda f: torch.save(module.state_dict(), f))
    atomic_write(directory / "torch_policy.py", (HERE / "torch_loader.py").read_bytes())
    return directory


def load_exported(directory: str | Path) -> tuple[jax.export.Exported, dict[str, np.ndarray]]:
    """(the exported acting function, its flat params) of a policy directory; `ExportError`
    when the files are missing or unreadable. Call it as `exported.call(params, obs)`."""
    directory = Path(directory)
    run_dir = directory.parent
    try:
        exported = jax.export.deserialize(bytearray((directory / "act.jaxexport").read_bytes()))
    except (OSError, ValueError, TypeError, struct.error) as e:
        raise ExportError(
            f"{directory} does not hold a readable exported policy ({type(e).__name__}: {e}); "
            f"re-export it from a checkpoint with `jaxrl-engine export {run_dir} --checkpoint`"
        ) from None
    params = _read_params(directory / "params.npz")
    # The graph's own params (names, shapes, dtypes) against the file's: a file edited or
    # copied from another run would fail inside the call with a bare shape error.
    args, _ = jax.tree.unflatten(exported.in_tree, exported.in_avals)
    wanted = args[0]
    problem = None
    if set(params) != set(wanted):
        missing, extra = sorted(set(wanted) - set(params)), sorted(set(params) - set(wanted))
        problem = f"its params are not the graph's: missing {missing[:3]}, unexpected {extra[:3]}"
    else:
        for name, aval in wanted.items():
            have = params[name] = as_saved(params[name], aval.dtype)
            if tuple(have.shape) != tuple(aval.shape) or have.dtype != aval.dtype:
                problem = (
                    f"saved param {name!r} is {have.dtype}{list(have.shape)}, the exported "
                    f"graph takes {aval.dtype}{list(aval.shape)}"
                )
                break
    if problem is not None:
        raise ExportError(
            f"{directory / 'params.npz'} does not fit {directory / 'act.jaxexport'}: {problem}; "
            f"re-export it from a checkpoint with `jaxrl-engine export {run_dir} --checkpoint`"
        )
    return exported, params


def load_params(engine: Engine, directory: str | Path) -> Any:
    """The acting params saved in a policy directory, in this engine's structure."""
    path = Path(directory) / "params.npz"
    if not path.is_file():
        raise ExportError(
            f"{path} does not exist: train with `jaxrl-engine train` (it exports the policy at "
            "the end) or call jaxrl_engine.export.export_policy"
        )
    return unflatten_params(engine.state_shape.eval_params, _read_params(path))


def _read_params(path: Path) -> dict[str, np.ndarray]:
    """A policy directory's `params.npz`; `ExportError` naming it when it is unreadable."""
    try:
        with np.load(path) as data:
            return {name: data[name] for name in data.files}
    except (OSError, ValueError, TypeError, struct.error, zipfile.BadZipFile) as e:
        raise ExportError(
            f"{path} is not a readable params file ({type(e).__name__}: {e}); re-export it "
            f"from a checkpoint with `jaxrl-engine export {path.parent.parent} --checkpoint`"
        ) from None
