"""`jaxrl-engine train [CONFIG] [key=value ...] [--resume RUN_DIR]`: train from a config or
continue a run; the last stdout line is the summary (strict JSON).

`jaxrl-engine sweep [CONFIG] seeds=0..15 algo.lr=[1e-4,3e-4] [key=value ...] [--split-static]
[--resume RUN_DIR]`: seeds x the grid (each `key=[...]` an axis) as vmapped members of one
compiled program per static group; prints the per-setting table, then the summary as the last
line. Same exit statuses as train; 3 only when every member was stopped by a non-finite value.

`jaxrl-engine plot|eval|export RUN_DIR ...` read finished runs (learning curves, the exported
policy's statistics, a torch export); `jaxrl-engine launch -n N -- train|sweep ...` runs N
processes of one job on this machine.

Exit status: 0 trained (or the run was finished already: its summary is printed, nothing is
rewritten); 2 bad input (config, env id, shapes, torch factory, checkpoints, a run directory in
use by another run), reported before any compile; 3 stopped by a non-finite value; 74 an
operating-system error while running (disk full, permissions), the last good checkpoint kept;
75 stopped by SIGINT/SIGTERM after a checkpoint (resume it with --resume); 130 interrupted
(Ctrl-C or SIGTERM) before training started. A second SIGINT ends the process at once (killed
by the signal).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from jaxrl_engine.io.files import RunDirError, check_kind

# The summary's wall_s counts from here (the process's start, but the interpreter's own).
STARTED = time.perf_counter()
EXIT_BAD_INPUT = 2


class _BadArguments(Exception):
    """A command line argparse refuses; `main` reports it and returns `EXIT_BAD_INPUT`."""


class _StoreOnce(argparse._StoreAction):
    """An option given twice (`--resume a --resume b`) is refused: argparse keeps the last
    one silently, and a user who typed two meant one of them."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        given = namespace.__dict__.setdefault("_options_given", set())
        if self.option_strings and self.dest in given:
            raise argparse.ArgumentError(self, "given twice: give it once")
        given.add(self.dest)
        super().__call__(parser, namespace, values, option)


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors returned by `main` (exit 2, one `jaxrl-engine: ` line naming
    `--help`) instead of `sys.exit` inside the parser: `main` is also called in process."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", None, _StoreOnce)
        self.register("action", "store", _StoreOnce)

    def error(self, message: str) -> Any:
        verb = self.prog.removeprefix("jaxrl-engine").strip()
        raise _BadArguments(f"{verb + ': ' if verb else ''}{message} (see {self.prog} --help)")


EXIT_NON_FINITE = 3
EXIT_OS_ERROR = 74  # EX_IOERR
EXIT_INTERRUPTED = 75  # EX_TEMPFAIL: try again later (resume)
EXIT_CTRL_C = 130  # 128 + SIGINT
MAX_MESSAGE = 2000  # characters of an error message shown


def _fail(message: str, status: int) -> int:
    if len(message) > MAX_MESSAGE:
        message = f"{message[:MAX_MESSAGE]}... ({len(message) - MAX_MESSAGE} more characters)"
    print(f"jaxrl-engine: {message}", file=sys.stderr)
    return status


def _join(settings: Any) -> None:
    """Join the multi-process job `settings` (a config's `distributed` block) describes, if
    any. In a job, Gloo's C++ prints its connection lines ("[Gloo] Rank 0 is connected to ...")
    to the process's stdout, whose last line must be the summary: from here on the process's
    native writes to stdout go to stderr, and Python's `print` keeps the real stdout."""
    from jaxrl_engine.distributed.multihost import join

    out = sys.stdout
    if out is not sys.__stdout__ or out is None:  # (not the process's own stdout)
        join(settings)
        return
    out.flush()
    real = os.dup(1)
    os.dup2(2, 1)  # from before the job's backend starts, whenever Gloo connects
    joined = False
    try:
        joined = join(settings)
    finally:
        if not joined:  # one process (or no job joined): stdout as it was
            os.dup2(real, 1)
            os.close(real)
    if joined:
        sys.stdout = os.fdopen(real, "w", buffering=1, encoding=out.encoding)


def _print_json(summary: dict[str, Any]) -> None:
    from jaxrl_engine.io.files import strict_json

    print(strict_json(summary))


