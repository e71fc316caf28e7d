"""The Python driver around the compiled phases: epochs, evaluation, logging, progress,
checkpoints, interruption and resume.

Host hooks live here (timing, logging, progress, checkpointing); traced hooks are already inside
the phases. By default the epochs up to the next evaluation or checkpoint (at most
`engine.epochs_per_call`) are ONE compiled call (`engine.epochs`, a loop over the fused epoch,
as Brax trains between evaluations); their per-epoch metrics come back stacked, in one transfer.
`profile: true` runs the four phases of each epoch as separate compiled calls so each gets its
own timer (same results, see tests/core/test_driver.py).

A run survives: a full-state checkpoint every `save_interval` epochs and after the last
(`jaxrl_engine.io.checkpoint`); SIGINT/SIGTERM finish the current call (at most
`epochs_per_call` epochs, up to the next evaluation), checkpoint, write the summary and raise
`TrainingInterrupted` (a second signal kills the process at once: every file is written
atomically, so nothing is left half-written); a non-finite value stops the run with
`NonFiniteError`, writes the failing batch to the run directory and leaves the checkpoints as
they were. `resume(run_dir)` continues from the latest checkpoint.
"""

from __future__ import annotations

import contextlib
import copy
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from jaxrl_engine.core.hooks import NonFiniteError, check_guards
from jaxrl_engine.core.state import EngineState
from jaxrl_engine.io.checkpoint import Checkpointer, CheckpointError, config_changes
from jaxrl_engine.io.config import ConfigError, config_from_dict
from jaxrl_engine.io.run_dir import RunDir, write_metrics_lines

if TYPE_CHECKING:
    from jaxrl_engine.core.engine import Engine


def _progress(enabled: bool) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]} steps/s"),
        TextColumn("eval {task.fields[eval]}"),
        TimeElapsedColumn(),
        disable=not enabled,
    )


class TrainingInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped `run` after a whole epoch, with a checkpoint and the summary.

    A `KeyboardInterrupt`, so `except Exception` does not swallow it. `state` is the state after
    the last finished epoch; `checkpoint` its checkpoint directory (None without checkpoints).
    """

    def __init__(self, signame: str, epoch: int, state: EngineState, checkpoint: Path | None):
        self.signame, self.epoch, self.state, self.checkpoint = signame, epoch, state, checkpoint
        where = f"; checkpoint {checkpoint}" if checkpoint is not None else ""
        super().__init__(f"{signame}: stopped after epoch {epoch}{where}")


class _StopSignal:
    """SIGINT/SIGTERM while training: the first asks to stop after the current epoch; the
    second ends the process at once (`os._exit(128 + signum)`), even while the main thread
    waits inside a compiled epoch.

    Python runs signal handlers only between bytecodes of the main thread, which may sit in
    one XLA call for minutes; so the C-level handler's wakeup fd is watched by a thread, which
    sees every signal as it arrives. Exiting without cleanup is safe: checkpoints, metrics
    rewrites and the summary are all written to a temporary name and renamed.
    """

    def __init__(self) -> None:
        self.signame: str | None = None

    def handler(self, signum: int, frame: Any) -> None:
        """The Python-level handler (runs late, in the main thread); the watcher did the work."""

    def watch(self, wakeup: socket.socket) -> None:
        while data := wakeup.recv(64):
            for signum in data:
                if signum not in (signal.SIGINT, signal.SIGTERM):
                    continue
                if self.signame is not None:
                    os._exit(128 + signum)
                self.signame = signal.Signals(signum).name
                print(
                    f"\n{self.signame}: stopping after this epoch (checkpoint and summary "
                    "follow); send it again to exit at once",
                    file=sys.stderr,
                    flush=True,
                )


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[_StopSignal]:
    stop = _StopSignal()
    if threading.current_thread() is not threading.main_thread():
        yield stop  # signal handlers can only be installed from the main thread
        return
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    previous_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    previous = {sig: signal.signal(sig, stop.handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    watcher = threading.Thread(target=stop.watch, args=(reader,), daemon=True)
    watcher.start()
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(previous_fd)
        writer.close()  # the watcher reads EOF and returns
        watcher.join()
        reader.close()


def _open_checkpoints(engine: Engine, out: RunDir, first: int) -> Checkpointer | None:
    """The run's checkpointer, after checking that the directory's checkpoints fit this state.

    A fresh state (epoch 0) over a finished run starts it over (its checkpoints are deleted);
    over an unfinished run it is refused, as is a state older than the directory's checkpoints.
    """
    cfg = engine.cfg
    directory = out.path / "checkpoints"
    if cfg.save_interval == 0 and not directory.is_dir():
        return None
    checkpoints = Checkpointer(directory, keep=cfg.keep_checkpoints)
    latest = checkpoints.latest()
    if latest is not None and first == 0:
        info = checkpoints.info(latest)
        if latest < info.num_epochs:
            raise CheckpointError(
                f"{str(out.path)!r} holds an unfinished run (checkpoint of epoch {latest} of "
                f"{info.num_epochs}): continue it with `jaxrl-engine train --resume {out.path}` "
                "(in Python: `jre.resume(path)`), or delete the directory (or choose another "
                "name=) to start over"
            )
        print(
            f"jaxrl-engine: {out.path} held a finished run; starting it over (its metrics and "
            "checkpoints are replaced)",
            file=sys.stderr,
        )
        checkpoints.delete_all()
    elif latest is not None and latest > first:
        raise CheckpointError(
            f"{str(out.path)!r} has checkpoints up to epoch {latest}, after this state's epoch "
            f"{first}: continue from the latest with `jre.resume(path)`, or use another run "
            "directory"
        )
    if cfg.save_interval == 0:
        checkpoints.close()
        return None
    return checkpoints


def _write_failing_batch(
    out: RunDir, state: EngineState, metrics: dict[str, Any], epoch: int
) -> Path:
    """The failing epoch's rollout buffer, prepared batch, last observations and metrics."""
    arrays: dict[str, np.ndarray] = {}
    for name, tree in (
        ("buffer", state.buffer),
        ("batch", state.batch),
        ("env.obs", state.env.obs),
    ):
        for keys, leaf in jax.tree_util.tree_flatten_with_path(jax.device_get(tree))[0]:
            arrays[name + jax.tree_util.keystr(keys)] = np.asarray(leaf)
    for name, value in metrics.items():
        arrays[f"metrics/{name}"] = np.asarray(value)
    target = out.path / f"nonfinite_epoch_{epoch}.npz"
    tmp = out.path / f"nonfinite_epoch_{epoch}.tmp.npz"
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)  # type: ignore[arg-type]
    tmp.replace(target)
    return target


