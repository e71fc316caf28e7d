"""A torch `nn.Module` as the acting policy: the fast path and the universal path.

`TorchFunction(module, path)` is a JAX function of the module's weights, `fn(params, x)`:

- `path="fast"`: the module is translated to native JAX ops (`convert.module_to_jax`); rollout
  runs at JAX speed; only the layers `convert.SUPPORTED` lists.
- `path="universal"`: any module, run by torch inside the jitted rollout through
  `jax.pure_callback` (DLPack zero-copy inside the callback); batched under `vmap` with
  `vmap_method="expand_dims"`, so a step is ONE torch call whatever the env vmap; gradients
  come from `torch.func.vjp` through a `custom_vjp`, so the JAX learner can train it.

Either way the weights are JAX params (a flat dict keyed like the module's state dict) that a
JAX learner updates; `export_to_torch(params, module)` writes them back into the module.
`TorchActorCritic` puts a torch actor (and optionally a torch critic; else a flax MLP critic)
behind the network interface PPO uses (`init(key, obs)`, `apply(params, obs)`).
`build_torch_policy` (the config's way in) checks the factory and runs its modules once in
torch against the env's shapes first, raising `TorchPolicyError` (a ValueError) before any tracing.
"""

from __future__ import annotations

import copy
import functools
import inspect
import math
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_engine.algos.networks import ConvSpec, torso_network
from jaxrl_engine.interop.convert import Params, UnsupportedModuleError, module_to_jax
from jaxrl_engine.interop.dlpack import BridgeReport, from_torch, to_torch
from jaxrl_engine.interop.torch_nets import TorchPolicyError, first_line

if TYPE_CHECKING:
    import torch

PolicyPath = Literal["fast", "universal"]


class TorchFunction:
    """`fn(params, x)`: the module as a JAX function of its weights (`x: [batch, *in_shape]`)."""

    def __init__(
        self, module: torch.nn.Module, path: PolicyPath = "fast", what: str = "the torch module"
    ):
        if path not in ("fast", "universal"):
            raise ValueError(f"torch policy path {path!r}: valid choices 'fast', 'universal'")
        self.module = module.eval()
        self.path, self.what = path, what
        # The input shapes (less the batch) on which the fast path's translation was found to
        # compute what the module computes (`check_translation`, run when first traced).
        self.checked: set[tuple[int, ...]] = set()
        # Buffers (running statistics, constants) and parameters with requires_grad=False
        # cross as params too, but torch keeps them fixed: so does JAX (no gradient reaches them)
        self.frozen = frozen_entries(module)
        if path == "fast":
            self._apply, _ = module_to_jax(module)
        else:
            self._apply = _universal_apply(module)

    def params(self, report: BridgeReport | None = None) -> Params:
        """The module's floating-point weights as JAX arrays (zero-copy: they alias torch's).

        Integer buffers (e.g. BatchNorm's step count) stay in the module.
        """
        return from_torch(float_state(self.module), copy="never", report=report)

    def check(self, in_shape: tuple[int, ...]) -> None:
        """On the fast path, `check_translation` for inputs of `in_shape` (less the batch),
        once per shape."""
        if self.path == "fast" and tuple(in_shape) not in self.checked:
            check_translation(self.module, self, self.what, in_shape)

    def __call__(self, params: Params, x: jax.Array) -> jax.Array:
        self.check(x.shape[1:])
        dtypes = {p.dtype for p in params.values()}
        if len(dtypes) == 1:  # a cast acting copy (e.g. bf16) computes in its own dtype
            x = x.astype(next(iter(dtypes)))
        if self.frozen:
            params = {
                k: jax.lax.stop_gradient(v) if k in self.frozen else v for k, v in params.items()
            }
        return self._apply(params, x)


def float_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's state dict without its integer buffers (what JAX params hold)."""
    return {k: v for k, v in module.state_dict().items() if v.is_floating_point()}