# The exceptions that mean bad input (exit 2), by module and name.
_BAD_INPUT = (
    ("jaxrl_engine.io.config", "ConfigError"),
    ("jaxrl_engine.core.warm_up", "ShapeMismatchError"),
    ("jaxrl_engine.core.engine", "JaxSettingError"),
    ("jaxrl_engine.core.memory", "StateTooLargeError"),
    ("jaxrl_engine.io.checkpoint", "CheckpointError"),
    ("jaxrl_engine.export.policy", "ExportError"),
    ("jaxrl_engine.io.files", "RunDirError"),
    ("jaxrl_engine.distributed.multihost", "DistributedError"),
)


def _bad_input() -> tuple[type[Exception], ...]:
    """The bad-input exception classes whose modules are imported: one whose module is not
    cannot have been raised, and importing it would import JAX (a config error must not)."""
    return tuple(getattr(sys.modules[m], name) for m, name in _BAD_INPUT if m in sys.modules)


_LOST = (
    "a collective with the job's other processes failed ({error}): another process ended or "
    "lost its connection (its own message says why); {kept}"
)


def _lost_a_process(e: BaseException) -> bool:
    """`e` is XLA's error for a collective whose peer is gone, in a multi-process job (one
    message instead of the traceback of the epoch that waited for it)."""
    jax = sys.modules.get("jax")
    if jax is None or not isinstance(e, jax.errors.JaxRuntimeError):
        return False
    try:
        return bool(jax.process_count() > 1)
    except RuntimeError:  # (the distributed client is already gone)
        return True


def _kept(run: Path | None, when: str) -> str:
    """What a failed run leaves: its last good checkpoint and how to continue (`when`)."""
    checkpoint = _latest_checkpoint(run)
    if checkpoint is None:
        return "no checkpoint was written"
    return f"the last good checkpoint is {checkpoint}; {_resume_hint(run)} {when}"


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _latest_in(directory: Path) -> Path | None:
    """The newest committed checkpoint in a checkpoints directory (from the names only)."""
    if not directory.is_dir():
        return None
    epochs = [
        (int(p.name.removeprefix("epoch_")), p)
        for p in directory.iterdir()
        if p.name.removeprefix("epoch_").isdigit()
    ]
    return max(epochs)[1] if epochs else None


def _latest_checkpoint(run: Path | None) -> Path | None:
    """The run's newest committed checkpoint directory."""
    return None if run is None else _latest_in(run / "checkpoints")


def _resume_hint(run: Path | None) -> str:
    nothing = "no checkpoint was written, so there is nothing to resume"
    if run is not None and (run / "sweep.json").is_file():  # a sweep: a checkpoint per group
        groups = run / "checkpoints"
        saved = groups.is_dir() and any(_latest_in(g) for g in groups.iterdir())
        return f"continue with: jaxrl-engine sweep --resume {run}" if saved else nothing
    if _latest_checkpoint(run) is None:
        return nothing
    return f"continue with: jaxrl-engine train --resume {run}{_factory_item(run)}"


def _factory_item(run: Path | None) -> str:
    """` algo.torch_policy.factory=M:F` when the run was trained with a torch factory of the
    user's (resume needs it named: a run directory's word does not import code)."""
    from jaxrl_engine.compose import needs_naming, stored_factory
    from jaxrl_engine.io.config import read_config

    try:
        factory = stored_factory(read_config(run / "config.yaml")) if run is not None else None
    except ValueError:
        return ""
    return f" algo.torch_policy.factory={factory}" if factory and needs_naming(factory) else ""


def _config_first(items: list[str]) -> tuple[str | None, list[str]]:
    """(config file or None, overrides): the first item is the config file when it is not a
    key=value item, or when it names a YAML file (a sweep member's directory has `=` in its
    name: `runs/lr/seed1_algo.lr=0.001/config.yaml`)."""
    items = list(items)
    first = items[0] if items else ""
    if first and ("=" not in first or first.endswith((".yaml", ".yml")) or Path(first).is_file()):
        return items.pop(0), items
    return None, items


def _missing_run(path: str, what: str = "run directory") -> str | None:
    """Why `path` cannot be a run directory (it does not exist, or is a file), else None:
    answered before JAX is imported."""
    if not Path(path).exists():
        return f"{what} {path!r} does not exist"
    if not Path(path).is_dir():
        return f"{what} {path!r} is not a directory"
    return None