def _epochs_to_boundary(done: int, total: int, eval_interval: int, save_interval: int) -> int:
    """Epochs from `done` to the next evaluation, checkpoint or the end (whichever is first)."""
    boundaries = [total, (done // eval_interval + 1) * eval_interval]
    if save_interval:
        boundaries.append((done // save_interval + 1) * save_interval)
    return min(boundaries) - done


def run(
    engine: Engine,
    state: EngineState,
    *,
    num_epochs: int | None = None,
    run_dir: str | Path | None = None,
    progress: bool | None = None,
    on_epoch: Callable[[dict[str, float]], None] | None = None,
) -> tuple[EngineState, list[dict[str, float]]]:
    """Train from `state` up to `num_epochs` epochs in total (default: the config's).

    Evaluates every `eval.interval` epochs and after the last; writes `metrics.jsonl`,
    `summary.json` and `checkpoints/` (every `save_interval` epochs and after the last) to
    `run_dir` (default `<run_dir>/<name>`). `on_epoch(record)` is called after each epoch's
    record is logged (and checkpointed). Returns the final state and the per-epoch records.

    Raises `TrainingInterrupted` after SIGINT/SIGTERM (checkpoint and summary written first),
    `NonFiniteError` when `nan_guard` fires (failing batch written, checkpoints untouched) and
    `CheckpointError` when the run directory holds checkpoints that do not fit this state.
    """
    from jaxrl_engine.core.engine import EPOCH_PHASES

    cfg = engine.cfg
    total = engine.num_epochs if num_epochs is None else num_epochs
    first = int(jax.device_get(state.counters.epoch))
    out = RunDir(run_dir if run_dir is not None else Path(cfg.run_dir) / cfg.name, cfg)
    wall_start = time.perf_counter()
    checkpoints = None
    try:
        checkpoints = _open_checkpoints(engine, out, first)
        metrics_lines = out.keep_metrics_through(first)
        needed = [*EPOCH_PHASES, "evaluate"] if cfg.profile else ["epochs", "evaluate"]
        missing = [name for name in needed if name not in engine._compiled]
        if missing:
            state = engine.warm_up(state, phases=missing)
        compile_s = engine.compile_seconds
        history: list[dict[str, float]] = []
        final_eval = float("nan")
        done = first
        saved: Path | None = None  # the checkpoint of the epoch `saved_epoch`
        saved_epoch = first
        train_start = time.perf_counter()
        show = cfg.progress if progress is None else progress

        def save() -> Path | None:
            if checkpoints is None:
                return None
            return checkpoints.save(
                state,
                config=cfg.model_dump(mode="json"),
                metrics_lines=metrics_lines,
                num_epochs=engine.num_epochs,
            )

        def summarize(status: str, **extra: Any) -> dict[str, Any]:
            if checkpoints is not None:
                checkpoints.wait()  # the summary names the latest committed checkpoint
            train_s = time.perf_counter() - train_start
            summary = {
                "name": cfg.name,
                "status": status,
                "final_eval_return": final_eval,
                "epochs": done,
                "env_steps": done * engine.steps_per_epoch,
                "requested_env_steps": cfg.total_env_steps,
                "wall_s": time.perf_counter() - wall_start,
                "train_s": train_s,
                "compile_s": compile_s,
                "steps_per_second": (done - first) * engine.steps_per_epoch / max(train_s, 1e-9),
                "run_dir": str(out.path),
                "checkpoint": str(checkpoints.path_of(checkpoints.latest() or 0))
                if checkpoints is not None and checkpoints.latest() is not None
                else None,
                **extra,
            }
            out.write_summary(summary)
            engine.last_summary = summary
            return summary

        with _stop_on_signals() as stop, _progress(show) as bar:
            task = bar.add_task(cfg.name, total=total, completed=first, rate="-", eval="-")
            while done < total:
                chunk_start = done
                if cfg.profile:  # one epoch, each phase its own timed call
                    n, metrics = 1, {}
                    for name in EPOCH_PHASES:
                        state, m = engine.timed_call(name, state)
                        metrics.update(m)
                    state = jax.device_put(state, engine.state_sharding)
                    rows = [metrics]
                else:
                    n = min(
                        _epochs_to_boundary(done, total, cfg.eval.interval, cfg.save_interval),
                        engine.epochs_per_call,
                    )
                    start = time.perf_counter()
                    state, table, ran = jax.block_until_ready(engine.call("epochs", state, n))
                    ran = int(ran)
                    engine.timer.record("epoch", time.perf_counter() - start, count=ran)
                    table = jax.device_get(table)
                    rows = [{k: v[i] for k, v in table.items()} for i in range(ran)]
                done = chunk_start + len(rows)
                if len(rows) == n and (done % cfg.eval.interval == 0 or done == total):
                    state, eval_metrics = engine.timed_call("evaluate", state)
                    rows[-1] = {**rows[-1], **jax.device_get(eval_metrics)}
                wall_s = time.perf_counter() - wall_start
                save_now = bool(cfg.save_interval) and (
                    done % cfg.save_interval == 0 or done == total
                )
                for i, metrics in enumerate(rows):
                    epoch = chunk_start + i + 1
                    try:
                        check_guards(metrics, engine.guarded_names, epoch)
                    except NonFiniteError as e:
                        # The compiled loop stopped after this epoch: `state` is its state.
                        batch = _write_failing_batch(out, state, metrics, epoch)
                        done = epoch - 1  # the failing epoch does not count
                        summary = summarize("non_finite", error=str(e), failing_batch=str(batch))
                        last_good = summary["checkpoint"]
                        e.add_note(
                            f"failing batch: {batch}; last good checkpoint: {last_good} "
                            "(left as it was)"
                        )
                        raise
                    record = {
                        "epoch": epoch,
                        "env_steps": epoch * engine.steps_per_epoch,
                        "wall_s": wall_s,
                        **{
                            k: float(np.asarray(v))
                            for k, v in metrics.items()
                            if not k.startswith("guard/")
                        },
                    }
                    if "evaluate/episode_return" in record:
                        final_eval = record["evaluate/episode_return"]
                    metrics_lines.append(out.log(record))
                    history.append(record)
                    if epoch == done and save_now:  # before on_epoch sees the last record
                        saved, saved_epoch = save(), done
                    if on_epoch is not None:
                        on_epoch(record)
                elapsed = time.perf_counter() - train_start
                rate = (done - first) * engine.steps_per_epoch / max(elapsed, 1e-9)
                bar.update(task, completed=done, rate=f"{rate:,.0f}", eval=f"{final_eval:.1f}")
                if stop.signame is not None and done < total:
                    if cfg.save_interval and saved_epoch != done:
                        saved, saved_epoch = save(), done
                    summarize("interrupted", signal=stop.signame)
                    raise TrainingInterrupted(stop.signame, done, state, saved)
        summarize("completed")
    finally:
        out.close()
        if checkpoints is not None:
            checkpoints.close()  # waits for a save in flight
    return state, history


def resume(
    run_dir: str | Path, overrides: list[str] | None = None, **build_kwargs: Any
) -> tuple[Engine, EngineState]:
    """Continue a run: `engine, state = resume("runs/x"); engine.run(state)`.

    Builds the engine from the latest checkpoint's config (with dotted `overrides`, which may
    not change any shape), restores the whole state onto the engine's shardings and puts the
    run's `metrics.jsonl` back to the checkpoint's copy (records written after the checkpoint
    are dropped: resuming computes them again, identically). Raises `CheckpointError` or
    `ConfigError` with one clear message, before anything is compiled.
    """
    from jaxrl_engine.core.engine import build

    path = Path(run_dir)
    if not path.is_dir():
        raise CheckpointError(f"cannot resume: run directory {str(path)!r} does not exist")
    if path.name == "checkpoints" or (path / "_CHECKPOINT_METADATA").exists():
        raise CheckpointError(
            f"cannot resume from {str(path)!r}: that is a checkpoint; pass its run directory "
            f"({str(path.parent if path.name == 'checkpoints' else path.parent.parent)!r}), "
            "which continues from its latest checkpoint"
        )
    if not (path / "checkpoints").is_dir():
        raise CheckpointError(
            f"cannot resume: {str(path)!r} has no checkpoints/ (is it a run directory? runs "
            "with save_interval=0 write none)"
        )
    checkpoints = Checkpointer(path / "checkpoints", read_only=True)
    try:
        info = checkpoints.info()
        for item in overrides or []:
            if item.split("=", 1)[0] in ("name", "run_dir"):
                raise ConfigError(
                    f"override {item!r}: a resumed run stays in its run directory {str(path)!r}"
                )
        raw = copy.deepcopy(info.config)
        raw.update(name=path.name, run_dir=str(path.parent))
        cfg = config_from_dict(raw, overrides)
        engine = build(cfg, **build_kwargs)
        state, info = checkpoints.restore(engine, info.epoch)
    finally:
        checkpoints.close()
    write_metrics_lines(path, info.metrics_lines)
    changes = config_changes(info.config, cfg.model_dump(mode="json"))
    print(
        f"jaxrl-engine: resuming {path} from its checkpoint of epoch {info.epoch}"
        + (f", with config changes: {'; '.join(changes)}" if changes else ""),
        file=sys.stderr,
    )
    return engine, state
