"""Writing into a run directory safely: atomic files, never through a symlink, strict JSON.

A run directory is data that other people (or a careless script) may have touched: a planted
symlink must not redirect a write to a file outside it, and a crash or a full disk must never
leave a half-written file under a real name. Every file the engine writes goes through
`atomic_write` (a fresh temporary file, created with O_EXCL so an existing path or symlink is
never followed, then `os.replace`, which replaces a symlink itself, not its target) or
`open_append` (O_NOFOLLOW).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import IO, Any


class RunDirError(ValueError):
    """A run directory that cannot be used: locked by another run, holding symlinks, or not a
    directory."""


def check_kind(path: Path, kind: str) -> None:
    """Refuse (`RunDirError`) a train into a sweep's directory (it holds `sweep.json`) and a
    sweep into a train run's (it holds `metrics.jsonl`): either would overwrite the other's
    summary and mix their files."""
    other, marker, verb = (
        ("sweep", "sweep.json", "sweep")
        if kind == "train"
        else ("train run", "metrics.jsonl", "train")
    )
    if (path / marker).is_file():
        raise RunDirError(
            f"{str(path)!r} is a {other}'s directory (it holds {marker}), not a {kind}'s: "
            f"continue it with `jaxrl-engine {verb} --resume {path}`, or choose another name= "
            "(or delete it)"
        )


def atomic_write(path: str | Path, data: bytes | str) -> None:
    """Write `data` to `path` atomically: readers see the old file or the new one, never a
    part; on any error (e.g. a full disk) the temporary file is removed and `path` is as it
    was."""
    blob = data.encode() if isinstance(data, str) else data
    atomic_writer(path, lambda f: f.write(blob))


def atomic_writer(path: str | Path, write: Any) -> None:
    """`write(fileobj)` into a temporary file, then renamed to `path` (see `atomic_write`)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide run files from their group
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def open_append(path: str | Path) -> IO[bytes]:
    """`path` opened for appending bytes, unbuffered (each write reaches the file, or fails,
    at once); refuses (OSError ELOOP) when it is a symlink."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    return os.fdopen(fd, "ab", buffering=0)


def symlinks_in(directory: str | Path) -> list[Path]:
    """Every symlink inside `directory` (not followed), sorted."""
    found = []
    for root, dirs, files in os.walk(directory, followlinks=False):
        for name in dirs + files:
            if os.path.islink(os.path.join(root, name)):
                found.append(Path(root, name))
    return sorted(found)


def check_no_symlinks(directory: str | Path) -> None:
    """Refuse a run directory holding symlinks: a write could follow one out of it."""
    links = symlinks_in(directory)
    if links:
        shown = ", ".join(f"{str(p)!r} -> {os.readlink(p)!r}" for p in links[:3])
        more = f" (and {len(links) - 3} more)" if len(links) > 3 else ""
        raise RunDirError(
            f"run directory {str(directory)!r} holds symlinks, which could redirect its writes "
            f"elsewhere: {shown}{more}; remove them (or use another name=)"
        )


SPEC_FILE = "sweep.json"  # a sweep's directory holds it (its seeds, grid and programs)
RUN_FILES = ("config.yaml", "metrics.jsonl", "summary.json", SPEC_FILE)
RUN_FOLDERS = ("checkpoints", "policy")
# `jaxrl-engine plot`'s default outputs in a run directory (one run; several: in the first)
PLOT_FILES = ("curves.png", "curves_*_runs.png")


def default_plot_name(num_runs: int) -> str:
    return PLOT_FILES[0] if num_runs == 1 else PLOT_FILES[1].replace("*", str(num_runs))


# A checkpoint's folder in `checkpoints/` is `epoch_<N>`; its metadata (orbax's JsonSave file:
# strict JSON) is `meta/metadata` inside it. Here, not in checkpoint.py, so that readers of a
# run directory (plot) need no orbax.
STEP_PREFIX = "epoch"
META_FILE = Path("meta") / "metadata"


def check_run_entries(directory: str | Path) -> None:
    """Refuse a run directory whose own files are folders (or folders files): a write there
    would fail only after training, at the end of the run."""
    directory = Path(directory)
    for names, wrong, what in (
        (RUN_FILES, Path.is_dir, "file"),
        (RUN_FOLDERS, Path.is_file, "folder"),
    ):
        for name in names:
            path = directory / name
            if wrong(path):
                raise RunDirError(
                    f"{str(path)!r} is not a {what}; the run writes its {name} there: remove "
                    "it (or use another name=)"
                )


def jsonable(value: Any) -> Any:
    """A value JSON can hold strictly: numpy scalars become Python numbers, NaN becomes null
    and +-inf the largest finite doubles (JSON has no NaN/Infinity tokens)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if hasattr(value, "dtype") and hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else math.copysign(1.7976931348623157e308, value)
    return value


def strict_json(value: Any, **kwargs: Any) -> str:
    """`json.dumps` of `jsonable(value)` that never writes NaN or Infinity."""
    return json.dumps(jsonable(value), allow_nan=False, **kwargs)