def frozen_entries(module: torch.nn.Module) -> frozenset[str]:
    """The entries of `float_state` that torch does not train: buffers, and parameters with
    `requires_grad=False` (a tied parameter is trainable under every name)."""
    trainable = {
        name for name, p in module.named_parameters(remove_duplicate=False) if p.requires_grad
    }
    return frozenset(set(float_state(module)) - trainable)


def export_to_torch(
    params: Params, module: torch.nn.Module, report: BridgeReport | None = None
) -> int:
    """Write JAX `params` into `module`'s weights in place (casting to their dtypes).

    One copy per leaf, into torch's own storage (so the module never aliases JAX buffers that
    JAX may free or donate). Returns the bytes written.
    """
    import torch

    state = float_state(module)
    missing = sorted(set(state) - set(params))
    extra = sorted(set(params) - set(state))
    if missing or extra:
        raise KeyError(
            f"params do not match the module's state dict: missing {missing}, unexpected {extra}"
        )
    written = 0
    tensors = to_torch(dict(params), report=report)
    with torch.no_grad():
        for name, target in state.items():
            target.copy_(tensors[name])
            written += target.numel() * target.element_size()
    return written


def _torch_dtype(dtype: Any) -> Any:
    import torch

    name = jnp.dtype(dtype).name
    found = getattr(torch, "bool" if name == "bool" else name, None)
    if not isinstance(found, torch.dtype):
        raise TypeError(f"dtype {name} has no torch counterpart")
    return found


def _lead(shape: tuple[int, ...], core_ndim: int) -> tuple[int, ...]:
    return shape[: len(shape) - core_ndim]


def _slot(module: torch.nn.Module, name: str) -> tuple[Any, str, str]:
    """(owning submodule, attribute, '_parameters' or '_buffers') of a state-dict entry."""
    *path, attr = name.split(".")
    owner = module.get_submodule(".".join(path)) if path else module
    kind = "_parameters" if attr in owner._parameters else "_buffers"
    return owner, attr, kind


