"""Full-state checkpoints: the whole `EngineState`, the resolved config and the metrics so far.

Written with orbax-checkpoint (`CheckpointManager`) under `runs/<name>/checkpoints/epoch_<N>/`,
where N is `counters.epoch` of the saved state (the number of finished epochs). Two items:
- `state`: every leaf of the `EngineState` (params, optimizer state, acting params, env state,
  buffer, batch, counters, stats); typed PRNG keys are stored as `jax.random.key_data` and
  rewrapped on restore. Leaves are stored flat, in `jax.tree` order, so any pytree works.
- `meta`: JSON with the format version, the resolved config, the `metrics.jsonl` lines written
  so far, and per leaf its path, shape, dtype, key implementation and CRC-32 of its bytes.

Atomic: orbax writes into `epoch_<N>.orbax-checkpoint-tmp` and renames it when complete, and
deletes old checkpoints (keep the newest `keep`) only after the new one is committed; a crash
while writing leaves the previous checkpoints as they were. Orbax/tensorstore do not detect
flipped bytes in array data, so restore checks every leaf's CRC-32 and refuses a mismatch.

Restore places every leaf with the engine's `state_sharding` (mesh layout and memory kind,
e.g. `pinned_host` with offload), so the compiled epoch accepts the restored state as is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import shutil
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from jaxrl_engine.io.config import config_changes

if TYPE_CHECKING:
    from jaxrl_engine.core.engine import Engine
    from jaxrl_engine.core.state import EngineState

FORMAT = 2  # 2: the state carries `hparams`
STEP_PREFIX = "epoch"
TMP_SUFFIX = ".orbax-checkpoint-tmp"


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable, corrupted or written for another config."""


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """What a checkpoint holds besides the state."""

    epoch: int  # finished epochs (`counters.epoch` of the saved state)
    path: Path
    config: dict[str, Any]  # the resolved config it was written with (`Config.model_dump`)
    metrics_lines: list[str]  # `metrics.jsonl` as it was when the checkpoint was written
    num_epochs: int  # the run's total epochs when it was written
    leaves: list[dict[str, Any]]  # path, shape, dtype, key_impl, crc32 per state leaf