def _run_not_sweep(path: str, verb: str) -> str | None:
    """`path` is a sweep's directory (it holds sweep.json): `verb` takes one of its members."""
    from jaxrl_engine.io.plot import not_a_sweep

    return not_a_sweep(path, f"{verb} takes")


def _train(args: argparse.Namespace) -> int:
    from jaxrl_engine.run.signals import raise_if_stopped

    config, overrides = _config_first(args.items)
    if args.resume is not None and not args.resume.strip():
        return _fail(
            "--resume needs a run directory, e.g. --resume runs/ppo_cartpole", EXIT_BAD_INPUT
        )
    if args.from_checkpoint is not None and args.resume is None:
        return _fail("--from-checkpoint N goes with --resume RUN_DIR", EXIT_BAD_INPUT)
    if args.print_config and args.resume is not None:
        return _fail(
            f"--print-config shows a new run's config; a run's own is {args.resume}/config.yaml",
            EXIT_BAD_INPUT,
        )
    if args.resume is not None and config is not None:
        return _fail(
            f"--resume continues with the run's own config; drop the config file {config!r} "
            "(key=value overrides are allowed)",
            EXIT_BAD_INPUT,
        )
    run: Path | None = Path(args.resume) if args.resume is not None else None
    if run is not None:
        problem = _missing_run(args.resume)
        if problem:
            return _fail(f"cannot resume: {problem}", EXIT_BAD_INPUT)
        try:
            check_kind(run, "train")
        except RunDirError as e:
            return _fail(f"cannot resume: {e}", EXIT_BAD_INPUT)
    try:
        from jaxrl_engine.io.config import check_structure, load_config, load_distributed

        # A process of a multi-process job joins it before anything starts JAX (validating
        # the config does; its keys and values are checked first, without JAX); a resumed
        # run takes its `distributed.*` from the command line.
        if args.resume is None:
            check_structure(config, overrides)
        _join(load_distributed(config, overrides))
        if args.resume is not None:
            from jaxrl_engine.compose import resume

            engine, state = resume(
                args.resume,
                overrides,
                epoch=args.from_checkpoint,
                factory_hint="algo.torch_policy.factory={factory} on the command line",
            )
            raise_if_stopped()
        else:

            def starting(cfg: Any) -> None:  # keys, types and sizes valid; the env is next
                if cfg.progress:
                    print(
                        f"jaxrl-engine: {cfg.name}: making {cfg.env.id} ({cfg.env.num_envs} "
                        f"envs) and {cfg.algo.name}; importing JAX",
                        file=sys.stderr,
                        flush=True,
                    )

            cfg = load_config(
                config, overrides, on_structure=None if args.print_config else starting
            )
            if cfg.mesh.sweep is not None:  # (a sweep's key; a run alone would ignore it)
                return _fail(
                    f"config key 'mesh.sweep': {cfg.mesh.sweep} shards a sweep's members "
                    "(jaxrl-engine sweep); one run has no sweep axis: set mesh.sweep=null "
                    "(mesh.data shards its envs)",
                    EXIT_BAD_INPUT,
                )
            if args.print_config:  # validated as a run would be: the env, the algorithm and
                # its network (a torch factory) built, the state's size checked; nothing compiled
                from jaxrl_engine.compose import build
                from jaxrl_engine.io.config import dump_config

                build(cfg.model_copy(update={"compile_cache_dir": None}))
                print(dump_config(cfg), end="")
                return 0
            run = Path(cfg.run_dir) / cfg.name
            import jax

            from jaxrl_engine.compose import build
            from jaxrl_engine.distributed.multihost import check_same_config

            check_same_config(cfg.model_dump(mode="json"))  # (before anything is built)

            raise_if_stopped()
            engine = build(cfg)
            state = engine.init(jax.random.key(cfg.seed))
            raise_if_stopped()
        from jaxrl_engine.core.nan_guard import NonFiniteError
        from jaxrl_engine.run.driver import Driver, TrainingInterrupted

        try:
            _, summary = engine.run(state, started_at=args.started, records=False)
        except NonFiniteError as e:
            notes = "; ".join(getattr(e, "__notes__", []))
            if e.summary is not None:
                _print_json(e.summary)
            return _fail(f"{e}" + (f" ({notes})" if notes else ""), EXIT_NON_FINITE)
        except TrainingInterrupted as e:
            _print_json(e.summary)
            return _fail(f"{e}; {_resume_hint(run)}", EXIT_INTERRUPTED)
    except KeyboardInterrupt:
        raise  # (first: the clauses below import modules; Ctrl-C may come mid-import)
    except OSError as e:
        return _fail(
            f"stopped by an OS error: {e}; {_kept(run, 'once the cause is fixed')}", EXIT_OS_ERROR
        )
    except _bad_input() as e:  # evaluated only when something is raised: imports stay lazy
        # Raised by load_config/build/resume/warm_up and the run-directory checks, before training.
        return _fail(str(e), EXIT_BAD_INPUT)
    except RuntimeError as e:
        if not _lost_a_process(e):
            raise
        kept = _kept(run, "with every process")
        return _fail(_LOST.format(error=_first_line(e), kept=kept), EXIT_OS_ERROR)
    if isinstance(engine.driver, Driver) and engine.driver.cfg.profile:
        print(engine.timing_summary(echo=False))
    summary.pop("records")
    _print_json(summary)
    return 0


