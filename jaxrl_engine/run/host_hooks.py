"""Host hooks: the driver's work around each compiled call, one idea per hook.

Traced hooks transform a phase inside jit (`core.hooks`); host hooks run in Python around the
compiled calls, in the order they are listed (`Driver(cfg, host_hooks=[...])` puts the
user's after checkpoints, logging and progress, before the summary and the policy export). Each method is optional:

    start(run)              before the first call (open files, check the run directory)
    on_compile(run, name, i, n)  before the i-th of the n compilations the run needs
    next_boundary(epoch)    an epoch after which the driver must stop a chunk (e.g. a save)
    on_records(run, rows)   the per-epoch records of a chunk, in order (logging)
    after_chunk(run, state) the state after a chunk's last epoch (checkpoint, progress)
    end(run, state)         once, when the run ends (`run.status`: completed, paused,
                            interrupted, non_finite); the summary and the policy export
                            (completed, paused) are written here
    close(run)              always, last (close files), in reverse order

A hook reads and writes only `RunInfo` and its own fields; it never reaches into another hook.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from jaxrl_engine.core.engine import Engine
from jaxrl_engine.core.sharding import to_host
from jaxrl_engine.core.state import EngineState
from jaxrl_engine.export.policy import ARTEFACT_FILES, POLICY_DIR, ExportError, export_policy
from jaxrl_engine.io.checkpoint import Checkpointer, CheckpointError
from jaxrl_engine.io.config import Config
from jaxrl_engine.run.run_dir import RunDir

Record = dict[str, float]


@dataclasses.dataclass
class RunInfo:
    """What the driver and its host hooks share during one `run` call."""

    engine: Engine
    cfg: Config
    out: RunDir
    first: int  # the state's epoch when the run started
    total: int  # the epoch the run ends at
    done: int = 0  # finished epochs
    status: str = "running"
    final_eval: float = float("nan")
    final_eval_std: float = float("nan")  # over the last evaluation's episodes
    final_eval_iqm: float = float("nan")
    final_eval_epoch: int | None = None  # the epoch of that evaluation (None: none yet)
    checkpoint: Path | None = None  # the latest committed checkpoint
    checkpoint_epoch: int = -1
    compile_s: float = 0.0  # compiling in this run call
    startup_s: float = 0.0  # from wall_start to the run call (the CLI's imports, build, init)
    # In the run call before the first epoch, less compiling: the run directory, the loggers,
    # what warm-up runs (an off-policy replay buffer's prefill)
    setup_s: float = 0.0
    wall_start: float = dataclasses.field(default_factory=time.perf_counter)
    train_start: float = dataclasses.field(default_factory=time.perf_counter)
    train_end: float | None = None  # after the last epoch (None while training)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)  # e.g. the error
    summary: dict[str, Any] = dataclasses.field(default_factory=dict)
    resume_from: int | None = None  # the checkpoint epoch the user chose (`--from-checkpoint`)
    # The checkpoint at `first`'s record of metrics.jsonl (`CheckpointInfo.metrics_log`), or
    # an older checkpoint's copy of its records
    restored_mark: dict[str, Any] | None = None
    restored_metrics: list[str] | None = None
    # The records' wall_s counts on from a resumed run's last record: wall time over the
    # run's whole life, so its curves never run backwards in time
    wall_offset: float = 0.0

    @property
    def steps_per_second(self) -> float | None:
        """Env steps per second of this call's training (None when it trained no epoch)."""
        if self.done == self.first:
            return None
        return (self.done - self.first) * self.engine.steps_per_epoch / max(self.train_s, 1e-9)

    @property
    def train_s(self) -> float:
        """Seconds of training: from the first epoch to the end of the last (or to now)."""
        end = time.perf_counter() if self.train_end is None else self.train_end
        return end - self.train_start

    def times_to(self, now: float) -> dict[str, float]:
        """The summary's times that run to `now`: this call's `wall_s` and `end_s`, and
        `run_wall_s`, the run's whole life over every process that trained it (as
        metrics.jsonl's wall_s counts on)."""
        return {
            "wall_s": now - self.wall_start,
            "end_s": 0.0 if self.train_end is None else now - self.train_end,
            "run_wall_s": self.wall_offset + now - self.wall_start,
        }

    def make_summary(self) -> dict[str, Any]:
        now = time.perf_counter()
        return {
            "name": self.cfg.name,
            "status": self.status,
            # the engine's: a user's algorithm given to jre.build (config.yaml says algo.name)
            "algorithm": getattr(self.engine.algo, "name", None),
            "final_eval_return": self.final_eval,
            "final_eval_return_std": self.final_eval_std,
            "final_eval_return_iqm": self.final_eval_iqm,
            # the epoch it was evaluated after: the last epoch's once a run completes, an
            # earlier one for a run that stopped (interrupted, failed) between evaluations
            "final_eval_epoch": self.final_eval_epoch,
            # what final_eval_return is: the mean over this many episodes, greedy or sampled
            "eval_episodes": self.engine.eval_episodes,
            "eval_policy": "deterministic" if self.engine.eval_deterministic else "stochastic",
            "epochs": self.done,
            "env_steps": self.done * self.engine.steps_per_epoch,
            "requested_env_steps": self.cfg.total_env_steps,
            # wall_s = startup_s + setup_s + compile_s + train_s + end_s (Driver.run says
            # what each is)
            **self.times_to(now),
            "startup_s": self.startup_s,
            "setup_s": self.setup_s,
            "compile_s": self.compile_s,
            "train_s": self.train_s,
            # this call's: env steps it trained / train_s (null when it trained none)
            "steps_per_second": self.steps_per_second,
            "trained_env_steps": (self.done - self.first) * self.engine.steps_per_epoch,
            # Both absolute, whatever run_dir was given as.
            "run_dir": str(self.out.path.absolute()),
            "checkpoint": None if self.checkpoint is None else str(self.checkpoint.absolute()),
            **self.extra,
        }


