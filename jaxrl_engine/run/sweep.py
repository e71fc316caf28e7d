"""The sweep driver: every member of a static group trained by one compiled chunk at a time.

Like the train driver (`run.driver`), the epochs up to the next evaluation or checkpoint run as
one compiled call, here `SweepPrograms.epochs` (the engine's chunk vmapped over the members);
each member's records go to its own run directory `<sweep>/<member>/` (`config.yaml`,
`metrics.jsonl` in a train's format, `summary.json`, `policy/`), so every tool that reads a run
reads a member. The sweep directory holds `sweep.json` (what to train: base config, seeds,
grid), `checkpoints/group<g>/` (each group's batched state, with the orbax `Checkpointer`),
`sweep.csv` (one row per member) and `summary.json`.

A member whose `nan_guard` fires stops there (its summary says non_finite, its records end
before that epoch, no policy is exported) while the others train on: its lane of the batch
still runs, and is ignored. SIGINT/SIGTERM stop after the current chunk with a checkpoint
(`TrainingInterrupted`); `resume` continues every group from its latest checkpoint, exactly.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import json
import math
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from jaxrl_engine.core.nan_guard import NonFiniteError, check_guards
from jaxrl_engine.core.sharding import is_primary, to_host
from jaxrl_engine.core.state import EngineState
from jaxrl_engine.distributed.sweep import Member, SweepPrograms
from jaxrl_engine.export.policy import POLICY_DIR, ExportError, export_acting, export_policy
from jaxrl_engine.io.checkpoint import Checkpointer, CheckpointError
from jaxrl_engine.io.config import Config
from jaxrl_engine.io.files import SPEC_FILE, RunDirError, atomic_write, strict_json
from jaxrl_engine.io.plot import sweep_members
from jaxrl_engine.run.driver import TrainingInterrupted
from jaxrl_engine.run.host_hooks import eval_text, evaluation_of
from jaxrl_engine.run.run_dir import (
    LOCK_FILE,
    RunDir,
    RunLock,
    clear_run_files,
    end_status,
    epochs_asked,
    read_metrics_lines,
)
from jaxrl_engine.run.signals import StopSignal, raise_if_stopped, stop_on_signals

# A member's final evaluation return counts in its setting's statistics unless nan_guard
# stopped it (an interrupted or paused sweep's table is its state so far).
RESULT_STATUSES = ("completed", "paused", "interrupted")
CSV_FILE = "sweep.csv"


@dataclasses.dataclass
class Group:
    """One compiled program's members and their batched functions."""

    label: str  # group<g>: its checkpoints are checkpoints/<label>/
    members: list[Member]
    programs: SweepPrograms


@dataclasses.dataclass
class MemberRun:
    """What the driver keeps per member while its group trains."""

    member: Member
    out: RunDir
    final_eval: float = float("nan")
    final_eval_std: float = float("nan")
    final_eval_iqm: float = float("nan")
    final_eval_epoch: int | None = None
    epochs: int = 0
    status: str = "running"
    error: str | None = None
    wall_offset: float = 0.0  # a resumed member's last record's wall_s: its time counts on

    def open(self, first: int, error: str | None) -> None:
        """config.yaml, and metrics.jsonl put back to its records through epoch `first`
        (`error`: why nan_guard stopped it before, when it did)."""
        last, last_eval = self.out.open_logs(first)
        self.epochs = int(last["epoch"]) if last else 0
        wall = last.get("wall_s") if last else None
        if isinstance(wall, int | float) and math.isfinite(wall):
            self.wall_offset = float(wall)
        if last_eval is not None and isinstance(
            last_eval.get("evaluate/episode_return"), int | float
        ):
            self._take_evaluation(last_eval)
        if error is not None:
            self.status, self.error = "non_finite", error

    def log(self, record: dict[str, Any]) -> None:
        self.out.log(record)
        self.epochs = int(record["epoch"])
        if "evaluate/episode_return" in record:
            self._take_evaluation(record)

    def _take_evaluation(self, record: dict[str, Any]) -> None:
        """The summary's final evaluation, as a train's: mean, std and IQM over episodes."""
        self.final_eval, self.final_eval_std, self.final_eval_iqm = evaluation_of(record)
        self.final_eval_epoch = int(record["epoch"])


