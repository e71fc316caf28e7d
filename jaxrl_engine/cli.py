"""`jaxrl-engine train [CONFIG] [key=value ...] [--resume RUN_DIR]`: train from a config or
continue a run; the last stdout line is the summary.

Exit status: 0 trained; 2 bad input (config, env id, shapes, checkpoints), reported before any
compile; 3 stopped by a non-finite value; 75 stopped by SIGINT/SIGTERM after a checkpoint
(resume it with --resume). A second SIGINT ends the process at once (killed by the signal).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from jaxrl_engine.io.config import ConfigError, load_config

EXIT_BAD_INPUT = 2
EXIT_NON_FINITE = 3
EXIT_INTERRUPTED = 75  # EX_TEMPFAIL: try again later (resume)


def _fail(message: str, status: int) -> int:
    print(f"jaxrl-engine: {message}", file=sys.stderr)
    return status


def _bad_input() -> tuple[type[Exception], ...]:
    from jaxrl_engine.core.engine import ShapeMismatchError
    from jaxrl_engine.io.checkpoint import CheckpointError

    return (ConfigError, ShapeMismatchError, CheckpointError)


def _start(config: str | None, overrides: list[str]) -> tuple[Any, Any]:
    """(engine, state) of a fresh run; the config is validated before JAX starts."""
    cfg = load_config(config, overrides)
    import jax

    from jaxrl_engine.core.engine import build

    engine = build(cfg)
    return engine, engine.init(jax.random.key(cfg.seed))


def _train(args: argparse.Namespace) -> int:
    config, overrides = None, list(args.items)
    if overrides and "=" not in overrides[0]:
        config = overrides.pop(0)
    if args.resume and config is not None:
        return _fail(
            f"--resume continues with the run's own config; drop the config file {config!r} "
            "(key=value overrides are allowed)",
            EXIT_BAD_INPUT,
        )
    try:
        if args.resume:
            from jaxrl_engine.core.driver import resume

            engine, state = resume(args.resume, overrides)
        else:
            engine, state = _start(config, overrides)
        from jaxrl_engine.core.driver import TrainingInterrupted
        from jaxrl_engine.core.hooks import NonFiniteError

        try:
            engine.run(state)
        except NonFiniteError as e:
            notes = "; ".join(getattr(e, "__notes__", []))
            print(json.dumps(engine.last_summary))
            return _fail(f"{e}" + (f" ({notes})" if notes else ""), EXIT_NON_FINITE)
        except TrainingInterrupted as e:
            print(json.dumps(engine.last_summary))
            return _fail(
                f"{e}; continue with: jaxrl-engine train --resume {engine.last_summary['run_dir']}",
                EXIT_INTERRUPTED,
            )
    except _bad_input() as e:  # evaluated only when something is raised: imports stay lazy
        # Raised by load_config/build/resume/warm_up and the run-directory checks, before training.
        return _fail(str(e), EXIT_BAD_INPUT)
    if engine.cfg.profile:
        print(engine.timing_summary(echo=False))
    print(json.dumps(engine.last_summary))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jaxrl-engine", description=__doc__)
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
    args = parser.parse_args(argv)
    if args.verb == "train":
        return _train(args)
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