def _universal_apply(module: torch.nn.Module):
    """A pure JAX function running `module` in torch through callbacks (see module docs).

    The weights cross as one flat vector per dtype (every callback argument costs tens of
    microseconds of callback machinery; inside a rollout scan XLA hoists the packing out of
    the loop); in torch they become views of that vector again.
    """
    import torch
    from torch.func import functional_call, vjp

    state = float_state(module)
    names = list(state)
    frozen = frozen_entries(module)
    # A private copy whose weight slots are rebound to the callback's views before each call:
    # cheaper than functional_call per step (that matters at one call per rollout step).
    runner = copy.deepcopy(module).eval()
    slots = {k: _slot(runner, k) for k in names}
    lock = threading.Lock()
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    out_cache: dict[tuple[Any, ...], jax.ShapeDtypeStruct] = {}

    def groups_of(params: Params) -> dict[str, list[str]]:
        groups: dict[str, list[str]] = {}
        for k in names:
            groups.setdefault(jnp.dtype(params[k].dtype).name, []).append(k)
        return groups

    def pack(params: Params, groups: dict[str, list[str]]) -> tuple[jax.Array, ...]:
        return tuple(jnp.concatenate([params[k].reshape(-1) for k in ks]) for ks in groups.values())

    def unpack(flats: Any, groups: dict[str, list[str]]) -> dict[str, Any]:
        out = {}
        for flat, ks in zip(flats, groups.values(), strict=True):
            sizes = [math.prod(shapes[k]) for k in ks]
            for k, v in zip(ks, flat.split(sizes), strict=True):
                out[k] = v.view(shapes[k])
        return out

    def out_struct(params: Params, x: jax.Array) -> jax.ShapeDtypeStruct:
        key = (x.shape, str(x.dtype), tuple(str(params[k].dtype) for k in names))
        if key not in out_cache:
            probe = {k: torch.zeros(shapes[k], dtype=_torch_dtype(params[k].dtype)) for k in names}
            x0 = torch.zeros((1, *x.shape[1:]), dtype=_torch_dtype(x.dtype))
            with torch.no_grad():
                y = functional_call(module, probe, (x0,))
            dtype = jnp.dtype(str(y.dtype).removeprefix("torch."))
            out_cache[key] = jax.ShapeDtypeStruct((x.shape[0], *y.shape[1:]), dtype)
        return out_cache[key]

    def call(p: dict[str, Any], xs: Any) -> Any:
        for k, (owner, attr, kind) in slots.items():
            getattr(owner, kind)[attr] = p[k]
        return runner(xs)

    def batched(flats: Any, x: Any, in_ndim: int, groups: dict[str, list[str]]) -> np.ndarray:
        """One torch call per distinct weights; vmapped axes lead every input."""
        x_t = torch.from_dlpack(x)
        flats_t = [torch.from_dlpack(f) for f in flats]
        if x_t.ndim == in_ndim and all(f.ndim == 1 for f in flats_t):  # not vmapped
            with lock, torch.inference_mode():
                return call(unpack(flats_t, groups), x_t).numpy()
        lead_x = _lead(tuple(x_t.shape), in_ndim)
        lead_p = [tuple(f.shape[:-1]) for f in flats_t]
        full = tuple(np.broadcast_shapes(lead_x, *lead_p))
        core = tuple(x_t.shape[len(lead_x) :])
        x_t = x_t.expand(*full, *core)

        with lock, torch.inference_mode():
            if all(math.prod(lp) == 1 for lp in lead_p):
                p = unpack([f.reshape(-1) for f in flats_t], groups)
                y = call(p, x_t.reshape(-1, *core[1:]))
                return y.reshape(*full, *core[:1], *y.shape[1:]).numpy()
            outs = []
            for idx in np.ndindex(*full):
                p = unpack([f.expand(*full, f.shape[-1])[idx] for f in flats_t], groups)
                outs.append(call(p, x_t[idx]))
            y = torch.stack(outs)
            return y.reshape(*full, *y.shape[1:]).numpy()

    def forward(params: Params, x: jax.Array) -> jax.Array:
        groups = groups_of(params)
        # x.ndim here is the per-call rank: vmap hides its axes from the traced function.
        host = functools.partial(batched, in_ndim=x.ndim, groups=groups)
        return jax.pure_callback(
            host, out_struct(params, x), pack(params, groups), x, vmap_method="expand_dims"
        )

    def vjp_host(flats: Any, x: Any, g: Any, groups: dict[str, list[str]]):
        """Gradients of the trainable weights (zeros for the frozen ones: torch cannot
        differentiate through e.g. BatchNorm's running statistics) and of the input."""
        p_t = unpack([torch.from_dlpack(f) for f in flats], groups)
        x_t, g_t = torch.from_dlpack(x), torch.from_dlpack(g)
        train = {k: v for k, v in p_t.items() if k not in frozen}
        fixed = {k: v for k, v in p_t.items() if k in frozen}
        if x_t.is_floating_point():
            _, pullback = vjp(
                lambda p, xs: functional_call(module, {**p, **fixed}, (xs,)), train, x_t
            )[:2]
            grads, grad_x = pullback(g_t)
        else:  # integer observations have no gradient
            _, pullback = vjp(lambda p: functional_call(module, {**p, **fixed}, (x_t,)), train)[:2]
            (grads,) = pullback(g_t)
            grad_x = torch.zeros(())
        full = {k: grads[k] if k in grads else torch.zeros_like(p_t[k]) for k in p_t}
        flat_grads = tuple(
            torch.cat([full[k].reshape(-1) for k in ks]).numpy() for ks in groups.values()
        )
        return (*flat_grads, grad_x.expand(x_t.shape).contiguous().numpy())

    @jax.custom_vjp
    def apply(params: Params, x: jax.Array) -> jax.Array:
        return forward(params, x)

    def apply_fwd(params: Params, x: jax.Array):
        return forward(params, x), (params, x)

    def apply_bwd(res, g):
        params, x = res
        groups = groups_of(params)
        flats = pack(params, groups)
        structs = tuple(jax.ShapeDtypeStruct(f.shape, f.dtype) for f in flats)
        x_struct = jax.ShapeDtypeStruct(x.shape, x.dtype)
        host = functools.partial(vjp_host, groups=groups)
        *grad_flats, grad_x = jax.pure_callback(
            host, (*structs, x_struct), flats, x, g, vmap_method="sequential"
        )
        grads = {}
        for flat, ks in zip(grad_flats, groups.values(), strict=True):
            offsets = np.cumsum([0] + [math.prod(shapes[k]) for k in ks])
            for k, lo, hi in zip(ks, offsets[:-1], offsets[1:], strict=True):
                grads[k] = flat[lo:hi].reshape(shapes[k])
        if not jnp.issubdtype(x.dtype, jnp.floating):
            grad_x = np.zeros(x.shape, jax.dtypes.float0)  # what JAX takes for an int input
        return grads, grad_x

    apply.defvjp(apply_fwd, apply_bwd)
    return apply


