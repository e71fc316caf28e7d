"""The Python driver around the compiled phases: the loop, nothing else.

By default the epochs up to the next evaluation or host-hook boundary (a checkpoint; at most
`engine.epochs_per_call`) are ONE compiled call (`engine.epochs`, a loop over the fused epoch,
as Brax trains between evaluations); their per-epoch metrics come back stacked, in one
transfer. `profile: true` runs the four phases of each epoch as separate compiled calls so each
gets its own timer (same results). Everything done with the results (logging, progress,
checkpoints, the summary, the policy export) is a host hook (`run.host_hooks`).

A run survives: SIGINT/SIGTERM finish the current call, checkpoint, write the summary and raise
`TrainingInterrupted` (`run.signals`: a second signal kills the process at once; every file is
written atomically); a non-finite value stops the run with `NonFiniteError`, writes the failing
batch to the run directory and leaves the checkpoints as they were.
"""

from __future__ import annotations

import contextlib
import difflib
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxrl_engine.core.engine import Engine, check_jax_settings
from jaxrl_engine.core.nan_guard import NonFiniteError, check_guards
from jaxrl_engine.core.phases import EPOCH_PHASES, merge_metrics
from jaxrl_engine.core.sharding import is_primary, to_host
from jaxrl_engine.core.state import EngineState, Metrics
from jaxrl_engine.core.warm_up import check_state_layout
from jaxrl_engine.distributed.multihost import check_same_config
from jaxrl_engine.io.config import ALGO_NAMES, Config, ConfigError, folder_name
from jaxrl_engine.io.files import SPEC_FILE, RunDirError, check_no_symlinks, check_run_entries
from jaxrl_engine.run.host_hooks import (
    ExportPolicy,
    HostHook,
    Record,
    RunInfo,
    Summary,
    default_host_hooks,
)
from jaxrl_engine.run.overlap import overlap_phases, overlapped_epochs
from jaxrl_engine.run.run_dir import (
    RunDir,
    end_status,
    epochs_asked,
    read_summary,
    write_failing_batch,
)
from jaxrl_engine.run.signals import StopSignal, raise_if_stopped, stop_on_signals