def _what_trained(config: dict[str, Any], algorithm: str | None = None) -> tuple[str, str]:
    """(algorithm, env id) of a resolved config (as stored: data, any shape); `algorithm`, the
    engine's algorithm name where known, before the config's."""
    algo, env = config.get("algo"), config.get("env")
    name = algorithm or (algo.get("name") if isinstance(algo, dict) else None)
    env_id = env.get("id") if isinstance(env, dict) else None
    return str(name), str(env_id)


class HostHook:
    """Base class: every method a no-op (see the module docstring)."""

    def start(self, run: RunInfo) -> None:
        """Before anything is compiled or trained, in list order; raising stops the run (only
        the hooks started before it are closed)."""

    def on_compile(self, run: RunInfo, name: str, index: int, count: int) -> None:
        """Before the `index`-th (from 1) of the `count` compilations the run needs, of `name`
        (a phase, "epochs" or "learn"); not called when all the run needs is compiled."""

    def next_boundary(self, epoch: int) -> int | None:
        """An epoch after which the chunk that starts at `epoch` must stop, or None (no need);
        the chunk stops at the nearest of every hook's, the next evaluation and the run's end
        (and after `run.engine.epochs_per_call` epochs at most)."""
        return None

    def on_records(self, run: RunInfo, records: list[Record]) -> None:
        """After each chunk: one record per epoch that passed the NaN guard, in order
        (`epoch`, `env_steps`, `wall_s` and the epoch's metrics, an evaluation's included)."""

    def after_chunk(self, run: RunInfo, state: EngineState) -> None:
        """After each chunk's `on_records`, with the state after its last epoch (`run.done`
        epochs finished); not after a chunk the NaN guard stopped."""

    def end(self, run: RunInfo, state: EngineState) -> None:
        """Once, with the final state, when the run ends with `run.status` completed, paused,
        interrupted or non_finite (not when an error stops it: then only the summary is
        written)."""

    def close(self, run: RunInfo) -> None:
        """Always, last, for every hook whose `start` returned, in reverse list order (also
        after an error); an OSError is raised once all are closed."""


def evaluation_of(record: Record) -> tuple[float, float, float]:
    """A summary's final evaluation from an evaluation record: the mean, std and IQM of its
    episode returns (NaN for what it lacks)."""

    def number(key: str) -> float:
        value = record.get(key)
        return float(value) if isinstance(value, int | float) else float("nan")

    keys = ("evaluate/episode_return", "evaluate/episode_return_std", "evaluate/episode_return_iqm")
    mean, std, iqm = (number(k) for k in keys)
    return mean, std, iqm


def _take_evaluation(run: RunInfo, record: Record) -> None:
    run.final_eval, run.final_eval_std, run.final_eval_iqm = evaluation_of(record)
    run.final_eval_epoch = int(record["epoch"])