def _sweep(args: argparse.Namespace) -> int:
    config, items = _config_first(args.items)
    job = [item for item in items if item.startswith("distributed.")]  # the process's job
    if args.resume is not None and (
        config is not None or len(job) < len(items) or args.split_static
    ):
        return _fail(
            "--resume continues the sweep with its own config, seeds and grid (its sweep.json); "
            "drop the config file, the key=value items (but distributed.*) and --split-static",
            EXIT_BAD_INPUT,
        )
    run: Path | None = Path(args.resume) if args.resume is not None else None
    if run is not None:
        problem = _missing_run(args.resume, "sweep directory")
        if problem:
            return _fail(f"cannot resume: {problem}", EXIT_BAD_INPUT)
        try:
            check_kind(run, "sweep")
        except RunDirError as e:
            return _fail(f"cannot resume: {e}", EXIT_BAD_INPUT)
    try:
        from jaxrl_engine.io.config import load_distributed

        _join(load_distributed(config, job))  # before anything starts JAX
        if args.resume is not None:
            from jaxrl_engine.compose import resume_sweep

            summary = resume_sweep(args.resume)
        else:
            from jaxrl_engine.distributed.sweep import sweep_arguments
            from jaxrl_engine.io.config import ConfigError, load_config

            seeds, grid, overrides = sweep_arguments(items, load_config(config))
            cfg = load_config(config, overrides)
            run = Path(cfg.run_dir) / cfg.name
            if seeds is not None and any(item.split("=", 1)[0] == "seed" for item in overrides):
                raise ConfigError("give the seeds with seeds=... (seed= is one run's)")
            from jaxrl_engine.compose import sweep

            summary = sweep(
                cfg,
                seeds if seeds is not None else [cfg.seed],
                grid,
                split_static=args.split_static,
            )
    except KeyboardInterrupt as e:
        from jaxrl_engine.run.driver import TrainingInterrupted

        if not isinstance(e, TrainingInterrupted):
            raise
        _print_json(e.summary)
        hint = f"continue with: jaxrl-engine sweep --resume {run}"
        return _fail(f"{e}; {hint}", EXIT_INTERRUPTED)
    except OSError as e:
        return _fail(
            f"stopped by an OS error: {e}; the checkpoints written so far are kept (jaxrl-engine "
            f"sweep --resume {run} once the cause is fixed)",
            EXIT_OS_ERROR,
        )
    except _bad_input() as e:
        return _fail(str(e), EXIT_BAD_INPUT)
    except RuntimeError as e:
        if not _lost_a_process(e):
            raise
        kept = f"the checkpoints written so far are kept (jaxrl-engine sweep --resume {run})"
        return _fail(_LOST.format(error=_first_line(e), kept=kept), EXIT_OS_ERROR)
    print(summary.pop("table"))
    _print_json(summary)
    if summary["members"] and len(summary["non_finite"]) == summary["members"]:
        return _fail("every member was stopped by a non-finite value", EXIT_NON_FINITE)
    return 0


def _plot(args: argparse.Namespace) -> int:
    from pathlib import Path

    from jaxrl_engine.io.files import default_plot_name
    from jaxrl_engine.io.plot import plot_runs

    # Into the (first) run directory unless --out says otherwise: never the working directory.
    out = args.out or str(Path(args.runs[0]) / default_plot_name(len(args.runs)))
    try:
        plot_runs(args.runs, out, metric=args.metric, references=args.reference)
    except (FileNotFoundError, ValueError) as e:
        return _fail(str(e), EXIT_BAD_INPUT)
    except OSError as e:  # (the runs are read before: what failed is writing the plot)
        return _fail(f"cannot write the plot to {out}: {e}", EXIT_OS_ERROR)
    print(out)
    return 0