def _chunk_length(engine: Engine, hooks: list[HostHook], start: int, total: int) -> int:
    """Epochs from `start` to the nearest boundary: the run's end, the next evaluation, a
    hook's (`next_boundary`), and at most `engine.epochs_per_call`."""
    boundaries = [total, (start // engine.eval_interval + 1) * engine.eval_interval]
    boundaries += [b for h in hooks if (b := h.next_boundary(start)) is not None]
    return min(min(boundaries) - start, engine.epochs_per_call)


@contextlib.contextmanager
def _host_errors(engine: Engine) -> Iterator[None]:
    """An exception raised by a host env inside a compiled call (a callback) comes out of XLA
    as a JaxRuntimeError holding its traceback as text; raise the env's original instead."""
    try:
        yield
    except Exception:
        original = getattr(engine.env, "host_error", None)
        if original is None:
            raise
        engine.env.host_error = None  # type: ignore[attr-defined]
        raise original from None


class TrainingInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped `run` after a whole epoch, with a checkpoint and the summary.

    A `KeyboardInterrupt`, so `except Exception` does not swallow it. `state` is the state after
    the last finished epoch (None when a sweep stopped between two groups); `checkpoint` its
    checkpoint directory (None without checkpoints);
    `summary` what summary.json holds.
    """

    def __init__(
        self,
        signame: str,
        epoch: int,
        state: EngineState | None,
        checkpoint: Path | None,
        summary: dict[str, Any],
        message: str | None = None,
    ):
        self.signame, self.epoch, self.state = signame, epoch, state
        self.checkpoint, self.summary = checkpoint, summary
        where = f"; checkpoint {checkpoint}" if checkpoint is not None else ""
        super().__init__(message or f"{signame}: stopped after epoch {epoch}{where}")


def _check_describes(cfg: Config, engine: Engine) -> None:
    """The driver's config describes `engine` (an engine built by hand with `jre.Engine(...,
    driver=Driver(cfg))`): the run directory's config.yaml is what `resume` and `make_policy`
    rebuild the engine from, so a run whose sizes differ from it is refused before it starts."""
    per_epoch = cfg.algo.num_steps * cfg.env.num_envs
    pairs: list[tuple[str, Any, Any]] = [
        ("env.num_envs", cfg.env.num_envs, engine.num_envs),
        ("algo.num_steps", cfg.algo.num_steps, engine.num_steps),
        ("total_env_steps (epochs)", math.ceil(cfg.total_env_steps / per_epoch), engine.num_epochs),
        ("eval.interval", cfg.eval.interval, engine.eval_interval),
    ]
    # An algorithm of the user's (`jre.build(cfg, algorithm=...)`) named as no config can be
    # is not compared: the checkpoints and the exported policy record its name, and `resume` /
    # `make_policy` of the run ask for it.
    if engine.algo.name in ALGO_NAMES:
        pairs.append(("algo.name", cfg.algo.name, engine.algo.name))
    wrong = [
        f"{key}: {mine!r} in the config, {its!r} in the engine"
        for key, mine, its in pairs
        if mine != its
    ]
    if wrong:
        raise ConfigError(
            "the driver's config does not describe this engine (" + "; ".join(wrong) + "): the "
            "run directory's config.yaml is what resume and make_policy rebuild it from; give "
            "jre.Driver the config the engine was built with"
        )


def _warn_misspelled(hook: HostHook) -> None:
    """Warn about a method of `hook` named almost as a HostHook method (`on_record`): the
    driver never calls it."""
    known = [name for name in vars(HostHook) if not name.startswith("_")]
    for name in dir(type(hook)):
        hooky = name.startswith(("on_", "after_", "next_"))  # (not `closed`, `records`, ...)
        if not hooky or name in known or not callable(getattr(type(hook), name)):
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
        if close:
            warnings.warn(
                f"host hook {type(hook).__name__} has a method {name!r}, which the driver never "
                f"calls; did you mean {close[0]!r}? (HostHook's methods: {', '.join(known)})",
                stacklevel=4,
            )


def _check_epoch_counter(state: EngineState, start: int, done: int) -> None:
    """`ValueError` when the state's epoch counter did not count the epochs that ran: a phase
    of the user's replacing `sync_weights` (which closes an epoch) that does not add 1 to it
    would otherwise go on with checkpoints saved under one epoch, evaluations and `every()`
    off their cadence, and a resume from the wrong place."""
    got = int(to_host(state.counters.epoch))
    if got != done:
        raise ValueError(
            f"after epochs {start + 1}..{done}, state.counters.epoch is {got}, not {done}: "
            "every epoch adds 1 to it (the engine's sync_weights does); a phase of your own "
            "that replaces sync_weights, or a hook, must keep counting (state.replace("
            "counters=state.counters.replace(epoch=state.counters.epoch + 1)))"
        )


def _alive(state: EngineState) -> bool:
    """No leaf of `state` was donated to a compiled call (deleted)."""
    return not any(x.is_deleted() for x in jax.tree.leaves(state) if isinstance(x, jax.Array))


def _summary_of_failure(
    run: RunInfo, state: EngineState, hooks: list[HostHook], error: BaseException
) -> None:
    """summary.json of a run that an error stopped (a host hook's, a host simulator's, the
    disk's): status "failed" and the error, beside the checkpoints and logs it had. Nothing
    else runs (no checkpoint of a state that may be the error's, no export); a summary that
    cannot be written leaves the error to say what happened."""
    first = (str(error).strip().splitlines() or [""])[0][:500]
    run.status = "failed"
    run.extra["error"] = f"{type(error).__name__}: {first}".rstrip(": ")
    if run.train_end is None:
        run.train_end = time.perf_counter()
    for hook in hooks:
        if isinstance(hook, Summary):
            with contextlib.suppress(Exception):
                hook.end(run, state)
        if isinstance(hook, ExportPolicy):  # (no export; the old policy is not the run's)
            with contextlib.suppress(Exception):
                hook.remove_stale(run)


def placed_as(state: EngineState, sharding: Any) -> EngineState:
    """`state` on `sharding` (the compiled epochs' input placement), moved only where a leaf
    is elsewhere: a user's hook on `evaluate` may leave params offloaded (`offload_after`)."""
    leaves, target = jax.tree.leaves(state), jax.tree.leaves(sharding)
    if all(x.sharding == s for x, s in zip(leaves, target, strict=True)):
        return state
    return jax.device_put(state, sharding)  # type: ignore[no-any-return]


class Driver:
    """Runs an engine for a config: `state, summary = Driver(cfg).run(engine, state)`.

    host_hooks: the user's, run after logging, checkpoints and progress (see `run.host_hooks`).
    """

    def __init__(
        self,
        cfg: Config,
        host_hooks: Sequence[HostHook] = (),
        resume_from: int | None = None,
        overlap: bool = False,
        actor_device: jax.Device | None = None,
    ):
        if not isinstance(cfg, Config):
            raise TypeError(
                f"Driver: cfg is a {type(cfg).__name__}; give a Config (jre.load_config(...))"
            )
        if isinstance(host_hooks, HostHook) or not isinstance(host_hooks, Sequence):
            raise TypeError(
                f"host_hooks is a {type(host_hooks).__name__}: give a list of jre.HostHook "
                "objects (host_hooks=[MyHook()])"
            )
        for i, hook in enumerate(host_hooks):
            if not isinstance(hook, HostHook):
                raise TypeError(
                    f"host_hooks[{i}] is a {type(hook).__name__}: a host hook is a jre.HostHook "
                    "subclass's object"
                )
            _warn_misspelled(hook)
        self.cfg, self.host_hooks = cfg, list(host_hooks)
        # Acting and learning overlapped (`run/overlap.py`), the actor on `actor_device` (None:
        # the learner's devices).
        self.overlap, self.actor_device = overlap, actor_device
        # The checkpoint epoch a resume was asked to continue from (`--from-checkpoint`): the
        # run directory's later checkpoints are then set aside instead of refusing the state.
        self.resume_from = resume_from

    def run(
        self,
        engine: Engine,
        state: EngineState,
        *,
        num_epochs: int | None = None,
        run_dir: str | Path | None = None,
        progress: bool | None = None,
        on_epoch: Callable[[Record], None] | None = None,
        started_at: float | None = None,
        records: bool = True,
    ) -> tuple[EngineState, dict[str, Any]]:
        """Train from `state` up to `num_epochs` epochs in total (default: the engine's).

        Evaluates every `eval.interval` epochs and after the last; the host hooks write
        `metrics.jsonl`, `summary.json`, `checkpoints/` and `policy/` to `run_dir` (default
        `<run_dir>/<name>`). `on_epoch(record)` is called after each epoch's record is logged
        (and checkpointed). Returns the final state and the summary, whose `records` are the
        per-epoch records of this call (kept in memory, about 2 KB an epoch: `records=False`
        keeps none, for a run of millions of epochs; the CLI's; `metrics.jsonl` has them).

        The summary's times: `wall_s` from `started_at` (a `time.perf_counter()` value; default
        this call; the CLI passes its own start) to the summary; `startup_s` from `started_at`
        to this call; `setup_s` in this call before the first epoch, less compiling (the run
        directory, loggers, what warm-up runs: an off-policy replay buffer's prefill);
        `compile_s` compiling in this call; `train_s` the epochs (with their evaluations and
        checkpoints); `end_s` after the last epoch (final checkpoint, summary, policy export).
        wall_s = startup_s + setup_s + compile_s + train_s + end_s.

        The summary's `status` is `completed` once the engine's `num_epochs` are trained, and
        `paused` when a smaller `num_epochs` stopped this call early: the directory is then an
        unfinished run (its checkpoint continues with `jre.resume` or `train --resume`). Both
        export the policy of the final state to `<run dir>/policy/`.

        Raises `TrainingInterrupted` after SIGINT/SIGTERM (checkpoint and summary written first),
        `NonFiniteError` when `nan_guard` fires (failing batch written, checkpoints untouched)
        and `CheckpointError` when the run directory holds checkpoints that do not fit.
        """
        called = time.perf_counter()
        cfg = self.cfg
        if run_dir is not None and not isinstance(run_dir, str | os.PathLike):
            raise TypeError(f"engine.run: run_dir={run_dir!r} is not a path")
        if run_dir is not None:  # the run is named by its directory (its config.yaml says so)
            path = Path(os.path.abspath(run_dir))
            try:
                name = folder_name(path.name)
            except ValueError as e:
                raise ConfigError(f"run_dir={str(run_dir)!r}: its last part {e}") from None
            cfg = cfg.model_copy(update={"name": name, "run_dir": str(path.parent)})
        _check_describes(cfg, engine)
        check_state_layout(state, engine.state_shape, "engine.run")
        check_jax_settings()  # (one turned on since the build, in a notebook)
        check_same_config(cfg.model_dump(mode="json"))  # (a multi-process job's processes)
        compiled_before = engine.compile_seconds
        first = int(to_host(state.counters.epoch))
        total = epochs_asked(num_epochs, first, engine.num_epochs, "engine.run")
        # Owned from here (lock, no symlinks); nothing in it changes before the hooks' checks.
        # In a multi-process run, process 0 writes it; the others read it and join the saves.
        primary = is_primary()
        # A run that already ended where this call would end it is answered before its
        # directory is taken (nothing is written: a read-only copy of it works too).
        where = Path(cfg.run_dir) / cfg.name
        if (where.parent / SPEC_FILE).is_file():  # e.g. a sweep member's config.yaml trained
            raise RunDirError(
                f"run directory {str(where)!r} is inside the sweep {str(where.parent)!r} (it "
                f"holds {SPEC_FILE}), whose members are its own: train this config elsewhere, "
                f"e.g. with run_dir=runs (or continue the sweep: jaxrl-engine sweep --resume "
                f"{where.parent})"
            )
        if where.is_dir() and not where.is_symlink():  # (RunDir refuses a symlinked one)
            check_no_symlinks(where)
            check_run_entries(where)
        finished = self._finished(where, first, total, engine.num_epochs)
        if finished is not None:
            return state, {**finished, "records": []}
        out = RunDir(where, cfg, writer=primary)
        show = (cfg.progress if progress is None else progress) and primary
        hooks = default_host_hooks(cfg, show, on_epoch, self.host_hooks)
        run = RunInfo(engine=engine, cfg=cfg, out=out, first=first, total=total, done=first)
        run.wall_start = called if started_at is None else min(started_at, called)
        run.startup_s = called - run.wall_start
        run.resume_from = self.resume_from
        history: list[Record] = []
        started: list[HostHook] = []
        failed, training, ending = True, False, False
        try:
            for hook in hooks:
                hook.start(run)
                started.append(hook)
            needed = (
                [*EPOCH_PHASES, "evaluate"]
                if cfg.profile
                else overlap_phases(engine, self.actor_device)
                if self.overlap
                else ["epochs", "evaluate"]
            )
            missing = [name for name in needed if not engine.compiled(name)]
            if missing and run.done < total:  # (a run killed after its last epoch: none)

                def compiling(name: str, index: int, count: int) -> None:
                    for hook in hooks:
                        hook.on_compile(run, name, index, count)

                state = engine.warm_up(state, phases=missing, on_compile=compiling)
            run.compile_s = engine.compile_seconds - compiled_before  # (this call's only)
            raise_if_stopped()  # Ctrl-C during start-up (the CLI's handler): stop before training
            run.train_start = time.perf_counter()
            run.setup_s = max(0.0, run.train_start - called - run.compile_s)
            training = True
            failure = None
            with stop_on_signals(checkpoints=cfg.save_interval > 0) as stop:
                while run.done < total:
                    state, chunk, failure = self._chunk(engine, state, run, hooks, stop)
                    if records:
                        history.extend(chunk)
                    for hook in hooks:
                        hook.on_records(run, chunk)
                    if failure is not None:
                        self._fail(run, state, hooks, *failure)
                    for hook in hooks:
                        hook.after_chunk(run, state)
                    signame = stop.agreed() if run.done < total else None
                    if signame is not None:
                        run.train_end = time.perf_counter()
                        self._end(run, state, hooks, "interrupted", signal=signame)
                        raise TrainingInterrupted(
                            signame, run.done, state, run.checkpoint, run.summary
                        )
                # A signal from here on lets the end of the run (checkpoint, summary, export)
                # finish: the run is complete (or paused where `num_epochs` asked to stop early).
                run.train_end = time.perf_counter()
                ending = stop.ending = True
                self._end(run, state, hooks, end_status(run.done, engine.num_epochs))
            failed = False
        except TrainingInterrupted:
            raise
        except KeyboardInterrupt as e:  # raised by a hook (e.g. `on_epoch`), not a signal
            if not training or run.status != "running":
                raise  # (before training: a signal, raised by the CLI's `raise_if_stopped`)
            if failure is not None:  # the chunk's nan_guard fired: that is what stopped it
                self._fail(run, state, hooks, *failure)
            # Raised inside a compiled call's chunk (its input donated), or in one process of
            # several (the others are in their next collective: a checkpoint would wait): a
            # failure, as any other error of a hook.
            if not _alive(state) or jax.process_count() > 1:
                _summary_of_failure(run, state, hooks, e)
                raise
            # The state after the last whole chunk: stopped as a signal stops it.
            run.done = int(to_host(state.counters.epoch))
            run.train_end = time.perf_counter()
            self._end(run, state, hooks, "interrupted", signal="KeyboardInterrupt")
            raise TrainingInterrupted(
                "KeyboardInterrupt", run.done, state, run.checkpoint, run.summary
            ) from e
        except Exception as e:
            # Once training started (a refusal before it, e.g. of a finished run's resume,
            # changes nothing); not after a NaN stop, whose summary is written.
            if training and (run.status == "running" or ending):  # (ending: e.g. a full
                # disk exporting the policy after the summary said "completed")
                _summary_of_failure(run, state, hooks, e)
            raise
        finally:
            self._close(run, started, raise_errors=not failed)
        return state, {**run.summary, "records": history}

    @staticmethod
    def _finished(run: Path, first: int, total: int, num_epochs: int) -> dict[str, Any] | None:
        """The summary of a run that already ended at this state's epoch as this call would
        end it (completed, or paused before the engine's `num_epochs`): resuming it changes
        nothing (its summary is returned as it is)."""
        summary = read_summary(run)
        status = end_status(first, num_epochs)
        if (
            first >= total
            and summary is not None
            and summary.get("status") == status
            and summary.get("epochs") == first
        ):
            advice = (
                "raise total_env_steps to train on"
                if status == "completed"
                else f"run it without num_epochs to train on to epoch {num_epochs}"
            )
            print(
                f"jaxrl-engine: {run} is {'finished' if status == 'completed' else 'paused'} "
                f"(epoch {first} "
                + (f"of {total}" if first == total else f"of {first}, past the {total} asked for")
                + f"); its summary is unchanged ({advice})",
                file=sys.stderr,
            )
            return summary
        return None

    @staticmethod
    def _close(run: RunInfo, started: list[HostHook], raise_errors: bool) -> None:
        """Close the started hooks (last first), then give the run directory up. An OS error
        while closing (e.g. a full disk flushing a log) is raised after all are closed, unless
        the run is already failing with another error."""
        errors: list[OSError] = []
        for hook in reversed(started):
            try:
                hook.close(run)
            except OSError as e:
                errors.append(e)
        run.out.release()
        if errors and raise_errors:
            raise errors[0]

    def _chunk(
        self,
        engine: Engine,
        state: EngineState,
        run: RunInfo,
        hooks: list[HostHook],
        stop: StopSignal | None = None,
    ) -> tuple[EngineState, list[Record], tuple[NonFiniteError, Metrics] | None]:
        """The epochs up to the next boundary as one compiled call (one per phase with
        `profile`), then the evaluation when one is due. Returns the state, the records of the
        epochs that passed `nan_guard`, and the guard's error with the failing epoch's metrics
        (the compiled loop stops after that epoch: the state is its state)."""
        cfg, start_epoch, total = self.cfg, run.done, run.total
        began = time.perf_counter()
        # (profile: one epoch, each phase its own timed call)
        n = 1 if cfg.profile else _chunk_length(engine, hooks, start_epoch, total)
        if stop is not None:  # (a signal during the run's last call: it completes)
            stop.last = start_epoch + n >= total
        if cfg.profile:
            metrics: dict[str, Any] = {}
            for name in EPOCH_PHASES:
                with _host_errors(engine):
                    state, m = engine.timed_call(name, state)
                merge_metrics(metrics, m, name)
            state = jax.device_put(state, engine.state_sharding)
            rows = [metrics]
        else:
            with _host_errors(engine):
                if self.overlap:
                    state, rows = overlapped_epochs(engine, state, n, self.actor_device)
                    jax.block_until_ready(state)
                else:
                    state, table, ran = jax.block_until_ready(engine.call("epochs", state, n))
                    table = to_host(table)
                    rows = [{k: v[i] for k, v in table.items()} for i in range(int(ran))]
            engine.timer.record("epoch", time.perf_counter() - began, count=len(rows))
        done = start_epoch + len(rows)
        _check_epoch_counter(state, start_epoch, done)
        if len(rows) == n and (done % engine.eval_interval == 0 or done == total):
            with _host_errors(engine):
                state, eval_metrics = engine.timed_call("evaluate", state)
                state = placed_as(state, engine.state_sharding)
            rows[-1] = {**rows[-1], **to_host(eval_metrics)}
        # An epoch's wall_s: the epochs of one compiled call run back to back, so each gets an
        # equal share of the call (the last one also its evaluation), not the call's end time.
        start_s = run.wall_offset + began - run.wall_start
        call_s = time.perf_counter() - began
        records: list[Record] = []
        for i, metrics in enumerate(rows):
            wall_s = start_s + call_s * (i + 1) / len(rows)
            epoch = start_epoch + i + 1
            try:
                check_guards(metrics, engine.guarded_names, epoch)
            except NonFiniteError as e:
                run.done = epoch - 1  # the failing epoch does not count
                return state, records, (e, metrics)
            records.append(
                {
                    "epoch": epoch,
                    "env_steps": epoch * engine.steps_per_epoch,
                    "wall_s": wall_s,
                    **{
                        k: float(np.asarray(v))
                        for k, v in metrics.items()
                        if not k.startswith("guard/")
                    },
                }
            )
        run.done = done
        return state, records, None

    def _fail(
        self,
        run: RunInfo,
        state: EngineState,
        hooks: list[HostHook],
        error: NonFiniteError,
        metrics: Metrics,
    ) -> None:
        """Write the failing batch and the summary, keep the checkpoints, raise `error`."""
        batch = write_failing_batch(run.out, state, metrics, error.epoch)
        self._end(
            run, state, hooks, "non_finite", error=str(error), failing_batch=str(batch.absolute())
        )
        error.summary = run.summary
        checkpoint = run.summary["checkpoint"]
        error.add_note(
            f"failing batch: {batch}; "
            + (
                f"last good checkpoint: {checkpoint} (left as it was)"
                if checkpoint is not None
                else "no checkpoint was written before it"
            )
        )
        torch_policy = getattr(run.cfg.algo, "torch_policy", None)
        if getattr(torch_policy, "acting_dtype", None) == "float16":
            error.add_note(
                "the actor acts in float16 (algo.torch_policy.acting_dtype=float16), whose "
                "largest value is 65504: an observation or activation beyond it acts as inf, "
                "and the losses of its actions are NaN; bfloat16 keeps float32's range"
            )
        raise error

    @staticmethod
    def _end(
        run: RunInfo, state: EngineState, hooks: list[HostHook], status: str, **extra: Any
    ) -> None:
        run.status = status
        run.extra.update(extra)
        for hook in hooks:
            hook.end(run, state)
