"""The DLPack bridge: whole pytrees between torch and JAX, zero-copy where the layout allows.

`from_torch(tree)` / `to_torch(tree)` convert every tensor/array leaf of a pytree (a state
dict, a batch, params) and leave other leaves alone. `copy` decides what may happen:

- `"never"` (default): zero-copy or a `BridgeError` that says what was wrong and what to do;
- `"if_needed"`: zero-copy where DLPack allows it, otherwise ONE explicit copy (or a checked
  cast), recorded in the `BridgeReport` passed as `report=`;
- `"always"`: every leaf is copied (nothing aliases the source), recorded too.

The traps of NOTES-jax-torch.md (jax 0.10.2, torch 2.13) and what the bridge does with them:

| trap | never | if_needed |
| --- | --- | --- |
| int64/float64/complex128 with `jax_enable_x64` off: JAX silently downcasts (2**40 -> 0) | error | checked cast to 32 bits (error if a value does not fit) |
| step slices / `expand` (non-compact strides): JAX raises UNIMPLEMENTED | error | `.contiguous()` copy |
| views not 64-byte aligned (CPU): JAX silently copies | error | `.clone()` copy |
| `requires_grad=True`: DLPack raises `BufferError` | error (pass `detach=True`: zero-copy) | same |
| conjugate bit: DLPack raises | error | `.resolve_conj()` copy |
| transposed/permuted views: zero-copy, but a non-default layout that a jit compiled for default layouts re-lays out on every call | zero-copy, noted in the report (`relaid`) | same |
| `jax.dlpack.from_dlpack(t, copy=True)` does not copy | `copy="always"` copies in torch, checked by pointer | |
| `t.resize_()` after export: the JAX array reads freed memory | `report.check_alive()` raises | |
| donating a JAX array torch still views is silently skipped | `check_donatable(tree)` raises | |
| sharded JAX arrays cannot be exported whole | partitioned: error (use `to_torch_shards`); fully replicated: shard 0, zero-copy | partitioned: one gathered copy; replicated: as never |
| typed PRNG keys, deleted (donated) arrays, tracers | error | error |
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

if TYPE_CHECKING:
    import torch

CopyMode = Literal["never", "if_needed", "always"]
COPY_MODES = ("never", "if_needed", "always")
CPU_ALIGNMENT = 64  # bytes; JAX's CPU client copies (or, with copy=False, rejects) anything less


class BridgeError(ValueError):
    """A tensor/array cannot cross the bridge as asked; the message says what to do."""


@dataclass(frozen=True)
class Transfer:
    """One leaf that crossed: where, which way, whether it was copied and why."""

    path: str
    direction: Literal["torch->jax", "jax->torch"]
    nbytes: int
    copied: bool
    reason: str = ""  # why it was copied (empty for zero-copy)
    relaid: bool = False  # zero-copy but in a non-default (permuted) layout


@dataclass
class BridgeReport:
    """What `from_torch`/`to_torch` did, leaf by leaf; pass one as `report=` to collect it.

    keep: store every `Transfer` and the exported tensors (for `check_alive`); a long-running
    loop passes keep=False and gets the byte counts only.
    """

    keep: bool = True
    transfers: list[Transfer] = field(default_factory=list)
    copied_bytes: int = 0
    zero_copy_bytes: int = 0
    _exported: list[tuple[str, Any, int, int]] = field(default_factory=list, repr=False)

    def add(self, transfer: Transfer) -> None:
        if transfer.copied:
            self.copied_bytes += transfer.nbytes
        else:
            self.zero_copy_bytes += transfer.nbytes
        if self.keep:
            self.transfers.append(transfer)

    @property
    def copies(self) -> list[Transfer]:
        return [t for t in self.transfers if t.copied]

    def summary(self) -> str:
        lines = [f"{self.zero_copy_bytes} bytes zero-copy, {self.copied_bytes} bytes copied"]
        lines += [f"  copied {t.path} ({t.nbytes} B): {t.reason}" for t in self.copies]
        lines += [
            f"  relaid {t.path}: zero-copy in a permuted layout; a jit re-lays it out per call"
            for t in self.transfers
            if t.relaid
        ]
        return "\n".join(lines)

    def check_alive(self) -> None:
        """Raise if a torch tensor that `from_torch` aliased was resized or reallocated since.

        After `t.resize_()` (or `t.set_()`) torch frees the memory the JAX array still reads.
        """
        for path, tensor, ptr, nbytes in self._exported:
            if tensor.data_ptr() != ptr or tensor.untyped_storage().nbytes() < nbytes:
                raise BridgeError(
                    f"leaf {path}: the torch tensor was resized/reallocated after from_torch "
                    "exported it; the JAX array now points at freed memory. Do not resize "
                    "exported tensors; call from_torch again (or use copy='always')."
                )


# Buffers torch and JAX both see, by address -> weak reference to the torch tensor.
_SHARED: dict[int, weakref.ref] = {}


_PRUNE_AT = [4096]  # prune dead entries when the registry grows past this (then doubles it)


def _remember(t: torch.Tensor) -> None:
    if len(_SHARED) > _PRUNE_AT[0]:
        for ptr in [p for p, ref in _SHARED.items() if ref() is None]:
            del _SHARED[ptr]
        _PRUNE_AT[0] = max(4096, 2 * len(_SHARED))
    _SHARED[t.data_ptr()] = weakref.ref(t)


def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "jaxrl_engine.interop needs torch: pip install 'jaxrl-engine[torch]'"
        ) from e
    return torch


def _path_str(path: tuple[Any, ...]) -> str:
    return jax.tree_util.keystr(path) or "<root>"


def _check_mode(copy: str) -> None:
    if copy not in COPY_MODES:
        raise BridgeError(f"copy={copy!r} is not one of {COPY_MODES}")


def _x64() -> bool:
    return bool(jax.config.read("jax_enable_x64"))


def _compact_strides(t: torch.Tensor) -> tuple[bool, bool]:
    """(compact, permuted): a dense block of memory, and whether its order is not row-major."""
    dims = [(s, st) for s, st in zip(t.shape, t.stride(), strict=True) if s != 1]
    if any(st == 0 for _, st in dims):
        return False, False  # expand(): one element seen many times
    ordered = sorted(dims, key=lambda d: -d[1])
    expected = 1
    for size, stride in reversed(ordered):
        if stride != expected:
            return False, False
        expected *= size
    return True, ordered != dims


def _tensor_span(t: torch.Tensor) -> tuple[int, int]:
    if t.numel() == 0:
        return t.data_ptr(), t.data_ptr()
    extent = sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride(), strict=True)) + 1
    return t.data_ptr(), t.data_ptr() + extent * t.element_size()


def _array_spans(a: Any) -> list[tuple[int, int]]:
    torch = _torch() if type(a).__module__.startswith("torch") else None
    if torch is not None and isinstance(a, torch.Tensor):
        return [_tensor_span(a)]
    if isinstance(a, np.ndarray):
        low, high = np.lib.array_utils.byte_bounds(a)
        return [(low, high)]
    if isinstance(a, jax.Array):
        spans = []
        for shard in a.addressable_shards:
            data = shard.data
            ptr = data.unsafe_buffer_pointer()
            spans.append((ptr, ptr + data.size * data.dtype.itemsize))
        return spans
    raise TypeError(f"shares_memory: expected a torch.Tensor, jax.Array or numpy array, got {a!r}")


def shares_memory(a: Any, b: Any) -> bool:
    """Whether two arrays (torch, JAX or numpy, any mix) overlap in memory.

    Byte ranges are compared, so two disjoint slices of one buffer do not share memory and a
    view and its base do. Empty arrays share nothing.
    """
    return any(
        lo1 < hi2 and lo2 < hi1 and lo1 < hi1 and lo2 < hi2
        for lo1, hi1 in _array_spans(a)
        for lo2, hi2 in _array_spans(b)
    )


def _narrow_int64(t: torch.Tensor, path: str) -> torch.Tensor:
    torch = _torch()
    target = torch.int32 if t.dtype == torch.int64 else torch.uint32
    info = torch.iinfo(target)
    if t.numel() and (int(t.min()) < info.min or int(t.max()) > info.max):
        raise BridgeError(
            f"leaf {path}: {t.dtype} values outside {target}'s range cannot cross with "
            "jax_enable_x64 off (JAX would silently truncate them, 2**40 -> 0); rescale the data, "
            "or enable jax.config.update('jax_enable_x64', True) where no engine trains (its "
            "training refuses jax_enable_x64)"
        )
    return t.to(target)


def _narrow_float64(t: torch.Tensor, path: str) -> torch.Tensor:
    torch = _torch()
    target = torch.float32 if t.dtype == torch.float64 else torch.complex64
    out = t.to(target)
    real = lambda x: torch.view_as_real(x) if x.is_complex() else x  # noqa: E731
    if bool((torch.isfinite(real(t)) & ~torch.isfinite(real(out))).any()):
        raise BridgeError(
            f"leaf {path}: {t.dtype} values overflow {target} (JAX would silently turn 1e300 "
            "into inf with jax_enable_x64 off); rescale the data, or enable jax_enable_x64 where "
            "no engine trains (its training refuses jax_enable_x64)"
        )
    return out


def _tensor_to_jax(
    t: torch.Tensor, path: str, copy: str, detach: bool, report: BridgeReport
) -> jax.Array:
    torch = _torch()
    nbytes = t.numel() * t.element_size()
    if t.requires_grad:
        if not detach:
            raise BridgeError(
                f"leaf {path}: tensor has requires_grad=True and DLPack refuses tensors autograd "
                "tracks; pass detach=True (zero-copy) or use .detach() / module.state_dict()"
            )
        t = t.detach()
    if t.device.type not in ("cpu", "cuda"):
        raise BridgeError(f"leaf {path}: torch device {t.device} has no JAX counterpart")
    reasons: list[str] = []

    def need(reason: str, fix: str) -> None:
        if copy == "never":
            raise BridgeError(
                f"leaf {path}: {reason}; zero-copy is impossible. {fix}, or pass "
                "copy='if_needed' to let the bridge make one reported copy"
            )
        reasons.append(reason)

    if t.is_conj():
        need("the tensor has torch's conjugate bit set", "Call .resolve_conj()")
        t = t.resolve_conj()
    if t.is_neg():
        need("the tensor has torch's negative bit set", "Call .resolve_neg()")
        t = t.resolve_neg()
    if not _x64() and t.dtype in (torch.int64, torch.uint64):
        need(
            f"dtype {t.dtype} with jax_enable_x64 off (JAX would silently downcast: 2**40 -> 0)",
            "Cast to int32 in torch (or enable jax_enable_x64 where no engine trains)",
        )
        t = _narrow_int64(t, path)
    elif not _x64() and t.dtype in (torch.float64, torch.complex128):
        need(
            f"dtype {t.dtype} with jax_enable_x64 off (JAX would silently downcast: 1e300 -> inf)",
            "Cast to float32 in torch (or enable jax_enable_x64 where no engine trains)",
        )
        t = _narrow_float64(t, path)
    compact, permuted = _compact_strides(t)
    if not compact:
        need(
            f"strides {tuple(t.stride())} for shape {tuple(t.shape)} are not compact "
            "(a step slice or expand(); JAX rejects them)",
            "Call .contiguous()",
        )
        t = t.contiguous()
        permuted = False
    if t.device.type == "cpu" and t.numel() and t.data_ptr() % CPU_ALIGNMENT:
        need(
            f"the data starts at an address not aligned to {CPU_ALIGNMENT} bytes (a view at an "
            "odd offset; JAX would silently copy it)",
            "Call .clone()",
        )
        t = t.clone()
    if copy == "always":
        t = t.clone(memory_format=torch.contiguous_format)
        reasons.append("copy='always'")
        permuted = False
    arr = jax.dlpack.from_dlpack(t, copy=False)
    if t.numel() and arr.unsafe_buffer_pointer() != t.data_ptr():
        # Not expected with the checks above; never report zero-copy that is not.
        if copy == "never":
            raise BridgeError(
                f"leaf {path}: JAX copied the tensor on import ({t.dtype}, {t.shape})"
            )
        reasons.append("JAX copied on import")
    copied = bool(reasons)
    report.add(
        Transfer(path, "torch->jax", nbytes, copied, "; ".join(reasons), permuted and not copied)
    )
    if not copied and t.numel():
        _remember(t)
    if not copied and t.numel() and report.keep:
        needed = int(t.storage_offset()) * t.element_size() + nbytes
        report._exported.append((path, t, t.data_ptr(), needed))
    return arr


def from_torch(
    tree: Any,
    *,
    copy: CopyMode = "never",
    detach: bool = False,
    report: BridgeReport | None = None,
) -> Any:
    """torch tensors in `tree` -> JAX arrays (other leaves untouched).

    copy: "never" (zero-copy or `BridgeError`), "if_needed" (one reported copy where DLPack
    cannot alias), "always" (every leaf copied). detach: accept requires_grad tensors
    (detaching is zero-copy). report: a `BridgeReport` that records every leaf.
    """
    _check_mode(copy)
    torch = _torch()
    report = report if report is not None else BridgeReport()

    def convert(path: tuple[Any, ...], leaf: Any) -> Any:
        if isinstance(leaf, torch.Tensor):
            return _tensor_to_jax(leaf, _path_str(path), copy, detach, report)
        return leaf

    return jax.tree_util.tree_map_with_path(
        convert, tree, is_leaf=lambda x: isinstance(x, torch.Tensor)
    )


def _array_to_torch(a: jax.Array, path: str, copy: str, report: BridgeReport) -> torch.Tensor:
    torch = _torch()
    if isinstance(a, jax.core.Tracer):
        raise BridgeError(
            f"leaf {path}: to_torch got a traced value (inside jit/vmap/grad); torch can only "
            "see concrete arrays: call torch through jaxrl_engine.interop.torch_policy's callback "
            "path, or move the conversion outside the jitted function"
        )
    if jnp.issubdtype(a.dtype, jax.dtypes.prng_key):
        raise BridgeError(
            f"leaf {path}: typed PRNG keys have no torch dtype; export jax.random.key_data(key)"
        )
    if a.is_deleted():
        raise BridgeError(
            f"leaf {path}: the array was deleted (donated to a jitted call or .delete()d); "
            "export it before donating it, or export the call's output instead"
        )
    nbytes = a.size * a.dtype.itemsize
    reasons: list[str] = []
    source = a
    if len(a.sharding.device_set) > 1:
        if a.sharding.is_fully_replicated:
            source = a.addressable_shards[0].data  # every shard holds it all: alias shard 0
        elif copy == "never":
            raise BridgeError(
                f"leaf {path}: the array is sharded over {len(a.sharding.device_set)} devices "
                "and DLPack exports one buffer; use to_torch_shards(arr) (zero-copy per "
                "shard) or copy='if_needed' to gather it into one reported copy"
            )
        else:
            source = jax.device_put(a, next(iter(a.sharding.device_set)))
            reasons.append(f"gathered from {len(a.sharding.device_set)} shards")
    t = torch.from_dlpack(source)
    if copy == "always":
        t = t.clone()
        reasons.append("copy='always'")
    if a.size and not reasons and t.data_ptr() != source.unsafe_buffer_pointer():
        if copy == "never":
            raise BridgeError(f"leaf {path}: torch copied the array on import")
        reasons.append("torch copied on import")
    copied = bool(reasons)
    report.add(Transfer(path, "jax->torch", nbytes, copied, "; ".join(reasons)))
    if not copied and a.size:
        _remember(t)
    return t


def to_torch(tree: Any, *, copy: CopyMode = "never", report: BridgeReport | None = None) -> Any:
    """JAX arrays in `tree` -> torch tensors (other leaves untouched); see `from_torch`."""
    _check_mode(copy)
    report = report if report is not None else BridgeReport()

    def convert(path: tuple[Any, ...], leaf: Any) -> Any:
        if isinstance(leaf, jax.Array):
            return _array_to_torch(leaf, _path_str(path), copy, report)
        return leaf

    return jax.tree_util.tree_map_with_path(convert, tree)


def to_torch_shards(a: jax.Array) -> list[torch.Tensor]:
    """One zero-copy torch tensor per addressable shard of a sharded array (in shard order)."""
    return [to_torch(shard.data) for shard in a.addressable_shards]


def torch_views(tree: Any) -> list[str]:
    """Paths of the JAX leaves in `tree` whose buffer a live torch tensor still views."""
    found = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if not isinstance(leaf, jax.Array) or leaf.is_deleted() or not leaf.size:
            continue
        for shard in leaf.addressable_shards:
            ref = _SHARED.get(shard.data.unsafe_buffer_pointer())
            tensor = ref() if ref is not None else None
            if tensor is not None and shares_memory(tensor, shard.data):
                found.append(_path_str(path))
                break
    return found


def check_donatable(tree: Any, what: str = "the donated argument") -> None:
    """Raise if a leaf of `tree` is viewed by torch: XLA would silently skip its donation.

    (On jax 0.10.2 donation of such a buffer allocates a new one with no warning, so memory
    is not reused and torch keeps reading the old values.)
    """
    shared = torch_views(tree)
    if shared:
        raise BridgeError(
            f"{what}: leaves {shared} share memory with live torch tensors; donating them is "
            "silently skipped (a new buffer is allocated and torch keeps the old one). Copy them "
            "first (from_torch(..., copy='always')) or drop the torch views, or do not donate"
        )
