"""Full-state checkpoints: the whole `EngineState`, the resolved config and the metrics so far.

Written with orbax-checkpoint (`CheckpointManager`) under `runs/<name>/checkpoints/epoch_<N>/`,
where N is `counters.epoch` of the saved state (the number of finished epochs). Two items:
- `state`: every leaf of the `EngineState` (params, optimizer state, acting params, env state,
  buffer, batch, counters, stats); typed PRNG keys are stored as `jax.random.key_data` and
  rewrapped on restore. Leaves are stored flat, in `jax.tree` order, so any pytree works.
- `meta` (`meta/metadata`): strict JSON with the format version, the resolved config, the
  `metrics.jsonl` lines written so far, per leaf its path, shape, dtype, key implementation and
  CRC-32 of its bytes, and `sha256`: the SHA-256 of the canonical JSON of all the rest.

Atomic: orbax writes into `epoch_<N>.orbax-checkpoint-tmp` and renames it when complete, and
deletes old checkpoints (keep the newest `keep`) only after the new one is committed; a crash
while writing leaves the previous checkpoints as they were. A failed write (disk full, any OS
error) raises one `CheckpointWriteError` and removes its temporary directory.

Integrity: orbax/tensorstore do not detect flipped bytes, so `info` refuses metadata that does
not match its `sha256`, and restore refuses a leaf whose bytes do not match its CRC-32, or
that has no checksum. A leaf sharded over the processes of a multi-process run, which no
process holds whole, has instead a `sum64`: a checksum of (position, bytes) that every
process computes from its own shards and that does not depend on the sharding, so the
checkpoint restores, checked, on another process count or mesh too. This detects corruption and hand edits, not a deliberate
forger (who can recompute the hashes). Nothing in a checkpoint is ever imported or executed.
Errors name the file and offer the newest earlier checkpoint whose metadata is intact
(`jaxrl-engine train --resume <run dir> --from-checkpoint N`).

Restore places every leaf with the engine's `state_sharding` (mesh layout and memory kind,
e.g. `pinned_host` with offload), so the compiled epoch accepts the restored state as is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import json
import logging
import math
import os
import re
import shlex
import shutil
import sys
import threading
import time
import warnings
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import jax
import numpy as np

from jaxrl_engine.algos.configs import ALGORITHMS
from jaxrl_engine.core.sharding import is_primary, sync_processes, to_host
from jaxrl_engine.io.config import ALGO_NAMES, config_changes
from jaxrl_engine.io.files import META_FILE, STEP_PREFIX

if TYPE_CHECKING:
    from jaxrl_engine.core.state import EngineState

# 2: the state carries `hparams`; 3: the metadata carries its `sha256`; 4: `metrics_log` (the
# records file's length and SHA-256) instead of `metrics_lines` (its records)
FORMAT = 4
READS = (3, 4)
TMP_SUFFIX = ".orbax-checkpoint-tmp"
QUIET_S, DISCARD_S = 1.0, 10.0  # after a failed save: its tmp dir gone for this long, at most
CRC_SKIPPED = "not fully addressable"  # the only reason a leaf may lack a CRC-32 (has a sum64)


class StateLayout(Protocol):
    """What `restore` places a state by: an `Engine`, or a sweep's batched programs."""

    state_shape: Any
    state_sharding: Any


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable, corrupted or written for another config."""


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, another OS error); earlier ones are intact."""


class _Corrupted(Exception):
    """Metadata that cannot be trusted (its message lacks the fallback hint)."""


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """What a checkpoint holds besides the state."""

    epoch: int  # finished epochs (`counters.epoch` of the saved state)
    path: Path
    config: dict[str, Any]  # the resolved config it was written with (`Config.model_dump`)
    num_epochs: int  # the run's total epochs when it was written
    leaves: list[dict[str, Any]]  # path, shape, dtype, key_impl, crc32 or sum64 per leaf
    # `metrics.jsonl` as it was when the checkpoint was written: its length and SHA-256
    # (`{"bytes", "sha256", "records"}`; None: a sweep's, whose members keep their own), so a
    # checkpoint's size does not grow with the run
    metrics_log: dict[str, Any] | None = None
    metrics_lines: list[str] | None = None  # (the records themselves, in older checkpoints)
    algorithm: str | None = None  # the engine's algorithm name (None: written before it was)
    # JAX's `jax_threefry_partitionable` when written (None: written before it was recorded):
    # it changes the random bits a key gives, so a resume under the other setting is not exact
    threefry_partitionable: bool | None = None
    # The phases the user replaced and hooked (`Engine.user_parts`; {} when none)
    user_parts: dict[str, list[str]] = dataclasses.field(default_factory=dict)