class TorchActorCritic:
    """PPO's actor-critic with a torch actor (and optionally a torch critic).

    `init(key, obs)` -> `{"actor": ..., "critic": ..., ["log_std"]}` where the torch parts are
    the modules' current weights (copied into the state at init); `apply(params, obs)` ->
    `(logits or mean [batch, action_dim], log_std | None, value [batch])`, like `ActorCritic`.
    acting_dtype: the dtype of the acting copy that `sync_weights` makes (None: as trained);
    conv: the flax critic's CNN torso (None: an MLP).
    """

    def __init__(
        self,
        actor: torch.nn.Module,
        *,
        action_dim: int,
        discrete: bool,
        critic: torch.nn.Module | None = None,
        path: PolicyPath = "fast",
        hidden_sizes: Sequence[int] = (64, 64),
        activation: str = "tanh",
        acting_dtype: str | None = None,
        conv: ConvSpec | None = None,
    ):
        self.actor_module, self.critic_module = actor, critic
        check_weights(actor, "the torch actor")
        self.actor = TorchFunction(actor, path, "the torch actor")
        self.critic = None
        if critic is not None:
            check_weights(critic, "the torch critic")
            self.critic = TorchFunction(critic, path, "the torch critic")
        self.flax_critic = torso_network(conv, hidden_sizes, 1, activation, out_scale=1.0)
        self.action_dim, self.discrete, self.path = action_dim, discrete, path
        self.acting_dtype = jnp.dtype(acting_dtype) if acting_dtype else None

    def init(self, key: jax.Array, obs: jax.Array) -> dict[str, Any]:
        for fn in (self.actor, self.critic):  # (first traced here: its error, unwrapped)
            if fn is not None:
                fn.check(obs.shape[1:])
        # Copies of the torch weights (jnp.array): the learner must not alias torch's storage.
        params: dict[str, Any] = {"actor": jax.tree.map(jnp.array, self.actor.params())}
        if self.critic is not None:
            params["critic"] = jax.tree.map(jnp.array, self.critic.params())
        else:
            params["critic"] = self.flax_critic.init(key, obs)
        if not self.discrete:
            params["log_std"] = jnp.zeros((self.action_dim,), jnp.float32)
        return params

    def apply(self, params: dict[str, Any], obs: jax.Array):
        head = self.actor(params["actor"], obs).astype(jnp.float32)
        value: Any
        if self.critic is not None:
            value = self.critic(params["critic"], obs)[..., 0]
        else:
            value = self.flax_critic.apply(params["critic"], obs.astype(jnp.float32))
            value = value[..., 0]
        log_std = params.get("log_std")
        return head, log_std, value.astype(jnp.float32)

    def acting_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """What `sync_weights` hands the actor: the params, cast to `acting_dtype` if set."""
        if self.acting_dtype is None:
            return params
        return {
            **params,
            "actor": jax.tree.map(lambda p: p.astype(self.acting_dtype), params["actor"]),
        }

    def export_to_torch(self, params: dict[str, Any]) -> int:
        """Write trained params back into the torch actor (and critic); returns bytes written."""
        written = export_to_torch(params["actor"], self.actor_module)
        if self.critic_module is not None:
            written += export_to_torch(params["critic"], self.critic_module)
        return written