class Logging(HostHook):
    """config.yaml, then metrics.jsonl (and the `loggers` backends) record by record; on a
    fresh state the old records go, on a resumed one those after its epoch (written after its
    checkpoint) go: the file is cut back to its length at the checkpoint (see `RunDir.open_logs`)."""

    failed_write: OSError | None = None

    def start(self, run: RunInfo) -> None:
        last, last_eval = run.out.open_logs(run.first, run.restored_metrics, run.restored_mark)
        if isinstance(last, dict):
            last_wall = last.get("wall_s")
            if isinstance(last_wall, int | float) and math.isfinite(last_wall):
                run.wall_offset = float(last_wall)
            # The call that ended at this checkpoint's epoch with a summary also spent its
            # end (final checkpoint, export) after its last record: its summary counted it.
            previous = run.out.read_summary() or {}
            ended = previous.get("run_wall_s")
            if (
                previous.get("epochs") == run.first
                and isinstance(ended, int | float)
                and math.isfinite(ended)
                and ended >= run.wall_offset
            ):
                run.wall_offset = float(ended)
        if isinstance(last_eval, dict):  # a resumed run's last evaluation so far
            _take_evaluation(run, last_eval)

    def on_records(self, run: RunInfo, records: list[Record]) -> None:
        for record in records:
            if "evaluate/episode_return" in record:
                _take_evaluation(run, record)
            run.out.log(record)

    def end(self, run: RunInfo, state: EngineState) -> None:
        # The epochs `log_interval` held, before the summary; a write that fails (a full
        # disk) is raised from `close`, after the summary and the other hooks' ends.
        try:
            run.out.flush_logs()
        except OSError as e:
            self.failed_write = e

    def close(self, run: RunInfo) -> None:
        run.out.close_logs()
        failed, self.failed_write = self.failed_write, None
        if failed is not None:
            raise failed