def _threefry_partitionable() -> bool:
    """JAX's `jax_threefry_partitionable` in this process (untyped in jax.config's stubs)."""
    return bool(getattr(jax.config, "jax_threefry_partitionable"))  # noqa: B009


def _crc32(array: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(array).reshape(-1).view(np.uint8).data)


_MIX = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))


def _sum64(array: jax.Array) -> int:
    """A checksum of an array's bytes that does not depend on how it is sharded: the sum
    (mod 2**64) over its elements of a mix of (global position, bytes). Each process adds the
    shards it owns (a shard held by several devices counts once, on the lowest device id) and
    the partial sums are added across processes: a collective, every process calls it. Used
    for arrays sharded over several processes, which no process can CRC whole."""
    owner: dict[tuple[tuple[int, int], ...], int] = {}
    for device, index in array.sharding.devices_indices_map(array.shape).items():
        key, device_id = _region(index, array.shape), int(device.id)  # type: ignore[attr-defined]
        owner[key] = min(owner.get(key, device_id), device_id)
    partial = np.uint64(0)
    for shard in array.addressable_shards:
        key = _region(shard.index, array.shape)
        if owner[key] != shard.device.id:
            continue
        data = np.ascontiguousarray(np.asarray(shard.data))
        bits = data.view(f"u{data.dtype.itemsize}").astype(np.uint64)
        position = np.zeros(data.shape, np.uint64)
        for axis, (start, stop) in enumerate(key):  # global flat index of each element
            stride = np.uint64(math.prod(array.shape[axis + 1 :]))
            along = np.arange(start, stop, dtype=np.uint64) * stride
            position += along.reshape((-1,) + (1,) * (data.ndim - axis - 1))
        with np.errstate(over="ignore"):
            h = (position * _MIX[0]) ^ (bits + _MIX[1])
            h = (h ^ (h >> np.uint64(31))) * _MIX[2]
            h ^= h >> np.uint64(29)
            partial += np.sum(h, dtype=np.uint64)
    total = int(partial)
    if jax.process_count() > 1:  # (as two uint32 halves: JAX holds no uint64 without x64)
        from jax.experimental import multihost_utils

        halves = np.array([total & 0xFFFFFFFF, total >> 32], np.uint32)
        gathered = np.asarray(multihost_utils.process_allgather(halves)).reshape(-1, 2)
        total = sum(int(lo) | (int(hi) << 32) for lo, hi in gathered) % 2**64
    return total