def build_torch_policy(
    torch_cfg: Any,
    spec: Any,
    hidden_sizes: Sequence[int],
    activation: str,
    conv: ConvSpec | None = None,
):
    """`TorchActorCritic` from an `algo.torch_policy` config section and the env spec
    (`conv`: the flax critic's CNN torso, with `critic: jax`).

    Raises `TorchPolicyError` (a ValueError) before anything is traced when the factory cannot
    be imported or called, its modules do not fit the env (run once in torch to check), or
    `algo.torch_policy.obs_layout` contradicts the env's.
    """
    from jaxrl_engine.interop.torch_nets import mlp, resolve_factory

    where = f"algo.torch_policy.factory {torch_cfg.factory!r}"
    try:
        import torch
    except ImportError as e:
        raise TorchPolicyError(f"{where}: torch is not installed ({e})") from None
    factory = resolve_factory(torch_cfg.factory)
    discrete = spec.action.discrete
    action_dim = int(spec.action.num_actions or np.prod(spec.action.shape))
    torch.manual_seed(torch_cfg.torch_seed)
    kwargs = dict(torch_cfg.kwargs)
    if factory is mlp:  # the built-in MLP follows algo.hidden_sizes / algo.activation
        kwargs.setdefault("hidden_sizes", tuple(hidden_sizes))
        kwargs.setdefault("activation", activation)
    layout = obs_layout(torch_cfg.obs_layout, spec)
    if layout is not None and _takes(factory, "obs_layout"):
        kwargs.setdefault("obs_layout", layout)
    call = functools.partial(_call_factory, factory, where, kwargs, dict(torch_cfg.kwargs))
    actor = call(spec.obs_shape, action_dim, 0.01)
    critic = call(spec.obs_shape, 1, 1.0) if torch_cfg.critic == "torch" else None
    env = f"env {spec.env_id}" if getattr(spec, "env_id", None) else "the env"
    if discrete:
        wanted = f"{env} has {action_dim} actions"
    else:
        wanted = f"{env} has {action_dim}-dimensional actions (shape {tuple(spec.action.shape)})"
    _check_module(actor, f"{where}: the torch actor", spec.obs_shape, env, action_dim, wanted)
    if critic is not None:
        wanted = "a critic must output 1 value (the state value)"
        _check_module(critic, f"{where}: the torch critic", spec.obs_shape, env, 1, wanted)
    try:
        network = TorchActorCritic(
            actor,
            action_dim=action_dim,
            discrete=discrete,
            critic=critic,
            path=torch_cfg.path,
            hidden_sizes=hidden_sizes,
            activation=activation,
            acting_dtype=torch_cfg.acting_dtype,
            conv=conv,
        )
        if torch_cfg.path == "fast":
            check_translation(actor, network.actor, f"{where}: the torch actor", spec.obs_shape)
            if critic is not None and network.critic is not None:
                check_translation(
                    critic, network.critic, f"{where}: the torch critic", spec.obs_shape
                )
        return network
    except TorchPolicyError:
        raise
    except UnsupportedModuleError as e:
        raise TorchPolicyError(f"{where}: {e}") from None
    except Exception as e:  # a translation that fails while being traced (e.g. an index list)
        raise TorchPolicyError(
            f"{where}: the fast path cannot translate the module ({first_line(e)}); use "
            "algo.torch_policy.path=universal, which calls the module itself"
        ) from None