class Checkpointing(HostHook):
    """A full-state checkpoint every `save_interval` epochs, after the last, and on interrupt.

    At start, checks the run directory's checkpoints fit the state: a fresh state (epoch 0)
    over a finished run starts it over (its checkpoints are deleted); over an unfinished run it
    is refused, as is a state older than the directory's checkpoints.
    """

    def __init__(self, save_interval: int, keep: int):
        self.save_interval, self.keep = save_interval, keep
        self.checkpoints: Checkpointer | None = None

    def start(self, run: RunInfo) -> None:
        out, first = run.out, run.first
        directory = out.path / "checkpoints"
        if self.save_interval == 0 and not directory.is_dir():
            return
        checkpoints = Checkpointer(directory, keep=self.keep)
        try:
            latest = checkpoints.latest()
            if latest is not None and first == 0:
                info = checkpoints.info(latest)
                if latest < info.num_epochs:
                    raise CheckpointError(
                        f"{str(out.path)!r} holds an unfinished run (checkpoint of epoch {latest} "
                        f"of {info.num_epochs}): continue it with `jaxrl-engine train --resume "
                        f"{out.path}` (in Python: `jre.resume(path)`), or delete the directory "
                        "(or choose another name=) to start over"
                    )
                # (the engines' algorithm names: a user's algorithm has the config's algo.name;
                # checkpoints older than that record name only the config's)
                ours = getattr(run.engine.algo, "name", None) if info.algorithm else None
                was = _what_trained(info.config, info.algorithm)
                now = _what_trained(run.cfg.model_dump(mode="json"), ours)
                if was != now:  # (another algorithm or env: not this run's earlier version)
                    raise CheckpointError(
                        f"{str(out.path)!r} holds a finished run of {was[0]} on {was[1]}; this "
                        f"one is {now[0]} on {now[1]}: choose another name= (or delete the "
                        "directory to replace that run)"
                    )
                print(
                    f"jaxrl-engine: {out.path} held a finished run; starting it over (its metrics "
                    "and checkpoints are replaced)",
                    file=sys.stderr,
                )
                checkpoints.delete_all()
            elif latest is not None and latest > first and run.resume_from == first:
                moved = out.discard_checkpoints_after(checkpoints, first)
                print(
                    f"jaxrl-engine: continuing from the checkpoint of epoch {first}; the later "
                    f"checkpoints are set aside, not deleted: {', '.join(map(str, moved))}",
                    file=sys.stderr,
                )
            elif latest is not None and latest > first:
                raise CheckpointError(
                    f"{str(out.path)!r} has checkpoints up to epoch {latest}, after this state's "
                    f"epoch {first}: continue from the latest with `jre.resume(path)`, or use "
                    "another run directory"
                )
            if first > 0 and first in checkpoints.epochs():
                info = checkpoints.info(first)
                run.restored_mark, run.restored_metrics = info.metrics_log, info.metrics_lines
        except BaseException:
            checkpoints.close()
            raise
        if self.save_interval == 0:
            checkpoints.close()
            return
        self.checkpoints = checkpoints
        run.checkpoint_epoch = first
        if first > 0 and first in checkpoints.epochs():
            run.checkpoint = checkpoints.path_of(first)

    def next_boundary(self, epoch: int) -> int | None:
        if not self.save_interval:
            return None
        return (epoch // self.save_interval + 1) * self.save_interval

    def save(self, run: RunInfo, state: EngineState) -> None:
        if self.checkpoints is None:
            return
        run.checkpoint = self.checkpoints.save(
            state,
            config=run.cfg.model_dump(mode="json"),
            metrics_log=run.out.metrics_mark(),
            num_epochs=run.engine.num_epochs,
            algorithm=run.engine.algo.name,
            user_parts=getattr(run.engine, "user_parts", None),
        )
        run.checkpoint_epoch = run.done

    def after_chunk(self, run: RunInfo, state: EngineState) -> None:
        if self.save_interval and (run.done % self.save_interval == 0 or run.done == run.total):
            self.save(run, state)

    def end(self, run: RunInfo, state: EngineState) -> None:
        if run.status == "interrupted" and run.checkpoint_epoch != run.done:
            self.save(run, state)
        if self.checkpoints is not None:
            self.checkpoints.wait()  # the summary names the latest committed checkpoint
            latest = self.checkpoints.latest()
            run.checkpoint = None if latest is None else self.checkpoints.path_of(latest)

    def close(self, run: RunInfo) -> None:
        if self.checkpoints is not None:
            self.checkpoints.close()  # waits for a save in flight


class OnEpoch(HostHook):
    """Calls `fn(record)` for each epoch's record, after that chunk's checkpoint."""

    def __init__(self, fn: Callable[[Record], None]):
        self.fn = fn
        self.pending: list[Record] = []

    def on_records(self, run: RunInfo, records: list[Record]) -> None:
        self.pending.extend(records)

    def after_chunk(self, run: RunInfo, state: EngineState) -> None:
        pending, self.pending = self.pending, []
        for record in pending:
            self.fn(record)


def eval_text(value: float) -> str:
    """The last evaluation's return on a progress line; "-" before the first."""
    return "-" if math.isnan(value) else f"{value:.1f}"


class ProgressBar(HostHook):
    """Progress on stderr (stdout keeps the summary): on a terminal (or in a notebook) a rich
    bar (epochs, env steps/s, last evaluation return) whose description says what is
    compiling before it moves; otherwise plain lines: one per compilation, then one per chunk
    at most every `PLAIN_EVERY_S` seconds (and the last)."""

    PLAIN_EVERY_S = 10.0

    def __init__(self, enabled: bool = True):
        console = Console(stderr=True)  # a terminal, or a notebook: rich draws the bar there
        self.enabled, self.tty = enabled, console.is_terminal or console.is_jupyter
        self.bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]} steps/s"),
            TextColumn("eval {task.fields[eval]}"),
            TimeElapsedColumn(),
            console=console,
            disable=not (enabled and self.tty),
        )
        self.task: Any = None
        self.last_line = -math.inf

    def _plain(self, text: str) -> None:
        if self.enabled and not self.tty:
            print(f"jaxrl-engine: {text}", file=sys.stderr, flush=True)

    def start(self, run: RunInfo) -> None:
        self.bar.start()
        self.task = self.bar.add_task(
            run.cfg.name, total=run.total, completed=run.first, rate="-", eval="-"
        )

    def on_compile(self, run: RunInfo, name: str, index: int, count: int) -> None:
        status = f"compiling {name} ({index}/{count})"
        self.bar.update(self.task, description=f"{run.cfg.name}: {status}")
        self._plain(f"{run.cfg.name}: {status}")

    def after_chunk(self, run: RunInfo, state: EngineState) -> None:
        rate = run.steps_per_second
        self.bar.update(
            self.task,
            description=run.cfg.name,
            completed=run.done,
            rate="-" if rate is None else f"{rate:,.0f}",
            eval=eval_text(run.final_eval),
        )
        now = time.perf_counter()
        if now - self.last_line >= self.PLAIN_EVERY_S or run.done >= run.total:
            self.last_line = now
            self._plain(
                f"{run.cfg.name}: epoch {run.done}/{run.total}, "
                + ("-" if rate is None else f"{rate:,.0f}")
                + f" env steps/s, eval {eval_text(run.final_eval)}"
            )

    def close(self, run: RunInfo) -> None:
        self.bar.stop()