def _eval(args: argparse.Namespace) -> int:
    problem = _missing_run(args.run) or _run_not_sweep(args.run, "eval")
    if problem:
        return _fail(problem, EXIT_BAD_INPUT)
    from jaxrl_engine.io.schema import check_eval_request

    try:
        check_eval_request(args.episodes, args.seed)
    except ValueError as e:
        return _fail(str(e), EXIT_BAD_INPUT)
    from jaxrl_engine.export.evaluate import evaluate_run

    try:
        stats = evaluate_run(args.run, episodes=args.episodes, seed=args.seed)
    except ValueError as e:  # ConfigError, ExportError, CheckpointError are ValueErrors
        return _fail(str(e), EXIT_BAD_INPUT)
    print(
        f"{stats['env_id']}: {stats['episodes']} episodes of the deterministic policy, return "
        f"{stats['return_mean']:.2f} "
        f"+- {stats['return_std']:.2f} (min {stats['return_min']:.2f}, median "
        f"{stats['return_median']:.2f}, max {stats['return_max']:.2f}), "
        f"length {stats['length_mean']:.1f}"
    )
    _print_json(stats)
    return 0


def _export(args: argparse.Namespace) -> int:
    problem = _missing_run(args.run) or _run_not_sweep(args.run, "export")
    if problem:
        return _fail(problem, EXIT_BAD_INPUT)
    if args.factory is not None and not args.checkpoint:
        return _fail(
            "--factory goes with --checkpoint (its torch network rebuilds a checkpoint's "
            "policy); without --checkpoint the exported policy is used as it is",
            EXIT_BAD_INPUT,
        )

    from jaxrl_engine.export.evaluate import never_exported
    from jaxrl_engine.export.policy import POLICY_DIR, ExportError, NoTorchForm, export_torch
    from jaxrl_engine.policy import export_from_checkpoint

    policy = Path(args.run) / POLICY_DIR
    policy_written = False
    try:
        if args.checkpoint:
            export_from_checkpoint(args.run, factory=args.factory)
            policy_written = True
        if not (policy / "meta.json").is_file():
            raise ExportError(
                never_exported(args.run)
                or f"{args.run} has no exported policy ({policy}/meta.json); "
                "--checkpoint exports one from the run's latest checkpoint"
            )
        export_torch(policy)  # (ExportError for a policy with no torch form)
    except NoTorchForm as e:
        if not policy_written:
            return _fail(str(e), EXIT_BAD_INPUT)
        # --checkpoint did its part (the JAX artefact); there is no torch one to add
        print(f"jaxrl-engine: {e}", file=sys.stderr)
    except _bad_input() as e:
        return _fail(str(e), EXIT_BAD_INPUT)
    except OSError as e:  # a read-only or full run directory: nothing of the run is lost
        return _fail(f"cannot write the exported policy in {policy}: {e}", EXIT_OS_ERROR)
    print(policy)
    return 0


def _add_import_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first (installed or in the current directory), e.g. the module "
        "that registers a run's gymnasium env 'MODULE:EnvName-v0': a run directory is data, "
        "so the modules it names are imported only when you name them",
    )


def _import_modules(modules: list[str]) -> str | None:
    """Import the user's `--import` modules; the error message of the first that fails."""
    from jaxrl_engine.io.user_code import first_line, import_from_here

    for module in modules:
        try:
            import_from_here(module)
        except Exception as e:  # not found, or its own code failed
            return f"--import {module}: {first_line(e)} (from {os.getcwd()})"
    return None