def obs_layout(configured: str | None, spec: Any) -> str | None:
    """The axis order of image observations: `algo.torch_policy.obs_layout`, else the env
    spec's, else "hwc"; None for observations that are not images. TorchPolicyError when the
    configured layout contradicts the one the env declares."""
    if len(spec.obs_shape) != 3:
        return None
    declared = getattr(spec, "obs_layout", None)
    if configured is not None and declared is not None and configured != declared:
        raise TorchPolicyError(
            f"algo.torch_policy.obs_layout={configured}, but env {spec.env_id} declares "
            f"{declared} observations (shape {list(spec.obs_shape)}): leave it null, or set "
            f"{declared}"
        )
    return configured or declared or "hwc"


def _takes(factory: Any, name: str) -> bool:
    """Whether `factory` has a parameter called `name`."""
    try:
        return name in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False


def _call_factory(
    factory: Any,
    where: str,
    kwargs: dict[str, Any],
    given: dict[str, Any],
    in_shape: tuple[int, ...],
    out_dim: int,
    scale: float,
) -> torch.nn.Module:
    """`factory(in_shape, out_dim, scale, **kwargs)`, which must return an nn.Module
    (`given`: the user's `algo.torch_policy.kwargs`, for messages)."""
    import torch

    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # builtins and some C callables have none
        signature = None
    if signature is not None:
        try:
            signature.bind(in_shape, out_dim, scale, **kwargs)
        except TypeError as e:
            empty = inspect.Parameter.empty
            plain = [p.replace(annotation=empty) for p in signature.parameters.values()]
            takes = signature.replace(parameters=plain, return_annotation=empty)
            raise TorchPolicyError(
                f"{where}: cannot be called as f(in_shape, out_dim, out_scale, "
                f"**algo.torch_policy.kwargs) with algo.torch_policy.kwargs {given}: {e}; "
                f"it takes {takes}"
            ) from None
    try:
        module = factory(in_shape, out_dim, scale, **kwargs)
    except Exception as e:
        raise TorchPolicyError(
            f"{where}: the factory raised {first_line(e)} (called with in_shape={in_shape}, "
            f"out_dim={out_dim}, out_scale={scale}, algo.torch_policy.kwargs {given})"
        ) from None
    if not isinstance(module, torch.nn.Module):
        raise TorchPolicyError(
            f"{where}: the factory returned {type(module).__name__}, not a torch.nn.Module"
        )
    return module


def check_weights(module: torch.nn.Module, what: str) -> None:
    """`TorchPolicyError` unless the module's floating-point weights are float32 and in CPU
    memory (what the engine trains; a float16 actor would otherwise fail deep in the update
    with a dtype error of `lax.select`)."""
    import torch

    weights = list(float_state(module).values())
    dtypes = sorted({str(w.dtype).removeprefix("torch.") for w in weights} - {"float32"})
    if dtypes:
        raise TorchPolicyError(
            f"{what} has {', '.join(dtypes)} weights: the engine trains float32 modules; give "
            "it module.float() (return it from the factory; algo.torch_policy.acting_dtype="
            "bfloat16 or float16, or TorchActorCritic(acting_dtype=...), acts with a "
            "lower-precision copy)"
            + (
                f"; torch's default dtype is {torch.get_default_dtype()} in this process "
                "(torch.set_default_dtype), which layers built without a dtype take"
                if torch.get_default_dtype() != torch.float32
                else ""
            )
        )
    devices = sorted({str(w.device) for w in weights} - {"cpu"})
    if devices:
        raise TorchPolicyError(
            f"{what} has weights on {', '.join(devices)}: the engine takes them from CPU "
            "memory; give it module.cpu() (return it from the factory)"
        )