class Summary(HostHook):
    """summary.json (atomically rewritten) when the run ends, whatever its status.

    A resumed run that trains no further epoch (killed after its last checkpoint, before its
    summary) keeps the results of the summary before it where it has none of its own: a result
    is never replaced by null (this call's own times and rate are this call's, null or not)."""

    THIS_CALLS = frozenset(
        {"wall_s", "startup_s", "setup_s", "compile_s", "train_s", "end_s", "run_wall_s"}
        | {"steps_per_second", "trained_env_steps"}
    )

    def end(self, run: RunInfo, state: EngineState) -> None:
        summary = run.make_summary()
        previous = run.out.read_summary() if run.first > 0 else None
        for key, value in (previous or {}).items():
            missing = (
                key in summary
                and key not in self.THIS_CALLS
                and (
                    summary[key] is None
                    or (isinstance(summary[key], float) and math.isnan(summary[key]))
                )
            )
            if missing and isinstance(value, int | float) and not isinstance(value, bool):
                summary[key] = value
        run.summary = summary
        run.out.write_summary(summary)


class ExportPolicy(HostHook):
    """`<run dir>/policy/` after a run that ended normally (completed, or paused by a smaller
    `num_epochs`): what `jaxrl-engine eval` and `export` read.

    A policy jax.export cannot serialize (one acting through a host callback) is reported with
    a warning, not an error: training is done. A resume removes the `policy/` of the state it
    resumed from once it has trained an epoch past it (after that chunk): that policy is no
    longer the run's (an interrupted resume then has none, as an interrupted run; `export
    --checkpoint` writes one). A resume that fails before training keeps it.
    """

    def after_chunk(self, run: RunInfo, state: EngineState) -> None:
        self.remove_stale(run)

    @staticmethod
    def remove_stale(run: RunInfo) -> None:
        """The `policy/` of the state a resume started from, once it trained past it."""
        if 0 < run.first < run.done and run.out.writer:
            for name in ARTEFACT_FILES:
                (run.out.path / POLICY_DIR / name).unlink(missing_ok=True)

    def end(self, run: RunInfo, state: EngineState) -> None:
        if run.status not in ("completed", "paused"):
            self.remove_stale(run)  # (a hook before this one may have failed its chunk)
            return
        params = to_host(state.eval_params)  # (every process: a gather is collective)
        if not run.out.writer:
            return
        where = run.out.path / POLICY_DIR
        try:
            export_policy(run.engine, params, where)
        except ExportError as e:
            warnings.warn(f"policy not exported: {e}", stacklevel=2)
        except OSError as e:  # (a full disk): no half-written policy is left to be read
            for name in ARTEFACT_FILES:
                with contextlib.suppress(OSError):
                    (where / name).unlink(missing_ok=True)
            raise OSError(e.errno, f"{e.strerror} (exporting the policy)", str(where)) from None
        if run.summary and run.train_end is not None:  # the summary's times include the export
            run.summary.update(run.times_to(time.perf_counter()))
            run.out.write_summary(run.summary)


def default_host_hooks(
    cfg: Config,
    progress: bool,
    on_epoch: Callable[[Record], None] | None = None,
    user: Sequence[HostHook] = (),
) -> list[HostHook]:
    """The driver's hooks, in order: checkpoints (first: they check the run directory before
    anything in it changes), logging, `on_epoch`, progress, the user's, then the summary and
    the policy export (which see what the others left)."""
    hooks: list[HostHook] = [Checkpointing(cfg.save_interval, cfg.keep_checkpoints), Logging()]
    if on_epoch is not None:
        hooks.append(OnEpoch(on_epoch))
    return [*hooks, ProgressBar(progress), *user, Summary(), ExportPolicy()]