def _remove_if_empty(path: Path) -> None:
    """A previous sweep's member folder, once its files are cleared: gone if nothing of the
    user's is left in it (its lock file is the sweep's: the sweep's own lock is held)."""
    (path / LOCK_FILE).unlink(missing_ok=True)
    for folder in (path / POLICY_DIR, path):
        with contextlib.suppress(OSError):  # (not empty, or already gone)
            folder.rmdir()


def iqm(values: Sequence[float]) -> float:
    """Interquartile mean (rliable's): the mean of the middle 50% of the values, i.e. with
    `int(n / 4)` dropped from each end (as `scipy.stats.trim_mean(values, 0.25)`)."""
    ordered = sorted(values)
    cut = len(ordered) // 4
    middle = ordered[cut : len(ordered) - cut]
    return float(np.mean(middle)) if middle else float("nan")


class SweepProgress:
    """A rich bar on a terminal, one plain line per chunk otherwise (stderr, so stdout keeps
    the table and the JSON summary)."""

    def __init__(self, enabled: bool):
        self.enabled, self.tty = enabled, sys.stderr.isatty()
        self.bar: Progress | None = None
        self.task: Any = None

    def start(self, label: str, members: int, first: int, total: int) -> None:
        self.label, self.members, self.total = label, members, total
        if not (self.enabled and self.tty):
            return
        self.bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]} env steps/s"),
            TextColumn("eval {task.fields[eval]}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
        )
        self.bar.start()
        description = f"{label} ({members} members)"
        self.task = self.bar.add_task(description, total=total, completed=first, rate="-", eval="-")

    def update(self, done: int, rate: float, mean_eval: float) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(
                self.task, completed=done, rate=f"{rate:,.0f}", eval=eval_text(mean_eval)
            )
            return
        print(
            f"jaxrl-engine sweep: {self.label}, {self.members} members: epoch {done}/"
            f"{self.total}, {rate:,.0f} env steps/s (all members), mean eval {eval_text(mean_eval)}",
            file=sys.stderr,
            flush=True,
        )

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


