"""The shipped configs' wall-time targets (issues 2 and 4), measured as a user meets them.

Each run is a fresh `jaxrl-engine train CONFIG seed=S progress=false` process (compile and
start-up included), run `--repeats` times one after another on an otherwise idle machine; the
median process wall and the final greedy return are reported against the target.
`tests/test_targets.py` checks the returns; timing is here, where nothing else shares the CPU.

    .venv/bin/python benchmarks/targets.py [--configs ppo_cartpole ...] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI = str(Path(sys.executable).with_name("jaxrl-engine"))

# config -> (return target, wall-time target in s), as the issues and README state them
TARGETS = {
    "ppo_cartpole": (475.0, 60.0),
    "ppo_pendulum": (-250.0, 120.0),
    "sac_pendulum": (-200.0, 180.0),
    "td3_pendulum": (-250.0, 180.0),
    "ppo_gym_cartpole": (475.0, 120.0),
    "ppo_mujoco_inverted_pendulum": (900.0, 120.0),
}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def run(config: str, seed: int) -> tuple[float, float]:
    """(process wall s, final greedy return) of one training."""
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        proc = subprocess.run(
            [CLI, "train", str(ROOT / "configs" / f"{config}.yaml"), f"seed={seed}",
             f"run_dir={tmp}", "progress=false", "compile_cache_dir=null"],
            capture_output=True, text=True, cwd=tmp, timeout=1800,
        )  # fmt: skip
        wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{config} seed {seed} failed:\n{proc.stderr[-3000:]}")
    return wall, float(json.loads(proc.stdout.strip().splitlines()[-1])["final_eval_return"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=["ppo_cartpole"], choices=list(TARGETS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"{cpu_name()}, {len(os.sched_getaffinity(0))} CPUs", file=sys.stderr)
    print("| config | target | runs: wall s (return) | median wall s | wall target |")
    print("|---|---:|---|---:|---|")
    for config in args.configs:
        target, limit = TARGETS[config]
        results = []
        for i in range(args.repeats):
            results.append(run(config, args.seed))
            print(f"{config} run {i + 1}: {results[-1][0]:.1f} s, {results[-1][1]:.1f}",
                  file=sys.stderr)  # fmt: skip
        median = statistics.median(w for w, _ in results)
        runs = ", ".join(f"{w:.1f} ({r:.0f})" for w, r in results)
        met = "met" if median < limit else "not met"
        reached = all(r >= target for _, r in results)
        print(
            f"| {config} | >= {target:g}{'' if reached else ' (missed)'} | {runs} | "
            f"{median:.1f} | < {limit:g} s: {met} |"
        )


if __name__ == "__main__":
    main()
