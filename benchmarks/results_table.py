"""Every shipped config over several seeds: the results table of benchmarks/RESULTS.md (issue 14).

For each `configs/*.yaml` (or those named with `--configs`), the final greedy evaluation return
of seeds `--seeds` (default 0..4) through the CLI as a user runs it: configs whose runs can be
vmapped (gymnax envs, flax networks) as one `jaxrl-engine sweep` (all seeds in one compiled
program), the others as one `jaxrl-engine train` per seed. With `--eval-episodes N` each final
policy is evaluated again over N episodes (`jaxrl-engine eval`) and that mean is reported.
Prints a markdown table:

    env | algorithm | config | env steps | return mean / min (seeds) | anchor | wall

`wall` is the process wall of one run (median over seeds), or of the whole sweep. The anchors
are published figures for the same env (source named); "-" where none is known. Configs whose
extra is not installed are listed as skipped. The MinAtar configs (10M env steps) take ~23 min
per seed on a 2-core CPU and `ppo_brax_halfcheetah` (2048 envs, 50M) is for an accelerator:
name the configs to run with `--configs` on a CPU.

    .venv/bin/python benchmarks/results_table.py [--seeds 0..4] [--configs ppo_cartpole ...]
        [--override total_env_steps=4096 ...] [--eval-episodes 1000] [--out table.md]
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gymnasium
import yaml

ROOT = Path(__file__).resolve().parents[1]
# config stem -> (published figure, source); from the gymnax README (gymnax-blines checkpoints)
# unless said otherwise.
ANCHORS = {
    "ppo_cartpole": ("500", "gymnax README (gymnax-blines PPO, CartPole-v1)"),
    "dqn_cartpole": ("500", "gymnax README (gymnax-blines PPO, CartPole-v1)"),
    "dqn_cartpole_zoo": ("500", "gymnax README (gymnax-blines PPO, CartPole-v1)"),
    "dqn_mountaincar": ("-118", "gymnax README (gymnax-blines, MountainCar-v0)"),
    "ppo_gym_cartpole": ("500", "gymnax README (gymnax-blines PPO, CartPole-v1)"),
    "ppo_envpool_cartpole": ("500", "gymnax README (gymnax-blines PPO, CartPole-v1)"),
    "ppo_torch_policy": ("500", "gymnax README (gymnax-blines PPO, CartPole-v1)"),
    "ppo_pendulum": ("-130", "gymnax README (gymnax-blines PPO/ES, Pendulum-v1)"),
    "sac_pendulum": ("-130", "gymnax README (gymnax-blines PPO/ES, Pendulum-v1)"),
    "td3_pendulum": ("-130", "gymnax README (gymnax-blines PPO/ES, Pendulum-v1)"),
    "td3_mountaincar_continuous": (
        "92",
        "gymnax README (gymnax-blines, MountainCarContinuous-v0)",
    ),
    "ppo_minatar_breakout": ("28", "gymnax README (gymnax-blines PPO, Breakout-MinAtar)"),
    "ppo_mujoco_inverted_pendulum": ("1000", "the task's maximum (1 per step, 1000 steps)"),
    "ppo_brax_inverted_pendulum": ("1000", "the task's maximum (1 per step, 1000 steps)"),
    "ppo_minatar_spaceinvaders": (
        "131",
        "gymnax README (gymnax-blines PPO, SpaceInvaders-MinAtar)",
    ),
    "ppo_minatar_asterix": ("15", "gymnax README (gymnax-blines PPO, Asterix-MinAtar)"),
    "ppo_minatar_freeway": ("58", "gymnax README (gymnax-blines PPO, Freeway-MinAtar)"),
    "ppo_brax_halfcheetah": (
        "3687 at 52.4M",
        "Brax's ppo.train with its published settings, seed 0, run on an H200 "
        "(benchmarks/brax_reference.py)",
    ),
}


def seeds_arg(text: str) -> list[int]:
    if ".." in text:
        lo, hi = text.split("..")
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",")]


def needs(cfg: dict) -> str | None:
    """The module a config needs that may not be installed (its extra), or None."""
    env = cfg.get("env", {})
    suite = env.get("suite", "gymnax")
    if suite == "envpool":
        return "envpool"
    if suite == "brax":
        return "brax"
    if suite == "gymnasium" and "mujoco" in str(gymnasium.spec(env["id"]).entry_point):
        return "mujoco"
    if cfg.get("algo", {}).get("torch_policy") is not None:
        return "torch"
    return None


def sweepable(cfg: dict) -> bool:
    return (
        cfg.get("env", {}).get("suite", "gymnax") == "gymnax"
        and cfg.get("algo", {}).get("torch_policy") is None
    )


def cli(args: list[str], cwd: Path) -> tuple[dict, float]:
    cmd = [sys.executable, "-m", "jaxrl_engine.cli", *args]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), wall


def run_config(
    path: Path, seeds: list[int], overrides: list[str], work: Path, eval_episodes: int
) -> dict:
    cfg = yaml.safe_load(path.read_text())
    out = work / path.stem
    if sweepable(cfg) and len(seeds) > 1:
        seed_range = f"seeds={seeds[0]}..{seeds[-1]}"
        sweep = ["sweep", str(path), f"run_dir={out}", "progress=false", "compile_cache_dir=null"]
        summary, wall = cli([*sweep, *overrides, seed_range], work)
        with open(summary["csv"], newline="") as f:
            rows = list(csv.DictReader(f))
        returns = [float(r["final_eval_return"]) for r in rows]
        runs = [Path(summary["run_dir"]) / r["member"] for r in rows]
        steps = int(rows[0]["env_steps"])
        wall_text = f"{wall:.0f} s (sweep of {len(rows)})"
    else:
        returns, walls, runs = [], [], []
        for seed in seeds:  # one run directory per seed: each run is kept for `eval`
            run_dir = f"run_dir={out / f'seed{seed}'}"
            train = ["train", str(path), run_dir, "progress=false", "compile_cache_dir=null"]
            summary, wall = cli([*train, *overrides, f"seed={seed}"], work)
            returns.append(float(summary["final_eval_return"]))
            runs.append(Path(summary["run_dir"]))
            walls.append(wall)
            steps = int(summary["env_steps"])
        wall_text = f"{statistics.median(walls):.0f} s (median of {len(walls)})"
    if eval_episodes:
        # the final policies again, over many episodes: the training's final evaluation
        # (eval.episodes, 16 by default) is one noisy sample on envs with random starts
        returns = [
            float(cli(["eval", str(run), "--episodes", str(eval_episodes)], work)[0]["return_mean"])
            for run in runs
        ]
    algo = cfg.get("algo", {}).get("name", "ppo")
    env = cfg.get("env", {})
    return {
        "env": f"{env.get('id', 'CartPole-v1')} ({env.get('suite', 'gymnax')})",
        "algo": algo.upper(),
        "config": f"`configs/{path.name}`",
        "steps": f"{steps:,}",
        "returns": returns,
        "wall": wall_text,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=seeds_arg, default=seeds_arg("0..4"))
    parser.add_argument("--configs", nargs="*", help="config stems (default: all)")
    parser.add_argument("--override", nargs="*", default=[], help="key=value for every run")
    parser.add_argument("--out", type=Path, help="also write the table here")
    parser.add_argument(
        "--eval-episodes",
        type=int,
        default=0,
        help="re-evaluate each final policy over this many episodes (`jaxrl-engine eval`); "
        "0: the training's own final evaluation",
    )
    args = parser.parse_args()

    paths = sorted((ROOT / "configs").glob("*.yaml"))
    if args.configs:
        unknown = set(args.configs) - {p.stem for p in paths}
        if unknown:
            parser.error(f"unknown configs {sorted(unknown)}")
        paths = [p for p in paths if p.stem in args.configs]
    lines = [
        "| env | algorithm | config | env steps | return mean / min (seeds) | anchor | wall |",
        "|---|---|---|---:|---|---|---|",
    ]
    skipped, failed = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for path in paths:
            module = needs(yaml.safe_load(path.read_text()))
            if module is not None and importlib.util.find_spec(module) is None:
                skipped.append(f"{path.name} ({module} not installed)")
                continue
            print(f"{path.name}: seeds {args.seeds} ...", file=sys.stderr, flush=True)
            try:
                row = run_config(path, args.seeds, args.override, Path(tmp), args.eval_episodes)
            except RuntimeError as err:  # one failing config does not lose the others' rows
                print(err, file=sys.stderr, flush=True)
                failed.append(path.name)
                continue
            r = row["returns"]
            print(f"{path.name}: returns {r}", file=sys.stderr, flush=True)
            figure, source = ANCHORS.get(path.stem, ("-", ""))
            anchor = f"{figure}: {source}" if source else figure
            seeds = f"{args.seeds[0]}-{args.seeds[-1]}" if len(r) > 1 else str(args.seeds[0])
            lines.append(
                f"| {row['env']} | {row['algo']} | {row['config']} | {row['steps']} | "
                f"{statistics.mean(r):.1f} / {min(r):.1f} ({seeds}) | {anchor} | {row['wall']} |"
            )
            print(lines[-1], file=sys.stderr, flush=True)
    how = (
        f"each final policy's mean return over {args.eval_episodes} episodes (`jaxrl-engine eval`)"
        if args.eval_episodes
        else "each run's final evaluation (its eval.episodes)"
    )
    text = "\n".join(lines) + f"\nreturn: {how}; min: the lowest seed's"
    text += "".join(f"\nskipped: {s}" for s in skipped)
    text += "".join(f"\nfailed: {name} (its error is above)" for name in failed)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