def _check_module(
    module: torch.nn.Module,
    what: str,
    obs_shape: tuple[int, ...],
    env: str,
    out_dim: int,
    wanted: str,
) -> None:
    """Run `module` (eval mode, no grad) on batches of two and three observations: it must
    hold float32 weights, accept the env's observations and output `[batch, out_dim]`."""
    import torch

    check_weights(module, what)
    x = probe_batch(obs_shape)
    training = module.training
    try:
        with torch.no_grad():
            y = module.eval()(x)
    except Exception as e:
        raise TorchPolicyError(
            f"{what} does not accept {env}'s observations of shape {tuple(obs_shape)}"
            f"{_expected_input(module)}: torch raised {first_line(e)}"
        ) from None
    else:
        try:  # the batch size is not written into forward
            with torch.no_grad():
                y3: Any = module(probe_batch(obs_shape, 3))
        except Exception as e:
            y3 = f"raises {first_line(e)}"
    finally:
        module.train(training)
    if not isinstance(y, torch.Tensor):
        raise TorchPolicyError(f"{what} returns {type(y).__name__}, not a tensor; {wanted}")
    if tuple(y.shape) != (2, out_dim):
        if y.ndim == 2 and y.shape[0] == 2:
            got = f"outputs {y.shape[1]} values per observation"
        else:
            got = f"outputs shape {list(y.shape)} for a batch of 2 observations, not [2, {out_dim}]"
        raise TorchPolicyError(f"{what} {got}; {wanted}")
    if not isinstance(y3, torch.Tensor) or tuple(y3.shape) != (3, out_dim):
        got = y3 if isinstance(y3, str) else f"outputs shape {list(getattr(y3, 'shape', []))}"
        raise TorchPolicyError(
            f"{what} works on a batch of 2 observations but on 3 {got}, not [3, {out_dim}]: "
            "its output must follow the batch size (a batch size written into forward, e.g. "
            "x.view(2, -1)? use x.flatten(1))"
        )


def probe_batch(obs_shape: tuple[int, ...], n: int = 2) -> torch.Tensor:
    """`n` fixed, distinct observations (a module that only handles a batch of one, or mixes
    the batch, shows on them)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    return torch.randn((n, *obs_shape), generator=generator)


def check_translation(module: torch.nn.Module, fn: TorchFunction, what: str, obs_shape) -> None:
    """The fast path's JAX function must compute what the module computes: on the probe batch
    the two agree to 1e-4 (relative), or `TorchPolicyError`. torch.fx cannot see some
    semantics (an in-place `+=` on a tensor used again, `x.squeeze(1)` of a dimension that is
    not 1): such a module is refused here instead of training something else. `TorchFunction`
    runs it when first traced on inputs of a new shape (`build_torch_policy` earlier, with the
    config key in `what`)."""
    import torch

    obs_shape = tuple(obs_shape)
    fn.checked.add(obs_shape)  # (the check's own call of fn below checks nothing)
    x = probe_batch(obs_shape)
    weights = list(float_state(module).values())
    with torch.no_grad():
        want = module.eval()(x.to(weights[0].device) if weights else x).cpu().numpy()
    with jax.ensure_compile_time_eval():  # concrete, also while an algorithm is traced
        got = np.asarray(jax.jit(fn)(fn.params(), jnp.asarray(x.numpy())))
    error = float(np.max(np.abs(got - want))) if got.shape == want.shape else float("inf")
    if not error <= 1e-4 * max(1.0, float(np.max(np.abs(want)))):
        fn.checked.discard(obs_shape)
        raise TorchPolicyError(
            f"{what}: the fast path's translation does not compute what the module computes "
            f"(max difference {error:.3g} on a probe batch): its forward may change a tensor "
            "in place (`+=`, `inplace=True`) or use an op whose torch semantics the "
            "translation does not follow; use the universal path (algo.torch_policy."
            "path=universal, or path='universal'), which calls the module itself"
        )


def _expected_input(module: torch.nn.Module) -> str:
    """'; its first Linear takes N input features' (or Conv2d channels), if it has one."""
    from torch import nn

    for m in module.modules():
        if isinstance(m, nn.Linear):
            return f"; its first Linear takes {m.in_features} input features"
        if isinstance(m, nn.Conv2d):
            return f"; its first Conv2d takes {m.in_channels} input channels"
    return ""