def _add_user_verbs(verbs: argparse._SubParsersAction) -> None:
    """plot, eval, export: the verbs that read finished run directories."""
    plot = verbs.add_parser(
        "plot",
        help="learning curves of runs (PNG/SVG): eval return vs env steps and vs wall time",
        description="Runs that differ only in the seed are one curve: mean and min-max band.",
    )
    plot.add_argument("runs", nargs="+", metavar="RUN_DIR")
    plot.add_argument(
        "--out",
        help="output .png or .svg (default: RUN_DIR/curves.png; with several runs, "
        "curves_<N>_runs.png in the first one)",
    )
    plot.add_argument(
        "--metric",
        default="evaluate/episode_return",
        help="a metrics.jsonl key (default evaluate/episode_return)",
    )
    plot.add_argument(
        "--reference",
        action="append",
        default=[],
        metavar="JSON",
        help='a reference curve drawn dashed beside the runs: {"label": ..., "curve": '
        '[{"env_steps": n, "return": x, "wall_s": s}, ...]} (wall_s optional; '
        "benchmarks/brax_reference.py writes this)",
    )
    ev = verbs.add_parser(
        "eval",
        help="run a run's exported policy for N episodes and print the statistics",
        description="The policy is RUN_DIR/policy/ (written at the end of training); the env "
        "is the run's evaluation env. The last stdout line is the statistics as JSON.",
    )
    ev.add_argument("run", metavar="RUN_DIR")
    ev.add_argument("--episodes", type=int, default=100, help="episodes (default 100)")
    ev.add_argument("--seed", type=int, default=0, help="PRNG seed of the episodes (default 0)")
    _add_import_option(ev)
    export = verbs.add_parser(
        "export",
        help="add the torch module (torch_policy.py + .pt) to a run's exported policy",
        description="RUN_DIR/policy/ holds the JAX artefact (policy.py, act.jaxexport, "
        "params.npz) once a run ends; this adds the torch one (needs torch), after rewriting "
        "the JAX artefact from the latest checkpoint with --checkpoint.",
    )
    export.add_argument("run", metavar="RUN_DIR")
    export.add_argument(
        "--checkpoint",
        action="store_true",
        help="first (re)write the JAX artefact from the run's latest checkpoint",
    )
    export.add_argument(
        "--factory",
        metavar="MODULE:FN",
        help="with --checkpoint, the torch factory of a run trained with algo.torch_policy "
        "(its network rebuilds the policy, written as the JAX artefact; a network of your own "
        "has no torch_policy.pt export): a run directory is data, so the factory it names is "
        "imported only when you name the same one here",
    )
    _add_import_option(export)


def _launch(args: argparse.Namespace) -> int:
    from jaxrl_engine.distributed.launch import launch

    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command or command[0] not in ("train", "sweep"):
        return _fail(
            "launch runs a train or sweep command as several processes: jaxrl-engine launch "
            "-n 2 [--cpu-devices 2] -- train|sweep [CONFIG] [key=value ...]",
            EXIT_BAD_INPUT,
        )
    if args.processes < 1 or (args.cpu_devices is not None and args.cpu_devices < 1):
        return _fail("launch: -n and --cpu-devices must be at least 1", EXIT_BAD_INPUT)
    return launch(args.processes, command, args.cpu_devices, args.port)


def _add_launch_verb(verbs: argparse._SubParsersAction) -> None:
    launch = verbs.add_parser(
        "launch",
        help="run a train or sweep command as N processes of one job on this machine",
        description="Starts N processes of `jaxrl-engine COMMAND`, each with distributed.* "
        "set to join one job over 127.0.0.1; when one fails the others are stopped. On a "
        "cluster, start one process per task yourself (see examples/slurm/).",
    )
    launch.add_argument("-n", "--processes", type=int, required=True, help="processes")
    launch.add_argument(
        "--cpu-devices",
        type=int,
        metavar="D",
        help="CPU devices per process (XLA_FLAGS=--xla_force_host_platform_device_count=D)",
    )
    launch.add_argument(
        "--port", type=int, default=0, help="coordinator port (default: a free one)"
    )
    launch.add_argument("command", nargs=argparse.REMAINDER, metavar="-- train|sweep ...")


USER_VERBS = {"plot": _plot, "eval": _eval, "export": _export, "launch": _launch}


