"""`jaxrl-engine train [CONFIG] [key=value ...]`: train from a config; last line is the summary."""

from __future__ import annotations

import argparse
import json
import sys

from jaxrl_engine.io.config import ConfigError, load_config

EXIT_BAD_INPUT = 2


def _train(args: argparse.Namespace) -> int:
    config, overrides = None, list(args.items)
    if overrides and "=" not in overrides[0]:
        config = overrides.pop(0)
    try:
        cfg = load_config(config, overrides)
    except ConfigError as e:
        print(f"jaxrl-engine: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    # Imported after validation so that bad input fails fast, before JAX starts.
    import jax

    from jaxrl_engine.core.engine import ShapeMismatchError, build

    try:
        engine = build(cfg)
        engine.run(engine.init(jax.random.key(cfg.seed)))
    except (ConfigError, ShapeMismatchError) as e:  # raised by build/warm_up, before training
        print(f"jaxrl-engine: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if cfg.profile:
        print(engine.timing_summary(echo=False))
    print(json.dumps(engine.last_summary))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jaxrl-engine", description=__doc__)
    verbs = parser.add_subparsers(dest="verb", required=True)
    train = verbs.add_parser(
        "train",
        help="train a config (default: PPO on CartPole-v1)",
        description="CONFIG is a YAML file (default: the built-in PPO CartPole config); "
        "key=value items override it, e.g. algo.lr=1e-3 seed=1.",
    )
    train.add_argument("items", nargs="*", metavar="[CONFIG] [key=value]")
    args = parser.parse_args(argv)
    if args.verb == "train":
        return _train(args)
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
