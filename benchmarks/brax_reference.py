"""Brax's own PPO trainer on a Brax env: the reference curve for a Brax config (issue 14).

Runs `brax.training.agents.ppo.train` (Brax's PPO, its default networks: policy 4x32, value
5x256, silu, tanh-squashed Gaussian) with the hyperparameters Brax publishes for the task in its
training notebook, and writes its evaluation curve (env steps, mean evaluation return, wall
seconds since the start of training) as JSON in the format `jaxrl-engine plot --reference`
reads, so that `configs/ppo_brax_<task>.yaml` can be
compared with it at equal env steps on the same machine. Needs the `brax` extra; sized for an
accelerator (`benchmarks/gpu_session.sh` runs it).

    .venv/bin/python benchmarks/brax_reference.py --env halfcheetah --steps 50000000 \
        --out brax_halfcheetah.json
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import sys
import time
import warnings

# Brax's PPO settings per task, from its training notebook (num_timesteps is the caller's); a
# task is added here once its settings are checked against that notebook.
SETTINGS = {
    "halfcheetah": dict(
        reward_scaling=1.0,
        episode_length=1000,
        normalize_observations=True,
        action_repeat=1,
        unroll_length=20,
        num_minibatches=32,
        num_updates_per_batch=8,
        discounting=0.95,
        learning_rate=3e-4,
        entropy_cost=1e-3,
        num_envs=2048,
        batch_size=512,
    ),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", choices=sorted(SETTINGS), default="halfcheetah")
    parser.add_argument("--backend", default="spring")
    parser.add_argument("--steps", type=int, default=50_000_000)
    parser.add_argument("--evals", type=int, default=11, help="evaluations, the first at step 0")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write the curve here as JSON")
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="change one of Brax's settings (a smaller num_envs for a CPU smoke run, say)",
    )
    args = parser.parse_args(argv)

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        import jax
        from brax import envs
        from brax.training.agents.ppo import train as ppo

    if not hasattr(jax, "device_put_replicated"):
        # Brax 0.14's trainer copies its state to each pmap device with
        # `jax.device_put_replicated`, removed in jax 0.10: the same copy with `jax.device_put`
        # (a leading axis of one entry per device, which `jax.pmap` splits over the devices).
        def device_put_replicated(tree, devices):
            stack = lambda a: jax.numpy.stack([jax.numpy.asarray(a)] * len(devices))  # noqa: E731
            return jax.device_put(jax.tree.map(stack, tree), devices[0])

        jax.device_put_replicated = device_put_replicated

    settings = dict(SETTINGS[args.env])
    for item in args.override:
        key, _, value = item.partition("=")
        if key not in settings:
            parser.error(f"--override {item!r}: {key!r} is not one of {sorted(settings)}")
        settings[key] = type(settings[key])(float(value))

    curve: list[dict[str, float]] = []
    start = time.perf_counter()

    def progress(step: int, metrics: dict) -> None:
        row = {
            "env_steps": int(step),
            "return": float(metrics["eval/episode_reward"]),
            "return_std": float(metrics.get("eval/episode_reward_std", float("nan"))),
            "wall_s": round(time.perf_counter() - start, 2),
        }
        curve.append(row)
        print(json.dumps(row), flush=True)

    env = envs.get_environment(args.env, backend=args.backend)
    train = functools.partial(
        ppo.train, num_timesteps=args.steps, num_evals=args.evals, seed=args.seed, **settings
    )
    train(environment=env, progress_fn=progress)
    result = {
        "label": f"Brax's ppo.train ({args.env}, {args.backend}, seed {args.seed})",
        "trainer": "brax.training.agents.ppo.train",
        "env": args.env,
        "backend": args.backend,
        "seed": args.seed,
        "settings": settings,
        "device": jax.devices()[0].device_kind,
        "jax": jax.__version__,
        "curve": curve,
        "total_wall_s": round(time.perf_counter() - start, 2),
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "curve"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