def _region(index: tuple[slice, ...], shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """(start, stop) per axis of a shard's index (full axes included)."""
    return tuple(
        s.indices(n)[:2] for s, n in zip((*index, *[slice(None)] * len(shape)), shape, strict=False)
    )


def _canonical(meta: dict[str, Any]) -> str:
    return json.dumps(meta, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _sha256(meta: dict[str, Any]) -> str:
    return hashlib.sha256(_canonical(meta).encode()).hexdigest()


def _is_key(x: Any) -> bool:
    return jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _item_name(i: int) -> str:
    return f"{i:05d}"


def layout(state: Any) -> list[dict[str, Any]]:
    """Per leaf of a state (or of its `jax.eval_shape`): path, stored shape and dtype, key impl."""
    leaves = []
    for path, x in jax.tree_util.tree_flatten_with_path(state)[0]:
        impl = None
        if _is_key(x):
            impl = str(jax.random.key_impl(x)) if isinstance(x, jax.Array) else None
            x = jax.eval_shape(jax.random.key_data, x)
        leaves.append(
            {
                "path": jax.tree_util.keystr(path),
                "shape": list(x.shape),
                "dtype": str(np.dtype(x.dtype)),
                "key_impl": impl,
            }
        )
    return leaves


def _flatten(state: Any) -> tuple[list[jax.Array], list[dict[str, Any]]]:
    arrays = [jax.random.key_data(x) if _is_key(x) else x for x in jax.tree.leaves(state)]
    return arrays, layout(state)


def _describe(leaf: dict[str, Any]) -> str:
    return f"{leaf['dtype']}{leaf['shape']}"


class Checkpointer:
    """The checkpoints of one run directory: `save`, `epochs`, `info`, `restore`.

    directory: `runs/<name>/checkpoints`. keep: how many of the newest to keep (None: all).
    read_only: open existing checkpoints only (a missing directory is a `CheckpointError`).
    """

    def __init__(self, directory: str | Path, keep: int | None = None, read_only: bool = False):
        import orbax.checkpoint as ocp

        self.directory = Path(directory).absolute()
        if read_only and not self.directory.is_dir():
            raise CheckpointError(f"no checkpoints: {str(self.directory)!r} does not exist")
        self._ocp = ocp
        self._keep, self._read_only = keep, read_only
        self._manager = self._open()

    def _open(self) -> Any:
        ocp = self._ocp
        if not self._read_only and is_primary():
            # Left by a writer that died before its commit: never loadable, safe to remove.
            for stale in self.directory.glob(f"*{TMP_SUFFIX}*"):
                shutil.rmtree(stale, ignore_errors=True)
            self._remove_pruned_leftovers()
        with _quiet_listing():
            return self._manager_of(ocp)

    def _manager_of(self, ocp: Any) -> Any:
        return ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=self._keep,
                step_prefix=STEP_PREFIX,
                # Synchronous: `save` returns with the checkpoint committed. (Orbax's async mode
                # left a save uncommitted for as long as the next compiled epoch ran on CPU.)
                enable_async_checkpointing=False,
                # Not orbax's read_only (it logs warnings); a read-only Checkpointer never saves.
                create=not self._read_only,
            ),
        )

    def _remove_pruned_leftovers(self) -> None:
        """Remove what is left of old checkpoints that were being deleted (`keep`) when their
        writer died: part of their files, no orbax commit metadata (orbax then warns about each
        on every listing, and counts them against `keep`). Only those older than the `keep`
        newest complete checkpoints, which orbax would have deleted anyway; with `keep` None
        nothing is ever deleted, so nothing is removed."""
        if self._keep is None or not self.directory.is_dir():
            return
        found = {}
        for path in self.directory.glob(f"{STEP_PREFIX}_*"):
            number = path.name[len(STEP_PREFIX) + 1 :]
            if number.isdigit() and path.is_dir() and not path.is_symlink():
                found[int(number)] = path
        complete = sorted(e for e, path in found.items() if _complete(path))
        if len(complete) < self._keep:
            return
        for epoch, path in found.items():
            if epoch < complete[-self._keep] and not _complete(path):
                shutil.rmtree(path, ignore_errors=True)

    def path_of(self, epoch: int) -> Path:
        """The directory of the checkpoint of `epoch` (`<directory>/epoch_<epoch>`), whether it
        exists or not."""
        return self.directory / f"{STEP_PREFIX}_{epoch}"

    def epochs(self) -> list[int]:
        """Epochs of the committed checkpoints, oldest first (after this Checkpointer's own save
        in flight commits; unfinished writes of dead processes are not listed)."""
        self._manager.wait_until_finished()  # this writer's own save in flight counts
        with _quiet_listing():
            self._manager.reload()
            return sorted(self._manager.all_steps())

    def latest(self) -> int | None:
        """The epoch of the newest committed checkpoint (`epochs()`'s last: waits for this
        Checkpointer's own save in flight), or None when there is none."""
        epochs = self.epochs()
        return epochs[-1] if epochs else None

    def save(
        self,
        state: EngineState,
        *,
        config: dict[str, Any],
        metrics_log: dict[str, Any] | None = None,
        num_epochs: int,
        epoch: int | None = None,
        algorithm: str | None = None,
        user_parts: dict[str, list[str]] | None = None,
    ) -> Path:
        """Write `state` as the checkpoint of its `counters.epoch` (or of `epoch`: a sweep's
        batched state holds one counter per member); returns its directory.

        Returns with the checkpoint committed (written to a temporary directory, renamed).
        Raises `CheckpointWriteError` when a write fails (disk full, another OS error), after
        removing the temporary directory; the earlier checkpoints stay as they were.
        """
        ocp = self._ocp
        if self._read_only:
            raise CheckpointError(f"{str(self.directory)!r} was opened read-only")
        if epoch is None:
            epoch = int(to_host(state.counters.epoch))
        path = self.path_of(epoch)
        arrays, leaves = _flatten(state)
        for leaf, array in zip(leaves, arrays, strict=True):
            if _held_whole(array):
                leaf["crc32"] = _crc32(to_host(array))
            else:
                leaf.update(crc32=None, crc32_skipped=CRC_SKIPPED, sum64=_sum64(array))
        meta: dict[str, Any] = {
            "format": FORMAT,
            "epoch": epoch,
            "num_epochs": num_epochs,
            "config": config,
            "metrics_log": metrics_log,
            "leaves": leaves,
            "versions": {"jax": jax.__version__},
            "threefry_partitionable": _threefry_partitionable(),
        }
        if user_parts and any(user_parts.values()):  # the user's phases and hooked phases
            meta["user_parts"] = user_parts
        if algorithm is not None:  # the engine's, which a user's algorithm may not share
            meta["algorithm"] = algorithm  # with the config's algo.name
        try:
            meta = json.loads(_canonical(meta))  # what restore reads back: lists, str keys
        except ValueError as e:
            raise CheckpointError(
                f"cannot write checkpoint {str(path)!r}: its metadata is not strict JSON ({e})"
            ) from None
        meta["sha256"] = _sha256(meta)
        items = {_item_name(i): a for i, a in enumerate(arrays)}
        failure = None
        with _quiet_failures():
            try:
                self._manager.save(
                    epoch,
                    args=ocp.args.Composite(
                        state=ocp.args.StandardSave(items), meta=ocp.args.JsonSave(meta)
                    ),
                    force=True,
                )
                self.wait()
            except BaseException as e:
                self._discard_failed_save()
                code = _os_errno(e)
                if code is None:
                    raise
                failure = self._write_error(path, epoch, e, code)
            if failure is not None:
                # Raised once the original exception (whose frames hold orbax's failed tasks)
                # is gone, so that those tasks are collected while silenced.
                raise failure
        return path

    def _write_error(
        self, path: Path, epoch: int, error: BaseException, code: int
    ) -> CheckpointWriteError:
        older = [e for e in self.epochs() if e < epoch]
        kept = (
            f"the previous checkpoint, epoch {older[-1]}, is intact"
            if older
            else "no earlier checkpoint of this run"
        )
        failure = CheckpointWriteError(
            f"cannot write checkpoint {str(path)!r}: {_cause(error, code)} ({kept})"
        )
        failure.errno = code or None
        return failure

    def _discard_failed_save(self) -> None:
        """Let the failed save's threads finish, then reopen orbax (removing its tmp dir).

        The other items of the failed save may still be written (tensorstore's threads) after
        orbax raised: the tmp dir is removed until it stays gone for QUIET_S (at most
        DISCARD_S), so that no partial write is left behind, however slow the machine."""
        gc.collect()
        with contextlib.suppress(Exception):
            self._manager.close()
        if not self._read_only and is_primary():
            deadline, quiet_since = time.monotonic() + DISCARD_S, time.monotonic()
            while time.monotonic() < deadline and time.monotonic() - quiet_since < QUIET_S:
                stale = list(self.directory.glob(f"*{TMP_SUFFIX}*"))
                for path in stale:
                    shutil.rmtree(path, ignore_errors=True)
                if stale:
                    quiet_since = time.monotonic()
                time.sleep(0.05)
        self._manager = self._open()

    def wait(self) -> None:
        """Block until the last `save` is committed (its files written and renamed)."""
        self._manager.wait_until_finished()

    def meta_file(self, epoch: int) -> Path:
        """The metadata file (`meta/metadata`: strict JSON) of the checkpoint of `epoch`,
        whether it exists or not."""
        return self.path_of(epoch) / META_FILE

    def intact_before(self, epoch: int) -> int | None:
        """The newest committed checkpoint before `epoch` whose metadata is intact, if any."""
        for older in reversed([e for e in self.epochs() if e < epoch]):
            with contextlib.suppress(CheckpointError, _Corrupted):
                self._info(older)
                return older
        return None

    def _fallback_hint(self, epoch: int) -> str:
        older = self.intact_before(epoch)
        if older is not None:
            run_dir = shlex.quote(str(self.directory.parent))
            return (
                f"resume from the previous checkpoint (epoch {older}): "
                f"jaxrl-engine train --resume {run_dir} --from-checkpoint {older}"
            )
        if any(e < epoch for e in self.epochs()):
            return "no earlier checkpoint of this run is intact; start the run again"
        return "it is the only checkpoint of this run; start the run again"

    def info(self, epoch: int | None = None) -> CheckpointInfo:
        """The config, metrics and leaf layout of a checkpoint (default: the latest).

        Raises `CheckpointError` when its metadata is unreadable, of another format, or does
        not match its `sha256`."""
        epoch = self._resolve(epoch)
        try:
            return self._info(epoch)
        except _Corrupted as e:
            raise CheckpointError(f"{e}; {self._fallback_hint(epoch)}") from None

    def _info(self, epoch: int) -> CheckpointInfo:
        ocp = self._ocp
        path, meta_file = self.path_of(epoch), self.meta_file(epoch)
        try:
            with _quiet_failures():
                meta = self._manager.restore(
                    epoch, args=ocp.args.Composite(meta=ocp.args.JsonRestore())
                )["meta"]
        except Exception as e:
            raise _Corrupted(
                f"checkpoint {str(path)!r} is corrupted or incomplete: its metadata cannot be "
                f"read ({_first_line(e)}; {str(meta_file)!r})"
            ) from None
        required = {"format", "epoch", "num_epochs", "config", "leaves"}
        if isinstance(meta, dict) and not {"metrics_log", "metrics_lines"} & set(meta):
            required.add("metrics_log")
        if not isinstance(meta, dict) or not required <= set(meta):
            raise _Corrupted(
                f"checkpoint {str(path)!r} is corrupted or not a jaxrl_engine checkpoint: its "
                f"metadata lacks {sorted(required - set(meta or {}))} ({str(meta_file)!r})"
            )
        if meta["format"] not in READS:
            raise CheckpointError(
                f"checkpoint {str(path)!r} has format {meta['format']!r}; this version reads "
                f"formats {', '.join(map(str, READS))}"
                + (
                    " (it was written by a newer jaxrl_engine: upgrade to read it)"
                    if isinstance(meta["format"], int) and meta["format"] > FORMAT
                    else ""
                )
            )
        stored = meta.pop("sha256", None)
        try:
            intact = isinstance(stored, str) and stored == _sha256(meta)
        except ValueError:  # NaN or infinity tokens: not written by `save`
            intact = False
        if not intact:
            raise _Corrupted(
                f"checkpoint {str(path)!r} is corrupted or was edited: its metadata does not "
                f"match its checksum ({str(meta_file)!r})"
            )
        # Types too (a forged checksum is not ruled out: a run directory is data): a metadata
        # field of the wrong type is a refusal, not a TypeError later
        kinds = {
            "epoch": int,
            "num_epochs": int,
            "config": dict,
            "metrics_lines": list,
            "leaves": list,
        }
        wrong = {k for k, kind in kinds.items() if k in meta and type(meta[k]) is not kind}
        log = meta.get("metrics_log")
        log_kinds = {"bytes": int, "sha256": str, "records": int}
        if log is not None and not (
            isinstance(log, dict)
            and set(log) == set(log_kinds)
            and all(type(log[k]) is kind for k, kind in log_kinds.items())
            and log["bytes"] >= 0
            and log["records"] >= 0
        ):
            wrong.add("metrics_log")
        if not isinstance(meta.get("algorithm", ""), str):
            wrong.add("algorithm")
        if not isinstance(meta.get("threefry_partitionable", False), bool):
            wrong.add("threefry_partitionable")
        parts = meta.get("user_parts", {})
        if not (
            isinstance(parts, dict)
            and all(
                isinstance(v, list) and all(isinstance(x, str) for x in v) for v in parts.values()
            )
        ):
            wrong.add("user_parts")
        for key, kind in (("metrics_lines", str), ("leaves", dict)):
            if key in meta and key not in wrong and any(not isinstance(x, kind) for x in meta[key]):
                wrong.add(key)
        if wrong:
            raise _Corrupted(
                f"checkpoint {str(path)!r} is corrupted or was edited: its metadata field(s) "
                f"{sorted(wrong)} are not of the types `save` writes ({str(meta_file)!r})"
            )
        return CheckpointInfo(
            epoch=meta["epoch"],
            path=path,
            config=meta["config"],
            metrics_log=log,
            metrics_lines=list(meta["metrics_lines"]) if "metrics_lines" in meta else None,
            num_epochs=meta["num_epochs"],
            leaves=meta["leaves"],
            algorithm=meta.get("algorithm"),
            threefry_partitionable=meta.get("threefry_partitionable"),
            user_parts=dict(meta.get("user_parts", {})),
        )

    def _resolve(self, epoch: int | None) -> int:
        epochs = self.epochs()
        if not epochs:
            raise CheckpointError(f"no checkpoints in {str(self.directory)!r}")
        if epoch is None:
            return epochs[-1]
        if epoch not in epochs:
            raise CheckpointError(
                f"no checkpoint of epoch {epoch} in {str(self.directory)!r}; there are: {epochs}"
            )
        return epoch

    def check_compatible(
        self,
        info: CheckpointInfo,
        engine: StateLayout,
        config: dict[str, Any] | None = None,
        fillable: Iterable[str] = (),
    ) -> None:
        """Refuse a checkpoint whose leaves differ (path, shape, dtype) from the engine's state.

        config: the resolved config the engine was built from (default: its driver's); its
        differences from the checkpoint's are named in the message. fillable: paths of leaves
        the checkpoint may lack (hyperparameters added since it was written)."""
        fillable = set(fillable)
        if config is None and hasattr(getattr(engine, "driver", None), "cfg"):
            config = engine.driver.cfg.model_dump(mode="json")  # type: ignore[attr-defined]
        problem = other_algorithm(
            info.algorithm, getattr(getattr(engine, "algo", None), "name", None)
        )
        if problem:
            raise CheckpointError(f"checkpoint {str(info.path)!r} {problem}")
        expected = layout(engine.state_shape)
        stored = info.leaves
        problems = []
        stored_by_path = {leaf["path"]: leaf for leaf in stored}
        expected_by_path = {leaf["path"]: leaf for leaf in expected}
        for leaf in expected:
            old = stored_by_path.get(leaf["path"])
            if old is None and leaf["path"] in fillable:
                continue
            if old is None:
                problems.append(f"{leaf['path']} is not in the checkpoint")
            elif (old["shape"], old["dtype"]) != (leaf["shape"], leaf["dtype"]):
                problems.append(
                    f"{leaf['path']} is {_describe(old)} in the checkpoint and "
                    f"{_describe(leaf)} for this config"
                )
        problems += [
            f"{leaf['path']} is in the checkpoint but not in this config's state"
            for leaf in stored
            if leaf["path"] not in expected_by_path
        ]
        # Observations and actions first: they say which env/network shapes disagree.
        problems.sort(key=lambda text: not text.startswith((".env.obs", ".buffer.action")))
        if problems:
            changes = config_changes(info.config, config) if config is not None else []
            shown = "; ".join(problems[:3]) + (
                f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
            )
            raise CheckpointError(
                f"checkpoint {str(info.path)!r} was written for another state layout: {shown}. "
                + (
                    "The config is the checkpoint's: the state differs by what config.yaml "
                    "cannot name, a network, algorithm or env given to jre.build; pass the "
                    "same to jre.resume(run, algorithm=..., env=...)"
                    if config is not None and not changes
                    else (
                        f"Config keys that differ from the checkpoint's: {'; '.join(changes)}. "
                        if changes
                        else ""
                    )
                    + "Resume with the checkpoint's own config (drop the overrides that change "
                    "shapes), or start a new run with another name="
                )
            )
        changed = trained_with_changes(info.config, config) if config is not None else []
        if changed:
            raise CheckpointError(
                f"checkpoint {str(info.path)!r} holds params trained with other settings than "
                f"this engine's config ({'; '.join(changed)}): they would compute something "
                "else with these (the shapes agree, so nothing else would say so); build the "
                "engine with the checkpoint's values, or train a new run"
            )

    def restore(
        self,
        engine: StateLayout,
        epoch: int | None = None,
        config: dict[str, Any] | None = None,
        hparams: Any = None,
    ) -> tuple[EngineState, CheckpointInfo]:
        """The saved state (default: latest) placed with `engine.state_sharding`, and its info.

        hparams: values of the state's `hparams` (its shapes) for the hyperparameters a
        checkpoint written before they existed lacks (e.g. `priority_beta_end`): those are
        taken from here, with a warning; the others are the checkpoint's.

        Raises `CheckpointError` when there is none, when it was written for another state
        layout (a config that changes shapes), or when it is corrupted or edited (unreadable
        files, metadata that does not match its `sha256`, a missing or mismatched CRC-32).
        """
        ocp = self._ocp
        info = self.info(epoch)
        have = {leaf["path"] for leaf in info.leaves}
        fill = {
            name: value
            for path, value in jax.tree_util.tree_flatten_with_path(hparams)[0]
            if (name := ".hparams" + jax.tree_util.keystr(path)) not in have
        }
        self.check_compatible(info, engine, config, fillable=fill)
        if fill:
            names = ", ".join(k.removeprefix(".hparams.") for k in sorted(fill))
            warnings.warn(
                f"checkpoint {str(info.path)!r} predates the hyperparameters {names}: they take "
                "this config's values",
                stacklevel=2,
            )
        now = _threefry_partitionable()
        if info.threefry_partitionable not in (None, now):
            warnings.warn(
                f"checkpoint {str(info.path)!r} was written with jax_threefry_partitionable="
                f"{info.threefry_partitionable} and this process has {now}: the same keys give "
                "other random bits, so the resumed run will not equal an uninterrupted one; "
                f"set jax.config.update('jax_threefry_partitionable', "
                f"{info.threefry_partitionable}) before resuming for that",
                stacklevel=2,
            )
        shapes, treedef = jax.tree.flatten(engine.state_shape)
        shardings = jax.tree.leaves(engine.state_sharding)
        paths = [leaf["path"] for leaf in layout(engine.state_shape)]
        # Stored leaves are matched to the engine's by path (check_compatible made them agree).
        index = {leaf["path"]: i for i, leaf in enumerate(info.leaves)}
        wanted = [index[p] for p in paths if p not in fill]
        stored = [info.leaves[i] for i in wanted]
        target = {
            _item_name(i): jax.ShapeDtypeStruct(
                tuple(info.leaves[i]["shape"]), np.dtype(info.leaves[i]["dtype"]), sharding=s
            )
            for i, s in zip(
                wanted,
                [s for p, s in zip(paths, shardings, strict=True) if p not in fill],
                strict=True,
            )
        }
        try:
            with _quiet_failures():
                restored = self._manager.restore(
                    info.epoch, args=ocp.args.Composite(state=ocp.args.StandardRestore(target))
                )["state"]
            arrays = [restored[_item_name(i)] for i in wanted]
        except Exception as e:
            raise CheckpointError(
                f"checkpoint {str(info.path)!r} is corrupted or incomplete: its arrays cannot be "
                f"read ({_first_line(e)}); {self._fallback_hint(info.epoch)}"
            ) from None
        found = iter(zip(stored, arrays, strict=True))
        leaves = []
        for path, shape, sharding in zip(paths, shapes, shardings, strict=True):
            if path in fill:
                value = np.asarray(fill[path], np.dtype(shape.dtype)).reshape(shape.shape)
                leaves.append(jax.device_put(value, sharding))
                continue
            leaf, array = next(found)
            problem = _crc_problem(leaf, array)
            if problem:
                raise CheckpointError(
                    f"checkpoint {str(info.path)!r} is corrupted{problem}; "
                    f"{self._fallback_hint(info.epoch)}"
                )
            if leaf["key_impl"] is not None:
                try:
                    array = jax.random.wrap_key_data(array, impl=leaf["key_impl"])
                except (TypeError, ValueError) as e:  # an impl name jax does not know
                    raise CheckpointError(
                        f"checkpoint {str(info.path)!r}: {leaf['path']} names the PRNG "
                        f"implementation {leaf['key_impl']!r}, which cannot hold its key data "
                        f"({_first_line(e)}); {self._fallback_hint(info.epoch)}"
                    ) from None
                if array.dtype != shape.dtype:
                    raise CheckpointError(
                        f"checkpoint {str(info.path)!r}: {leaf['path']} holds {leaf['key_impl']} "
                        f"keys, this config uses {shape.dtype}"
                    )
            leaves.append(array)
        return jax.tree.unflatten(treedef, leaves), info

    def delete_all(self) -> None:
        """Remove every checkpoint (and unfinished writes) of this run (in a multi-process run
        every process calls it, once all have read the directory; process 0 removes)."""
        self._manager.close()
        sync_processes("delete_checkpoints")
        if is_primary():
            shutil.rmtree(self.directory, ignore_errors=True)
        sync_processes("deleted_checkpoints")
        self._manager = self._open()

    def close(self) -> None:
        """Wait for a save in flight to commit, then release orbax's resources."""
        self._manager.close()