class SweepDriver:
    """Trains a sweep's groups one after the other into `<cfg.run_dir>/<cfg.name>/`.

    cfg: the base config (name, run_dir, intervals, progress). spec: what `sweep.json` holds
    (base config, seeds, grid, split_static): what `resume` continues.
    """

    def __init__(self, cfg: Config, spec: dict[str, Any], groups: list[Group]):
        self.cfg, self.spec, self.groups = cfg, spec, groups
        self.root = Path(cfg.run_dir) / cfg.name
        self.compile_s = self.train_s = 0.0
        self.steps_trained = 0  # env steps trained by this call, all members
        self.wall_start = time.perf_counter()
        self.primary = is_primary()

    def run(
        self, *, num_epochs: int | None = None, progress: bool | None = None, resume: bool = False
    ) -> dict[str, Any]:
        """Train every member up to `num_epochs` epochs in total (default: its config's);
        returns the sweep summary (`summary.json`) plus `table`, the per-setting table.

        resume: continue each group from its latest checkpoint (a group without one starts
        fresh). Without it, a sweep directory holding an unfinished sweep is refused
        (`CheckpointError`, before anything in it changes) and a finished one is started over.
        Raises `TrainingInterrupted` after SIGINT/SIGTERM (checkpoint and summaries written).
        """
        self.wall_start = time.perf_counter()
        self.compile_s = self.train_s = 0.0
        self.steps_trained = 0
        for group in self.groups:  # (before the directory is touched)
            epochs_asked(num_epochs, 0, group.programs.engine.num_epochs, "sweep")
        # The sweep's lock, no symlinks anywhere inside; in a multi-process job process 0
        # writes the directory (the others read it and join the checkpoints and gathers).
        out = RunDir(self.root, self.cfg, writer=self.primary, kind="sweep")
        show = SweepProgress((self.cfg.progress if progress is None else progress) and self.primary)
        interrupted: TrainingInterrupted | None = None
        checkpoints: list[Checkpointer | None] = []
        try:
            try:
                self._check_members()
                for group in self.groups:
                    checkpoints.append(self._checkpoints(group))
                starts = [
                    self._start(g, c, resume) for g, c in zip(self.groups, checkpoints, strict=True)
                ]
                for group, (first, _) in zip(self.groups, starts, strict=True):
                    epochs_asked(num_epochs, first, group.programs.engine.num_epochs, "sweep")
                if not resume:
                    self._start_over(checkpoints)
                if self.primary:
                    atomic_write(self.root / SPEC_FILE, strict_json(self.spec, indent=2))
                trained, paused = False, False
                # One handler for the whole sweep: a signal while one group ends or the next
                # compiles stops the sweep there, as one during an epoch does.
                with stop_on_signals(checkpoints=self.cfg.save_interval > 0) as stop:
                    stop.starting = True  # until a group trains: a signal ends the start-up
                    for group, chk, start in zip(self.groups, checkpoints, starts, strict=True):
                        try:
                            ran = self._run_group(group, chk, start, num_epochs, show, stop)
                        except TrainingInterrupted as e:
                            interrupted = e
                            break
                        trained |= ran is not None
                        paused |= ran == "paused"
            finally:
                show.stop()
                for chk in checkpoints:
                    if chk is not None:
                        chk.close()
            finished = out.read_summary() if resume and not trained and not interrupted else None
            if finished is not None and finished.get("status") in ("completed", "paused"):
                # every group was finished already: its summary stands, nothing is rewritten
                return {**finished, "table": self.table(finished)}
            summary = self._finish(
                "interrupted" if interrupted else "paused" if paused else "completed"
            )
            out.write_summary(summary)
        finally:
            out.release()
        if interrupted is not None:
            interrupted.summary = summary
            raise interrupted
        return {**summary, "table": self.table(summary)}

    # ------------------------------------------------------------------ groups
    def _checkpoints(self, group: Group) -> Checkpointer | None:
        directory = self.root / "checkpoints" / group.label
        if self.cfg.save_interval == 0 and not directory.is_dir():
            return None
        return Checkpointer(directory, keep=self.cfg.keep_checkpoints)

    def _check_members(self) -> None:
        """Refuse (`RunDirError`), before anything in the sweep's directory changes, a member
        folder (planned, or the previous sweep's that a start-over clears) holding a run that
        is not this sweep's: one in use (its lock held), one with checkpoints of its own (a
        train run's; a sweep keeps its groups' in `<sweep>/checkpoints/`), or any run's files
        in a directory no sweep wrote (no sweep.json). Training or clearing it would replace
        that run's records, summary and policy with a member's."""
        swept = (self.root / SPEC_FILE).is_file()
        planned = [self.root / m.name for g in self.groups for m in g.members]
        for member in dict.fromkeys([*planned, *(sweep_members(self.root) or [])]):
            if not member.is_dir() or member.is_symlink():
                continue  # (a symlink: refused by the member's own checks)
            holder = RunLock(member).holder() if self.primary else None
            own = "checkpoints" if (member / "checkpoints").exists() else None
            if own is None and not swept:
                own = next(
                    (f for f in ("metrics.jsonl", "summary.json") if (member / f).exists()), None
                )
            if holder is None and own is None:
                continue
            why = (
                f"is in use by another run (pid {holder})"
                if holder is not None
                else f"holds a run of its own ({own}) that no sweep of {str(self.root)!r} wrote"
            )
            raise RunDirError(
                f"sweep member folder {str(member)!r} {why}: the sweep would replace its "
                "files with a member's; "
                + ("wait for it to end, or " if holder is not None else "move it, or ")
                + "choose another name= for the sweep"
            )

    def _refuse_unfinished(self, checkpoints: Checkpointer) -> None:
        """`CheckpointError` when a group's latest checkpoint is before its last epoch."""
        latest = checkpoints.latest()
        total = checkpoints.info(latest).num_epochs if latest is not None else 0
        if latest is not None and latest < total:
            raise CheckpointError(
                f"{str(self.root)!r} holds an unfinished sweep ({checkpoints.directory.name}: "
                f"checkpoint of epoch {latest} of {total}): continue it with `jaxrl-engine "
                f"sweep --resume {self.root}` (in Python: `jre.resume_sweep(path)`), or delete "
                "the directory (or choose another name=) to start over"
            )

    def _start_over(self, checkpoints: list[Checkpointer | None]) -> None:
        """A fresh sweep over a finished one (an unfinished one is refused): every group's
        checkpoints and every member's files go before anything trains, so a sweep stopped
        before its last group never shows the old sweep's members as its own. The old
        sweep's groups and members that the new plan does not have (another grid: other
        names), as its checkpoint folders and sweep.csv list them, go too (their folders
        with them)."""
        labels = {g.label for g in self.groups}
        planned = [self.root / m.name for g in self.groups for m in g.members]
        others = [
            Checkpointer(d)
            for d in sorted((self.root / "checkpoints").glob("group*"))
            if d.name not in labels and d.is_dir() and not d.is_symlink()
        ]
        try:
            for c in others:  # (the new plan's own groups were checked in `_start`)
                self._refuse_unfinished(c)
        except CheckpointError:
            for c in others:
                c.close()
            raise
        held = [c for c in [*checkpoints, *others] if c is not None and c.latest() is not None]
        old = [m for m in sweep_members(self.root) or [] if m not in planned]
        if not held and not any((m / "summary.json").exists() for m in [*planned, *old]):
            for c in others:
                c.close()
            return
        print(
            f"jaxrl-engine: {self.root} held a finished sweep; starting it over (its metrics, "
            "checkpoints and policies are replaced)",
            file=sys.stderr,
        )
        for c in held:
            c.delete_all()
        for c in others:
            c.close()
            _remove_if_empty(c.directory)
        if self.primary:
            for member in [*planned, *old]:
                clear_run_files(member)
            for member in old:
                _remove_if_empty(member)

    def _meta(self, group: Group, runs: Sequence[MemberRun] = ()) -> dict[str, Any]:
        """The config a group's checkpoints carry: the sweep, its members, which failed."""
        return {
            "sweep": self.spec,
            "group": group.label,
            "members": [m.name for m in group.members],
            "non_finite": {r.member.name: r.error for r in runs if r.status == "non_finite"},
        }

    def _start(
        self, group: Group, checkpoints: Checkpointer | None, resume: bool
    ) -> tuple[int, dict[str, str]]:
        """(first epoch, the members stopped by nan_guard) of a group: its latest
        checkpoint's when resuming; else 0, after refusing an unfinished sweep."""
        latest = checkpoints.latest() if checkpoints is not None else None
        if checkpoints is None or latest is None:
            return 0, {}
        if not resume:
            self._refuse_unfinished(checkpoints)
            return 0, {}
        info = checkpoints.info(latest)
        names = [m.name for m in group.members]
        if info.config.get("members") != names:
            raise CheckpointError(
                f"checkpoint {str(info.path)!r} holds the members {info.config.get('members')}, "
                f"not {names} as {SPEC_FILE} says"
            )
        failed = dict(info.config.get("non_finite") or {})
        self._check_records(group, latest, failed)  # (every process reads the members' records)
        return latest, failed

    def _check_records(self, group: Group, epoch: int, failed: dict[str, str]) -> None:
        """A member trained on from its group's checkpoint needs its records up to that epoch
        (the checkpoint holds the batched state, not the members' records): one whose
        directory was deleted or cut short is refused before anything is written, instead of
        going on with its history missing (or ending "completed" with no result)."""
        for member in group.members:
            if member.name in failed:  # (its records end where nan_guard stopped it)
                continue
            lines = read_metrics_lines(self.root / member.name / "metrics.jsonl")
            records = [json.loads(line) for line in lines]
            epochs = [r.get("epoch") if isinstance(r, dict) else None for r in records]
            last = max((e for e in epochs if isinstance(e, int) and e <= epoch), default=0)
            if last < epoch:
                raise RunDirError(
                    f"cannot resume {str(self.root)!r}: member {member.name}'s metrics.jsonl "
                    f"has its records to epoch {last}, not to its group's checkpoint of epoch "
                    f"{epoch} (its directory was deleted or edited); put the member's directory "
                    "back, or start the sweep over (delete the directory or choose another name=)"
                )

    def _run_group(
        self,
        group: Group,
        checkpoints: Checkpointer | None,
        start: tuple[int, dict[str, str]],
        num_epochs: int | None,
        show: SweepProgress,
        stop: StopSignal,
    ) -> str | None:
        """Train one group to `num_epochs`; write its members' summaries (and policies).
        Returns the group's status (`completed`, or `paused` before the config's epochs), None
        when it was finished already (nothing trained, nothing written)."""
        programs, engine = group.programs, group.programs.engine
        first, failed = start
        total = engine.num_epochs if num_epochs is None else num_epochs
        ended = end_status(first, engine.num_epochs)  # (how this call would end it)
        if first >= total and all(
            _read_summary(self.root / m.name).get("status") in (ended, "non_finite")
            for m in group.members
        ):
            print(
                f"jaxrl-engine: {self.root}: {group.label} is finished (epoch {first} of "
                f"{total}); its members are unchanged",
                file=sys.stderr,
            )
            return None
        self._stop_before(group, stop, first)  # a signal as the previous group ended
        runs: list[MemberRun] = []
        try:
            for member in group.members:
                out = RunDir(self.root / member.name, member.cfg, writer=self.primary)
                runs.append(MemberRun(member, out))
            for run in runs:
                run.open(first, failed.get(run.member.name))
            if checkpoints is not None and first > 0:
                state, _ = checkpoints.restore(
                    programs,
                    first,
                    config=self._meta(group, runs),
                    hparams=programs.stacked_hparams(
                        [m.cfg.algo.hparams(engine.spec) for m in group.members]
                    ),
                )
            else:
                state = programs.init(
                    [m.seed for m in group.members],
                    [m.cfg.algo.hparams(engine.spec) for m in group.members],
                )
            self.compile_s += programs.compile()
            raise_if_stopped()  # (a signal before the sweep's handler: the CLI's start-up)
            # A signal while this group compiled: none of it trains (its members' summaries
            # stay as they were: none for a group not trained yet).
            checkpoint = checkpoints.path_of(first) if checkpoints and first else None
            self._stop_before(group, stop, first, state, checkpoint)
            show.start(group.label, len(runs), first, total)
            stop.starting = False
            return self._train(group, runs, state, checkpoints, first, total, show, stop)
        finally:
            for run in runs:
                run.out.close()

    @staticmethod
    def _stop_before(
        group: Group,
        stop: StopSignal,
        first: int,
        state: EngineState | None = None,
        checkpoint: Path | None = None,
    ) -> None:
        """Stop the sweep before `group` trains when any process got a signal: as a start-up
        interrupt (`KeyboardInterrupt`, the CLI's exit 130) while nothing has trained yet."""
        signame = stop.agreed()
        if signame is None:
            return
        if stop.starting:
            raise KeyboardInterrupt(signame)
        raise TrainingInterrupted(
            signame,
            first,
            state,
            checkpoint,
            {},
            f"{signame}: stopped before training {group.label} (at epoch {first}; the groups "
            "before it are finished)",
        )

    def _train(
        self,
        group: Group,
        runs: list[MemberRun],
        state: EngineState,
        checkpoints: Checkpointer | None,
        first: int,
        total: int,
        show: SweepProgress,
        stop: StopSignal,
    ) -> str:
        engine, save = group.programs.engine, self.cfg.save_interval
        done, saved, began = first, first, time.perf_counter()
        checkpoint: Path | None = None
        while done < total:
            n = self._chunk_length(engine, done, total)
            training = sum(r.status == "running" for r in runs)
            # (a signal during the sweep's last call: it completes, and says so)
            stop.last = group is self.groups[-1] and done + n >= total
            state = self._chunk(group, runs, state, done, n, total)
            done += n
            self.steps_trained += training * n * engine.steps_per_epoch
            if checkpoints is not None and (done % save == 0 or done == total):
                checkpoint, saved = self._save(group, runs, state, checkpoints, done), done
            elapsed = time.perf_counter() - began
            rate = (done - first) * len(runs) * engine.steps_per_epoch / max(elapsed, 1e-9)
            finals = [r.final_eval for r in runs if r.status == "running"]
            finite = [f for f in finals if math.isfinite(f)]
            show.update(done, rate, float(np.mean(finite)) if finite else math.nan)
            signame = stop.agreed() if done < total else None
            if signame is not None:
                if checkpoints is not None and saved != done:
                    checkpoint = self._save(group, runs, state, checkpoints, done)
                self.train_s += time.perf_counter() - began
                self._end(group, runs, state, checkpoint, "interrupted")
                raise TrainingInterrupted(signame, done, state, checkpoint, {})
        self.train_s += time.perf_counter() - began
        stop.ending = group is self.groups[-1]  # (a signal from here on: the sweep completes)
        status = end_status(done, engine.num_epochs)
        self._end(group, runs, state, checkpoint, status)
        return status

    def _chunk_length(self, engine: Any, done: int, total: int) -> int:
        """Epochs to the next evaluation, checkpoint or the end (at most `epochs_per_call`)."""
        boundaries = [total, (done // engine.eval_interval + 1) * engine.eval_interval]
        if self.cfg.save_interval:
            boundaries.append((done // self.cfg.save_interval + 1) * self.cfg.save_interval)
        return int(min(min(boundaries) - done, engine.epochs_per_call))

    def _chunk(
        self,
        group: Group,
        runs: list[MemberRun],
        state: EngineState,
        start: int,
        n: int,
        total: int,
    ) -> EngineState:
        """`n` epochs of every member, the evaluation when one is due, the records logged (a
        member whose guard fires stops logging there)."""
        programs, engine = group.programs, group.programs.engine
        state, table, ran = jax.block_until_ready(programs.epochs(state, n))
        table, ran = to_host((table, ran))  # (gathered from every process of a job)
        done = start + n
        evaluation: dict[str, Any] = {}
        if done % engine.eval_interval == 0 or done == total:
            state, evaluation = programs.evaluate(state)
            evaluation = to_host(evaluation)
        wall_s = time.perf_counter() - self.wall_start
        for i, run in enumerate(runs):
            for row in range(int(ran[i]) if run.status == "running" else 0):
                epoch = start + row + 1
                metrics = {k: v[i, row] for k, v in table.items()}
                if row == n - 1:
                    metrics.update({k: v[i] for k, v in evaluation.items()})
                try:
                    check_guards(metrics, engine.guarded_names, epoch)
                except NonFiniteError as e:
                    run.status, run.error = "non_finite", str(e)
                    print(f"jaxrl-engine: sweep member {run.member.name}: {e}", file=sys.stderr)
                    break
                run.log(
                    {
                        "epoch": epoch,
                        "env_steps": epoch * engine.steps_per_epoch,
                        "wall_s": run.wall_offset + wall_s,
                        **{
                            k: float(np.asarray(v))
                            for k, v in metrics.items()
                            if not k.startswith("guard/")
                        },
                    }
                )
        return state

    def _save(
        self,
        group: Group,
        runs: list[MemberRun],
        state: EngineState,
        checkpoints: Checkpointer,
        epoch: int,
    ) -> Path:
        for run in runs:  # (the members' epochs held by log_interval: on disk with it)
            run.out.flush_logs()
        return checkpoints.save(
            state,
            config=self._meta(group, runs),
            metrics_log=None,  # each member's records are in its own metrics.jsonl
            num_epochs=group.programs.engine.num_epochs,
            epoch=epoch,
        )

    def _end(
        self,
        group: Group,
        runs: list[MemberRun],
        state: EngineState,
        checkpoint: Path | None,
        status: str,
    ) -> None:
        """Each member's summary.json; the policy of each completed member."""
        engine = group.programs.engine
        completed: list[tuple[int, MemberRun]] = []
        for i, run in enumerate(runs):
            member = run.member
            summary = {
                "name": member.name,
                "status": "non_finite" if run.status == "non_finite" else status,
                "algorithm": getattr(engine.algo, "name", None),
                "final_eval_return": run.final_eval,
                "final_eval_return_std": run.final_eval_std,
                "final_eval_return_iqm": run.final_eval_iqm,
                "final_eval_epoch": run.final_eval_epoch,
                "eval_episodes": engine.eval_episodes,
                "eval_policy": "deterministic" if engine.eval_deterministic else "stochastic",
                "epochs": run.epochs,
                "env_steps": run.epochs * engine.steps_per_epoch,
                "requested_env_steps": member.cfg.total_env_steps,
                "wall_s": time.perf_counter() - self.wall_start,
                "run_dir": str(run.out.path.absolute()),
                "checkpoint": None if checkpoint is None else str(checkpoint),
                "sweep": str(self.root.absolute()),
                "seed": member.seed,
                "settings": member.settings,
                **({"error": run.error} if run.error else {}),
            }
            run.out.write_summary(summary)
            if summary["status"] in ("completed", "paused"):
                completed.append((i, run))
        if not completed:
            return
        # Every member's acting params in one gather (a collective each process joins), a leaf
        # at a time; indexing the sharded state per member instead would put many collective
        # programs in flight at once, which gloo may run in a different order in each process.
        params = to_host(state.eval_params)
        if not self.primary:
            return
        # One export for every member: their params differ, not their shapes.
        exported: jax.export.Exported | None = None
        for i, run in completed:
            member_params = jax.tree.map(lambda x: x[i], params)
            try:
                if exported is None:
                    exported = export_acting(engine, member_params)
                export_policy(engine, member_params, run.out.path / POLICY_DIR, exported=exported)
            except ExportError as e:
                warnings.warn(f"{run.member.name}: policy not exported: {e}", stacklevel=2)

    # ----------------------------------------------------------------- results
    def _finish(self, status: str) -> dict[str, Any]:
        """sweep.csv from the members' summaries; the sweep's summary with the per-setting
        statistics of the final evaluation return over seeds."""
        grid_keys = list(self.spec["grid"])
        rows: list[dict[str, Any]] = []
        by_setting: dict[str, list[float]] = {}
        for group in self.groups:
            for member in group.members:
                summary = _read_summary(self.root / member.name)
                final = summary.get("final_eval_return")
                rows.append(
                    {
                        "member": member.name,
                        "seed": member.seed,
                        **{k: _cell(member.settings[k]) for k in grid_keys},
                        "status": summary.get("status", "not_run"),
                        "final_eval_return": final,
                        "epochs": summary.get("epochs"),
                        "env_steps": summary.get("env_steps"),
                        "program": group.label,
                    }
                )
                returns = by_setting.setdefault(member.setting, [])
                if summary.get("status") in RESULT_STATUSES and isinstance(final, int | float):
                    returns.append(float(final))
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: "" if v is None else v for k, v in row.items()} for row in rows)
        if self.primary:
            atomic_write(self.root / CSV_FILE, text.getvalue())
        members = len(rows)
        return {
            "name": self.cfg.name,
            "status": status,
            "members": members,
            "programs": len(self.groups),
            "completed": sum(r["status"] == "completed" for r in rows),
            "non_finite": [r["member"] for r in rows if r["status"] == "non_finite"],
            "env_steps": sum(r["env_steps"] or 0 for r in rows),
            "steps_per_second": self.steps_trained / self.train_s if self.train_s else None,
            "train_s": self.train_s,
            "compile_s": self.compile_s,
            "wall_s": time.perf_counter() - self.wall_start,
            "run_dir": str(self.root.absolute()),
            "csv": str((self.root / CSV_FILE).absolute()),
            "settings": [
                {
                    "setting": setting,
                    "seeds": len(returns),
                    "mean": float(np.mean(returns)) if returns else None,
                    "std": float(np.std(returns, ddof=1)) if len(returns) > 1 else None,
                    "iqm": iqm(returns) if returns else None,
                }
                for setting, returns in by_setting.items()
            ],
        }

    @staticmethod
    def table(summary: dict[str, Any]) -> str:
        """The per-setting table of final eval returns over seeds, and the aggregate rate."""
        width = max(len("setting"), *(len(s["setting"]) for s in summary["settings"]))

        def number(value: float | None) -> str:
            return f"{value:>10.2f}" if value is not None else f"{'-':>10}"

        lines = [f"{'setting':<{width}}  {'seeds':>5}  {'mean':>10}  {'std':>10}  {'IQM':>10}"]
        for s in summary["settings"]:
            lines.append(
                f"{s['setting']:<{width}}  {s['seeds']:>5}  {number(s['mean'])}  "
                f"{number(s['std'])}  {number(s['iqm'])}"
            )
        rate = summary["steps_per_second"]
        lines.append(
            f"{summary['members']} members in {summary['programs']} compiled program(s); "
            + (
                f"{rate:,.0f} env steps/s over all members ({summary['train_s']:.1f} s training, "
                f"{summary['compile_s']:.1f} s compiling)"
                if rate is not None
                else "nothing left to train"
            )
        )
        return "\n".join(lines)


def _cell(value: Any) -> Any:
    """A grid value as a CSV cell: numbers and strings as they are, lists as JSON."""
    return value if isinstance(value, int | float | str) else json.dumps(value)


def _read_summary(run_dir: Path) -> dict[str, Any]:
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
    return summary if isinstance(summary, dict) else {}