def _crc32(array: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(array).reshape(-1).view(np.uint8).data)


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
        if not self._read_only:
            # Left by a writer that died before its commit: never loadable, safe to remove.
            for stale in self.directory.glob(f"*{TMP_SUFFIX}*"):
                shutil.rmtree(stale, ignore_errors=True)
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

    def path_of(self, epoch: int) -> Path:
        return self.directory / f"{STEP_PREFIX}_{epoch}"

    def epochs(self) -> list[int]:
        """Epochs of the committed checkpoints, oldest first (after this Checkpointer's own save
        in flight commits; unfinished writes of dead processes are not listed)."""
        self._manager.wait_until_finished()  # this writer's own save in flight counts
        self._manager.reload()
        return sorted(self._manager.all_steps())

    def latest(self) -> int | None:
        epochs = self.epochs()
        return epochs[-1] if epochs else None

    def save(
        self,
        state: EngineState,
        *,
        config: dict[str, Any],
        metrics_lines: list[str],
        num_epochs: int,
    ) -> Path:
        """Write `state` as the checkpoint of its `counters.epoch`; returns its directory.

        Returns with the checkpoint committed (written to a temporary directory, renamed).
        """
        ocp = self._ocp
        if self._read_only:
            raise CheckpointError(f"{str(self.directory)!r} was opened read-only")
        epoch = int(jax.device_get(state.counters.epoch))
        arrays, leaves = _flatten(state)
        for leaf, array in zip(leaves, arrays, strict=True):
            leaf["crc32"] = (
                _crc32(np.asarray(jax.device_get(array))) if array.is_fully_addressable else None
            )
        meta = {
            "format": FORMAT,
            "epoch": epoch,
            "num_epochs": num_epochs,
            "config": config,
            "metrics_lines": metrics_lines,
            "leaves": leaves,
            "versions": {"jax": jax.__version__},
        }
        items = {_item_name(i): a for i, a in enumerate(arrays)}
        self._manager.save(
            epoch,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(items), meta=ocp.args.JsonSave(meta)
            ),
            force=True,
        )
        self.wait()
        return self.path_of(epoch)

    def wait(self) -> None:
        """Block until the last `save` is committed (its files written and renamed)."""
        self._manager.wait_until_finished()

    def _fallback_hint(self, epoch: int) -> str:
        older = [e for e in self.epochs() if e < epoch]
        if older:
            return (
                f"delete {str(self.path_of(epoch))!r} to resume from the previous checkpoint "
                f"(epoch {older[-1]})"
            )
        return "it is the only checkpoint of this run; start the run again"

    def info(self, epoch: int | None = None) -> CheckpointInfo:
        """The config, metrics and leaf layout of a checkpoint (default: the latest)."""
        ocp = self._ocp
        epoch = self._resolve(epoch)
        path = self.path_of(epoch)
        try:
            with _quiet_failures():
                meta = self._manager.restore(
                    epoch, args=ocp.args.Composite(meta=ocp.args.JsonRestore())
                )["meta"]
        except Exception as e:
            raise CheckpointError(
                f"checkpoint {str(path)!r} is corrupted or incomplete: its metadata cannot be "
                f"read ({_first_line(e)}); {self._fallback_hint(epoch)}"
            ) from None
        required = {"format", "epoch", "num_epochs", "config", "metrics_lines", "leaves"}
        if not isinstance(meta, dict) or not required <= set(meta):
            raise CheckpointError(
                f"checkpoint {str(path)!r} is corrupted or not a jaxrl_engine checkpoint: its "
                f"metadata lacks {sorted(required - set(meta or {}))}; "
                f"{self._fallback_hint(epoch)}"
            )
        if meta["format"] != FORMAT:
            raise CheckpointError(
                f"checkpoint {str(path)!r} has format {meta['format']!r}; this version reads "
                f"format {FORMAT}"
            )
        return CheckpointInfo(
            epoch=int(meta["epoch"]),
            path=path,
            config=meta["config"],
            metrics_lines=list(meta["metrics_lines"]),
            num_epochs=int(meta["num_epochs"]),
            leaves=meta["leaves"],
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
        self, info: CheckpointInfo, engine: Engine, config: dict[str, Any] | None = None
    ) -> None:
        """Refuse a checkpoint whose leaves differ (path, shape, dtype) from the engine's state.

        config: the resolved config the engine was built from (default: its driver's); its
        differences from the checkpoint's are named in the message."""
        if config is None and hasattr(getattr(engine, "driver", None), "cfg"):
            config = engine.driver.cfg.model_dump(mode="json")  # type: ignore[union-attr]
        expected = layout(engine.state_shape)
        stored = info.leaves
        problems = []
        stored_by_path = {leaf["path"]: leaf for leaf in stored}
        expected_by_path = {leaf["path"]: leaf for leaf in expected}
        for leaf in expected:
            old = stored_by_path.get(leaf["path"])
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
                    f"Config keys that differ from the checkpoint's: {'; '.join(changes)}. "
                    if changes
                    else ""
                )
                + "Resume with the checkpoint's own config (drop the overrides that change "
                "shapes), or start a new run with another name="
            )

    def restore(
        self, engine: Engine, epoch: int | None = None, config: dict[str, Any] | None = None
    ) -> tuple[EngineState, CheckpointInfo]:
        """The saved state (default: latest) placed with `engine.state_sharding`, and its info.

        Raises `CheckpointError` when there is none, when it was written for another state
        layout (a config that changes shapes), or when it is corrupted (unreadable files or a
        CRC-32 mismatch).
        """
        ocp = self._ocp
        info = self.info(epoch)
        self.check_compatible(info, engine, config)
        shapes, treedef = jax.tree.flatten(engine.state_shape)
        shardings = jax.tree.leaves(engine.state_sharding)
        # Stored leaves are matched to the engine's by path (check_compatible made them agree).
        index = {leaf["path"]: i for i, leaf in enumerate(info.leaves)}
        wanted = [index[leaf["path"]] for leaf in layout(engine.state_shape)]
        stored = [info.leaves[i] for i in wanted]
        target = {
            _item_name(i): jax.ShapeDtypeStruct(
                tuple(info.leaves[i]["shape"]), np.dtype(info.leaves[i]["dtype"]), sharding=s
            )
            for i, s in zip(wanted, shardings, strict=True)
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
        leaves = []
        for leaf, array, shape in zip(stored, arrays, shapes, strict=True):
            if (
                leaf.get("crc32") is not None
                and array.is_fully_addressable
                and _crc32(np.asarray(jax.device_get(array))) != leaf["crc32"]
            ):
                raise CheckpointError(
                    f"checkpoint {str(info.path)!r} is corrupted: the bytes of "
                    f"{leaf['path']} do not match their CRC-32; "
                    f"{self._fallback_hint(info.epoch)}"
                )
            if leaf["key_impl"] is not None:
                array = jax.random.wrap_key_data(array, impl=leaf["key_impl"])
                if array.dtype != shape.dtype:
                    raise CheckpointError(
                        f"checkpoint {str(info.path)!r}: {leaf['path']} holds {leaf['key_impl']} "
                        f"keys, this config uses {shape.dtype}"
                    )
            leaves.append(array)
        return jax.tree.unflatten(treedef, leaves), info

    def delete_all(self) -> None:
        """Remove every checkpoint (and unfinished writes) of this run."""
        self._manager.close()
        shutil.rmtree(self.directory, ignore_errors=True)
        self._manager = self._open()

    def close(self) -> None:
        """Wait for a save in flight to commit, then release orbax's resources."""
        self._manager.close()


@contextlib.contextmanager
def _quiet_failures() -> Iterator[None]:
    """Silence what a failed orbax/tensorstore read prints besides its exception.

    When a read fails, tensorstore callbacks still scheduled on orbax's closed event loop raise
    "Event loop is closed" (printed through `sys.excepthook`) and unawaited read coroutines are
    reported as unraisable: dozens of tracebacks for one corrupted file. The exception itself
    still propagates and becomes one `CheckpointError` message.
    """
    hooks = sys.excepthook, sys.unraisablehook, threading.excepthook
    sys.excepthook = lambda *args: None
    sys.unraisablehook = lambda *args: None
    threading.excepthook = lambda *args: None
    try:
        yield
    except BaseException:
        gc.collect()  # report the abandoned coroutines now, while silenced
        time.sleep(0.2)  # let in-flight callbacks fail while silenced
        raise
    finally:
        sys.excepthook, sys.unraisablehook, threading.excepthook = hooks


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    head = text[0] if text else type(error).__name__
    return f"{type(error).__name__}: {head[:200]}"