def trained_with_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """`algo.<key>: old -> new` for each of the algorithm's `trained_with_keys` (settings that
    change what the params compute, not their shapes) that differ between two configs; keys
    either config lacks (an older checkpoint's) are not compared."""
    was, now = old.get("algo") or {}, new.get("algo") or {}
    model = ALGORITHMS.get(str(now.get("name")))
    if model is None or was.get("name") != now.get("name"):
        return []
    return [
        f"algo.{key}: {was[key]!r} -> {now[key]!r}"
        for key in sorted(getattr(model, "trained_with_keys", ()))
        if key in was and key in now and was[key] != now[key]
    ]


def other_algorithm(trained: str | None, this: str | None) -> str | None:
    """Why an engine whose algorithm is named `this` cannot take what an algorithm named
    `trained` wrote (None: it can, or a name is not known)."""
    if trained is None or this is None or trained == this:
        return None
    yours = trained not in ALGO_NAMES
    return (
        f"was written by the algorithm {trained!r}"
        + (" (one given to jre.build(algorithm=...), not a config's)" if yours else "")
        + f", and this engine's is {this!r}"
        + (
            ": build it with the same algorithm, e.g. jre.resume(run, algorithm=...) (then "
            "jre.make_policy((engine, state)))"
            if yours
            else ""
        )
    )


