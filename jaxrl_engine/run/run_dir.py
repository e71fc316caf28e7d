"""A run directory: resolved config, `metrics.jsonl`, `summary.json` (and `checkpoints/`)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import math
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxrl_engine.core.sharding import sync_processes, to_host
from jaxrl_engine.core.state import EngineState
from jaxrl_engine.export.policy import ARTEFACT_FILES, POLICY_DIR
from jaxrl_engine.io.config import Config, dump_config
from jaxrl_engine.io.files import (
    PLOT_FILES,
    RunDirError,
    atomic_write,
    atomic_writer,
    check_kind,
    check_no_symlinks,
    check_run_entries,
    open_append,
    strict_json,
)
from jaxrl_engine.io.logging import make_loggers, window_record

LOCK_FILE = ".lock"


def clear_outputs(path: Path) -> None:
    """Remove a run's TensorBoard events, failing batches, exported policy and `plot`'s
    default curves from `path`, file by file (a symlink is removed, never followed): what a
    run started over replaces (a plot of the old records would pass for the new run's)."""
    for pattern in ("events.out.tfevents.*", "nonfinite_epoch_*.npz", *PLOT_FILES):
        for old in path.glob(pattern):
            old.unlink()
    for name in ARTEFACT_FILES:
        (path / POLICY_DIR / name).unlink(missing_ok=True)


def clear_run_files(path: Path) -> None:
    """Remove everything a run wrote into `path` (its summary, records and config too)."""
    for name in ("summary.json", "metrics.jsonl", "config.yaml"):
        (path / name).unlink(missing_ok=True)
    clear_outputs(path)


def end_status(done: int, num_epochs: int) -> str:
    """A summary's status when training stopped at epoch `done` with no signal or failure:
    `completed` at the config's `num_epochs`, `paused` before it (a library call's smaller
    `num_epochs`): the directory is then an unfinished run that resume continues."""
    return "completed" if done >= num_epochs else "paused"


def epochs_asked(num_epochs: object, first: int, num_total: int, where: str) -> int:
    """The epoch a call to train to `num_epochs` stops at (None: the config's `num_total`),
    checked before anything is written: a whole number from the state's epoch `first` up to
    `num_total` (more would train on a learning rate annealed to its end and report epochs the
    config does not have)."""
    if num_epochs is None:
        return num_total
    if isinstance(num_epochs, bool) or not isinstance(num_epochs, int | np.integer):
        raise TypeError(f"{where}: num_epochs={num_epochs!r}: give a whole number of epochs")
    num_epochs = int(num_epochs)
    if not 1 <= num_epochs <= num_total:
        raise ValueError(
            f"{where}: num_epochs={num_epochs} is not within 1..{num_total}, the config's "
            "epochs (total_env_steps over the env steps per epoch): raise total_env_steps to "
            "train longer"
        )
    if num_epochs < first:
        raise ValueError(
            f"{where}: num_epochs={num_epochs} is before the state's epoch {first}: a state "
            "trains forward only"
        )
    return num_epochs


def _pid_in(fd: int) -> int | None:
    text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    return int(text) if text.isdigit() else None


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunLock:
    """Ownership of a run directory: an OS file lock (`flock`) on `<run>/.lock`, which holds
    the owner's pid.

    The OS releases the lock when its process ends, however it ends, so a lock left by a killed
    run is stale by construction: the next run takes it (and says so). A second run of a
    locked directory is refused naming the holder's pid. Two opens of the lock file in one
    process are independent too, so the same process cannot run one directory twice at once.
    """

    def __init__(self, path: Path, instead: str = "or choose another name="):
        self.path = path
        self.instead = instead  # the advice's last part: what else the refused caller can do
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            fd = os.open(
                self.path / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644
            )
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            raise RunDirError(
                f"{str(self.path / LOCK_FILE)!r} is a symlink; remove it (a run directory holds "
                "no symlinks)"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _pid_in(fd)
            os.close(fd)
            raise RunDirError(
                f"run directory {str(self.path)!r} is in use by another run (pid "
                f"{holder if holder is not None else 'unknown'}); wait for it to end, stop it, "
                f"{self.instead}"
            ) from None
        previous = _pid_in(fd)
        if previous is not None and previous != os.getpid() and not _running(previous):
            print(
                f"jaxrl-engine: {self.path}: taking over the lock left by pid {previous}, which "
                "is no longer running",
                file=sys.stderr,
            )
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def holder(self) -> str | None:
        """Who holds the lock now, without taking it: the holder's pid ("unknown" when the
        file does not say), None when nobody does (no lock file, or one left by a run that
        ended)."""
        try:
            fd = os.open(self.path / LOCK_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:  # (none; or a symlink, which acquiring refuses)
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _pid_in(fd)
            return str(pid) if pid is not None else "unknown"
        finally:
            os.close(fd)  # (closing the only descriptor releases a shared lock taken here)
        return None

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):  # a full disk must not keep the lock
            os.ftruncate(self._fd, 0)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None


class RunDir:
    """`runs/<name>/`, owned by this run while open: the lock is taken and the directory
    checked (no symlinks) on open, before anything in it changes; `open_logs` then writes the
    config and opens `metrics.jsonl` (after the driver's checks of its checkpoints).

    writer: False in the other processes of a multi-process run (process 0 writes): the
    directory is read, never locked or written (logs and the summary are not written)."""

    def __init__(self, root: str | Path, cfg: Config, writer: bool = True, kind: str = "train"):
        self.path, self.cfg, self.writer = Path(root), cfg, writer
        self._metrics: Any = None
        self._backends: list[Any] = []
        self._created = False
        # What `metrics.jsonl` holds: its length, records and running SHA-256 (a checkpoint
        # records them, not the records themselves: `metrics_mark`)
        self._log_bytes, self._log_records, self._log_hash = 0, 0, hashlib.sha256()
        self._window: list[dict[str, Any]] = []  # epochs not yet written (`log_interval`)
        self.lock = RunLock(self.path)
        if not writer:
            return
        if self.path.exists() and not self.path.is_dir():
            raise RunDirError(f"run directory {str(self.path)!r} exists and is not a directory")
        if self.path.is_symlink():
            raise RunDirError(f"run directory {str(self.path)!r} is a symlink; use its target")
        self._created = not self.path.exists()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO):
                raise  # (the machine's, not the path's: exit 74 as while training)
            raise RunDirError(
                f"cannot create run directory {str(self.path)!r}: {e.strerror} (check run_dir "
                "and name)"
            ) from None
        self.lock.acquire()
        try:
            check_no_symlinks(self.path)
            check_run_entries(self.path)
            check_kind(self.path, kind)
        except BaseException:
            self.release()
            raise

    def open_logs(
        self,
        first: int,
        restored: list[str] | None = None,
        mark: dict[str, Any] | None = None,
    ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """Write `config.yaml`; put `metrics.jsonl` back to the records through epoch `first`
        and open it for appending. `mark`: the checkpoint's record of the file (its length and
        SHA-256), the file cut back to that length when it starts as the checkpoint saw it;
        `restored`: an older checkpoint's copy of the records, written back; neither (a fresh
        run: epoch 0), or a file that is not what the checkpoint saw (edited or cut short: a
        warning), the file's own whole records through `first`.

        Returns (the last record kept, the last with an evaluation), None for none."""
        path = self.path / "metrics.jsonl"
        if self.writer:
            atomic_write(self.path / "config.yaml", dump_config(self.cfg))
            if first == 0:  # a fresh run (or one started over) shows nothing of another
                # (no summary of the run it replaces: stopped before its first checkpoint, it
                # is not that run); a resume keeps its failing batches (a failure's evidence)
                (self.path / "summary.json").unlink(missing_ok=True)
                clear_outputs(self.path)
        found = _matching_prefix(path, mark) if mark is not None and first > 0 else None
        if found is not None and mark is not None:
            last, last_eval, self._log_hash = found
            self._log_bytes, self._log_records = mark["bytes"], mark["records"]
            if self.writer and path.stat().st_size != mark["bytes"]:
                os.truncate(path, mark["bytes"])  # (the records after the checkpoint go)
        else:
            if mark is not None and first > 0 and self.writer:
                print(
                    f"jaxrl-engine: warning: {str(path)!r} is not what the checkpoint of epoch "
                    f"{first} saw ({mark['records']} records, {mark['bytes']} bytes): it was "
                    f"edited or cut short; its whole records through epoch {first} are kept",
                    file=sys.stderr,
                )
            if restored is None:  # (a damaged line is skipped, not the lines after it)
                restored = [
                    line
                    for line in (metrics_text(path).splitlines() if path.is_file() else [])
                    if _epoch_of(line) <= first
                ]
            wanted = "".join(line + "\n" for line in restored)
            if self.writer and (path.read_bytes() if path.is_file() else b"") != wanted.encode():
                write_metrics_lines(self.path, restored)
            raw = wanted.encode("utf-8")
            self._log_bytes, self._log_records = len(raw), len(restored)
            self._log_hash = hashlib.sha256(raw)
            last = json.loads(restored[-1]) if restored else None
            evals = (line for line in reversed(restored) if _evaluated(line))
            last_eval = json.loads(next(evals, "null"))
        if self.writer:
            self._metrics = open_append(path)
            self._backends = make_loggers(self.path, self.cfg)  # tensorboard, wandb: `loggers`
        return last, last_eval

    def metrics_mark(self) -> dict[str, Any]:
        """What a checkpoint records of `metrics.jsonl`: its length, records and SHA-256 (the
        epochs logged so far written first: a checkpoint's file holds its every epoch)."""
        self.flush_logs()
        return {
            "bytes": self._log_bytes,
            "sha256": self._log_hash.hexdigest(),
            "records": self._log_records,
        }

    def log(self, record: dict[str, Any]) -> None:
        """Log one epoch's record. With `log_interval` N > 1 the epochs are held until a window
        closes, at an epoch that is a multiple of N or has an evaluation (or at `flush_logs`:
        a checkpoint, the end), and the window is written as one record (`window_record`)."""
        interval = self.cfg.log_interval
        if interval == 1:
            self._write(record)
            return
        self._window.append(record)
        if int(record["epoch"]) % interval == 0 or any(k.startswith("evaluate/") for k in record):
            self.flush_logs()

    def flush_logs(self) -> None:
        """Write the epochs held since the last record (`log_interval`) as one record."""
        if self._window:
            window, self._window = self._window, []
            self._write(window_record(window))

    def _write(self, record: dict[str, Any]) -> None:
        """Append one record. A write that fails (a full disk) leaves the file at its last
        whole record."""
        line = strict_json(record)
        raw = (line + "\n").encode("utf-8")
        if self.writer:
            try:
                written = 0
                while written < len(raw):
                    written += self._metrics.write(raw[written:])
            except OSError as e:
                with contextlib.suppress(OSError):
                    os.truncate(self.path / "metrics.jsonl", self._log_bytes)
                raise OSError(e.errno, e.strerror, str(self.path / "metrics.jsonl")) from None
            for backend in self._backends:
                backend.log(record)
        self._log_bytes += len(raw)
        self._log_records += 1
        self._log_hash.update(raw)

    def read_summary(self) -> dict[str, Any] | None:
        """The run's `summary.json`, or None when there is none (or it is unreadable)."""
        return read_summary(self.path)

    def write_summary(self, summary: dict[str, Any]) -> None:
        if self.writer:
            atomic_write(self.path / "summary.json", strict_json(summary, indent=2))

    def close_logs(self) -> None:
        """Write the epochs held (`log_interval`), close `metrics.jsonl` and the logger
        backends (the lock stays held)."""
        errors = []
        try:
            self.flush_logs()
        except OSError as e:  # (a full disk: the file keeps its last whole record)
            errors.append(e)
        for closable in [self._metrics, *self._backends]:
            if closable is None:
                continue
            try:
                closable.close()
            except OSError as e:  # e.g. a full disk while flushing
                errors.append(e)
        self._metrics, self._backends = None, []
        if errors:
            raise errors[0]

    def release(self) -> None:
        """Give up the directory; one this run created and never used is removed again."""
        if not self.writer:
            return
        if self._created and self._metrics is None:
            with contextlib.suppress(OSError):
                if {p.name for p in self.path.iterdir()} <= {LOCK_FILE}:
                    (self.path / LOCK_FILE).unlink()
                    self.lock.release()
                    self.path.rmdir()
                    return
        self.lock.release()

    def close(self) -> None:
        self.close_logs()
        self.release()

    def discard_checkpoints_after(self, checkpoints: Any, epoch: int) -> list[Path]:
        """Move the checkpoints after `epoch` out of `checkpoints/` into
        `discarded_checkpoints/` (kept, not deleted); returns where they went. In a
        multi-process run every process calls it and process 0 moves them."""
        moved = []
        sync_processes("discard_checkpoints")  # every process has read the directory
        for later in [e for e in checkpoints.epochs() if e > epoch]:
            target = self.path / "discarded_checkpoints" / checkpoints.path_of(later).name
            target.parent.mkdir(exist_ok=True)
            n = 1
            while target.exists():
                target = target.with_name(f"{checkpoints.path_of(later).name}.{n}")
                n += 1
            if self.writer:
                shutil.move(checkpoints.path_of(later), target)
            moved.append(target)
        sync_processes("discarded_checkpoints")
        return moved


def read_summary(run: Path) -> dict[str, Any] | None:
    """`<run>/summary.json`, or None when there is none (or it is unreadable)."""
    try:
        summary = json.loads((run / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None


EVAL_KEY = '"evaluate/episode_return"'  # (in a record's line: it holds an evaluation)


def _evaluated(line: str) -> bool:
    """Whether a record's line holds an evaluation's return (a number, not null)."""
    if EVAL_KEY not in line:
        return False
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return False
    value = record.get(EVAL_KEY.strip('"')) if isinstance(record, dict) else None
    return isinstance(value, int | float) and not isinstance(value, bool)


def _matching_prefix(path: Path, mark: dict[str, Any]) -> tuple[Any, Any, Any] | None:
    """(last record, last record with an evaluation, SHA-256 state) of the first
    `mark["bytes"]` bytes of `path` when they hash to `mark["sha256"]`; None when not (or
    when the file is shorter or unreadable). One pass over the file, a line at a time."""
    digest, size, last, last_eval = hashlib.sha256(), 0, b"null", b"null"
    key = EVAL_KEY.encode()
    try:
        with open(path, "rb") as f:
            for raw in f:
                if size + len(raw) > mark["bytes"]:
                    break
                digest.update(raw)
                size += len(raw)
                last = raw
                if key in raw and _evaluated(raw.decode("utf-8", errors="replace")):
                    last_eval = raw
    except OSError:
        return None
    if size != mark["bytes"] or digest.hexdigest() != mark["sha256"]:
        return None

    def parse(raw: bytes) -> Any:
        return json.loads(raw.decode("utf-8", errors="replace"))

    return parse(last), parse(last_eval), digest


def _epoch_of(line: str) -> float:
    """A record line's epoch; infinity for a line that is not a record (damaged)."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return math.inf
    epoch = record.get("epoch", 0) if isinstance(record, dict) else None
    return epoch if isinstance(epoch, int) else math.inf


def read_metrics_lines(path: Path) -> list[str]:
    """The complete records of a `metrics.jsonl` (a torn last line, from a kill, is dropped)."""
    if not path.is_file():
        return []
    lines = []
    for line in metrics_text(path).splitlines():
        try:
            json.loads(line)
        except json.JSONDecodeError:  # (bytes that are not UTF-8 read as U+FFFD: not JSON)
            break
        lines.append(line)
    return lines


def metrics_text(path: Path) -> str:
    """A `metrics.jsonl`'s text, bytes that are not UTF-8 (a damaged file) replaced."""
    return path.read_bytes().decode("utf-8", errors="replace")


def write_metrics_lines(run_path: Path, lines: list[str]) -> None:
    """Replace `<run_path>/metrics.jsonl` by `lines`, atomically (temp file + `os.replace`)."""
    atomic_write(run_path / "metrics.jsonl", "".join(line + "\n" for line in lines))


def write_failing_batch(
    out: RunDir, state: EngineState, metrics: dict[str, Any], epoch: int
) -> Path:
    """The failing epoch's rollout buffer, prepared batch, last observations and metrics
    (gathered from every process of a multi-process run; process 0 writes them)."""
    arrays: dict[str, np.ndarray] = {}
    for name, tree in (
        ("buffer", state.buffer),
        ("batch", state.batch),
        ("env.obs", state.env.obs),
    ):
        for keys, leaf in jax.tree_util.tree_flatten_with_path(to_host(tree))[0]:
            arrays[name + jax.tree_util.keystr(keys)] = np.asarray(leaf)
    for name, value in metrics.items():
        arrays[f"metrics/{name}"] = np.asarray(value)
    target = out.path / f"nonfinite_epoch_{epoch}.npz"
    if out.writer:
        atomic_writer(target, lambda f: np.savez(f, **arrays))  # type: ignore[arg-type]
    return target