def _plain_warnings() -> None:
    """On the command line, the engine's own warnings read as its other messages do
    (`jaxrl-engine: warning: ...`), without Python's file, line number and source line."""
    import warnings

    package = str(Path(__file__).resolve().parent)
    shown = warnings.showwarning

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: Any = None,
        line: str | None = None,
    ) -> None:
        if str(Path(filename).resolve()).startswith(package):
            print(f"jaxrl-engine: warning: {message}", file=sys.stderr, flush=True)
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the command line (not a call from Python): `kill -USR1` dumps stacks
        import faulthandler
        import signal

        faulthandler.register(signal.SIGUSR1, all_threads=True)
        _plain_warnings()
    parser = _Parser(
        prog="jaxrl-engine",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,  # (its paragraphs)
    )
    verbs = parser.add_subparsers(dest="verb", required=True)
    train = verbs.add_parser(
        "train",
        help="train a config (default: PPO on CartPole-v1), or continue a run with --resume",
        description="CONFIG is a YAML file (default: the built-in PPO CartPole config); "
        "key=value items override it, e.g. algo.lr=1e-3 seed=1. With --resume runs/<name>, "
        "the run continues from its latest checkpoint with its own config (overrides that "
        "change no shape are allowed, e.g. total_env_steps=...).",
    )
    train.add_argument("items", nargs="*", metavar="[CONFIG] [key=value]")
    train.add_argument("--resume", metavar="RUN_DIR", help="continue this run directory")
    train.add_argument(
        "--from-checkpoint",
        type=int,
        metavar="N",
        help="with --resume: continue from the checkpoint of epoch N instead of the latest (e.g. "
        "when the latest is corrupted); the later checkpoints are moved to "
        "RUN_DIR/discarded_checkpoints/",
    )
    train.add_argument(
        "--print-config",
        action="store_true",
        help="validate CONFIG with the overrides as a run would (the env is made), print the "
        "resolved config as YAML and exit: nothing is compiled or written",
    )
    _add_import_option(train)
    sweep = verbs.add_parser(
        "sweep",
        help="train seeds x a grid of config values as vmapped members of one compiled program",
        description="CONFIG is a YAML file (default: the built-in PPO CartPole config). "
        "seeds=0..15 (inclusive) or seeds=[0,3,5]; each key=[a,b,...] is a grid axis, any "
        "other key=value an override of the base config. Traced keys (an algorithm's numeric "
        "hyperparameters, e.g. algo.lr) share one compiled program; a static key with several "
        "values (algo.num_steps, env.num_envs, ...) exits 2 unless --split-static. Writes "
        "runs/<name>/<member>/ per member, sweep.csv and summary.json; prints the per-setting "
        "table (mean, std, IQM of the final eval return over seeds).",
    )
    sweep.add_argument("items", nargs="*", metavar="[CONFIG] [seeds=...] [key=value|key=[...]]")
    sweep.add_argument(
        "--split-static",
        action="store_true",
        help="compile one program per distinct value of the static keys in the grid",
    )
    sweep.add_argument("--resume", metavar="RUN_DIR", help="continue this sweep directory")
    _add_import_option(sweep)
    _add_user_verbs(verbs)
    _add_launch_verb(verbs)
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:
            # key=value items after an option (`sweep ... --split-static name=x`) are
            # overrides as much as those before it
            if args.verb in ("train", "sweep") and not any(e.startswith("-") for e in extra):
                args.items = [*args.items, *extra]
            else:
                parser.error(f"unrecognized arguments: {' '.join(extra)}")
    except _BadArguments as e:
        return _fail(str(e), EXIT_BAD_INPUT)
    # A run's summary counts wall_s from the process's start; called from Python, from here.
    args.started = STARTED if argv is None else time.perf_counter()
    from jaxrl_engine.run.signals import stop_before_training

    if argv is None and args.verb in USER_VERBS and args.verb != "launch":
        # eval, export, plot: no training to checkpoint, so SIGINT/SIGTERM end them at once,
        # even inside a long XLA call (a Python handler would wait for the call to return)
        import signal

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
    else:
        stop_before_training()
    failed = _import_modules(getattr(args, "imports", []))
    if failed is not None:
        return _fail(failed, EXIT_BAD_INPUT)
    try:
        if args.verb == "train":
            return _train(args)
        if args.verb == "sweep":
            return _sweep(args)
        return USER_VERBS[args.verb](args)
    except KeyboardInterrupt as e:  # a signal before training started (imports, build, compile)
        where = f"; {_resume_hint(Path(args.resume))}" if getattr(args, "resume", None) else ""
        # `raise_if_stopped` names the signal (SIGINT, SIGTERM); a bare one is Python's Ctrl-C.
        name = "Ctrl-C" if not e.args or e.args[0] == "SIGINT" else str(e.args[0])
        return _fail(f"interrupted ({name}) before training started{where}", EXIT_CTRL_C)


if __name__ == "__main__":
    sys.exit(main())