def _complete(path: Path) -> bool:
    """A checkpoint directory holds its two items and orbax's commit metadata."""
    return all((path / name).exists() for name in ("_CHECKPOINT_METADATA", "meta", "state"))


def _held_whole(array: jax.Array) -> bool:
    """Whether this process holds all of `array` (one process, or a replicated array)."""
    return array.is_fully_addressable or array.is_fully_replicated


def _crc_problem(leaf: dict[str, Any], array: jax.Array) -> str:
    """Why `array` does not pass its leaf's checksum ("" when it does): its CRC-32, or for a
    leaf that was sharded over processes when saved, its sharding-independent `sum64`."""
    crc, sum64 = leaf.get("crc32"), leaf.get("sum64")
    if crc is None and leaf.get("crc32_skipped") == CRC_SKIPPED and type(sum64) is int:
        if _sum64(array) != sum64:
            return f": the bytes of {leaf['path']} do not match their checksum (sum64)"
        return ""
    if type(crc) is not int:
        return f" or was edited: {leaf['path']} has no valid CRC-32 or sum64 checksum"
    if not _held_whole(array):  # saved whole, restored sharded over processes: not here
        return ""
    if _crc32(to_host(array)) != crc:
        return f": the bytes of {leaf['path']} do not match their CRC-32"
    return ""


@contextlib.contextmanager
def _quiet_failures() -> Iterator[None]:
    """Silence what a failed orbax/tensorstore read or write prints besides its exception.

    When one fails, tensorstore callbacks still scheduled on orbax's closed event loop raise
    "Event loop is closed" (printed through `sys.excepthook`), unawaited coroutines are
    reported as unraisable, orbax's threads log their errors with tracebacks and asyncio logs
    failed tasks nobody awaited: dozens of tracebacks for one corrupted file or full disk. The exception itself still propagates and becomes one
    message.
    """
    hooks = sys.excepthook, sys.unraisablehook, threading.excepthook
    loggers = logging.getLogger("absl"), logging.getLogger("asyncio")  # orbax's, its tasks'
    sys.excepthook = lambda *args: None
    sys.unraisablehook = lambda *args: None
    threading.excepthook = lambda *args: None
    for logger in loggers:
        logger.addFilter(_below_error)
    failed = False
    try:
        yield
    except BaseException:
        gc.collect()  # report the abandoned coroutines now, while silenced
        time.sleep(0.2)  # let in-flight callbacks fail while silenced
        failed = True
        raise
    finally:
        sys.excepthook, sys.unraisablehook, threading.excepthook = hooks
        for logger in loggers:
            logger.removeFilter(_below_error)
        if failed:
            _silence_leftovers()


def _silence_leftovers() -> None:
    """After a failed read or write, reads still in flight (more on a loaded machine) can
    outlive the 0.2 s above: their coroutines are collected later, at the latest when the
    process exits, and each would print "Exception ignored in: <coroutine ...>" with a
    tensorstore spec (thousands of lines after one corrupted checkpoint). From then on this
    process drops the unraisable reports of orbax's coroutines; others still print."""
    previous = sys.unraisablehook
    if getattr(previous, "_drops_orbax_leftovers", False):
        return

    def hook(unraisable: Any) -> None:
        if not _is_orbax_leftover(unraisable.object):
            previous(unraisable)

    hook._drops_orbax_leftovers = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


def _is_orbax_leftover(obj: Any) -> bool:
    """Whether `obj` (what an unraisable report is about) is a coroutine of orbax's code."""
    code = getattr(obj, "cr_code", None)
    filename = str(getattr(code, "co_filename", ""))
    return f"{os.sep}orbax{os.sep}" in filename


@contextlib.contextmanager
def _quiet_listing() -> Iterator[None]:
    """Orbax warns once per listing about each folder without its metadata (e.g. an empty
    `epoch_N` a user made): the engine's own checks name such a checkpoint when it is read."""
    absl = logging.getLogger("absl")
    absl.addFilter(_errors_only)
    try:
        yield
    finally:
        absl.removeFilter(_errors_only)


def _errors_only(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.ERROR


def _below_error(record: logging.LogRecord) -> bool:
    return record.levelno < logging.ERROR


def _os_errno(error: BaseException) -> int | None:
    """The OS error code of a failed write: an `OSError`'s, or tensorstore's `os_error_code`."""
    if not isinstance(error, Exception):
        return None
    if isinstance(error, OSError):
        return error.errno or 0
    found = re.search(r"os_error_code='?(\d+)", str(error))
    return int(found.group(1)) if found else None


def _cause(error: BaseException, code: int) -> str:
    if isinstance(error, OSError) or not code:
        return _first_line(error)
    return f"OSError: [Errno {code}] {os.strerror(code)}"


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    head = text[0] if text else type(error).__name__
    # TensorStore's read errors end with "See full TensorStore details: <bound method ...>"
    # (a repr, not the details): what comes before says what failed.
    head = head.split(" See full TensorStore details")[0]
    return f"{type(error).__name__}: {head[:200]}"
