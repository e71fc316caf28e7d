"""Start-up and end of run (issue 15): what a user waits for around the training itself.

Each measurement is a fresh `jaxrl-engine` process (the console script of this venv), repeated
`--repeats` times, median reported:

  --help                 process wall, exit 0
  a config error         `train algo.lrr=1`: process wall, exit 2
  first status line      `train`: seconds from the process's start to its first stderr line
                         (off a terminal: plain lines), and to its first "compiling" line
  default run            `train` of the built-in config (PPO CartPole-v1, 1M env steps):
                         process wall against the summary's wall_s, and the summary's parts
                         (startup_s, compile_s, train_s, end_s); "cold": its compile cache
                         (`compile_cache_dir: auto`, under $XDG_CACHE_HOME) starts empty, as on
                         a fresh machine; "warm": the same command again (another seed), its
                         programs loaded from the cache the cold run filled

Targets (issue 15): --help and a config error < 1.0 s; first status line < 1.5 s; the default
run's process wall within 1.25x of its summary's wall_s and under 12 s on the quiet 2-core VM
(both reported, cold and warm).

    .venv/bin/python benchmarks/startup.py [--repeats 5] [--steps 1000000]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLI = str(Path(sys.executable).with_name("jaxrl-engine"))


def timed(args: list[str], cwd: str) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    proc = subprocess.run([CLI, *args], capture_output=True, text=True, cwd=cwd, timeout=600)
    return time.perf_counter() - start, proc


def first_lines(args: list[str], cwd: str, cache_home: str) -> tuple[float, float, float, dict]:
    """(s to the first stderr line, s to the first 'compiling' line, process wall, summary);
    the process's compile cache (`auto`) under `cache_home`, JAX's own cache variables unset."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env["XDG_CACHE_HOME"] = cache_home
    start = time.perf_counter()
    proc = subprocess.Popen(
        [CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, env=env
    )
    first = compiling = float("nan")
    assert proc.stderr is not None and proc.stdout is not None
    for line in proc.stderr:
        now = time.perf_counter() - start
        if math.isnan(first):
            first = now
        if re.search(r"compiling \w+ \(\d+/\d+\)", line) and math.isnan(compiling):
            compiling = now
    out = proc.stdout.read()
    proc.wait()
    wall = time.perf_counter() - start
    assert proc.returncode == 0, proc.returncode
    return first, compiling, wall, json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=1_000_000, help="the default run's length")
    args = parser.parse_args()
    rows: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        rows.setdefault(name, []).append(value)

    with tempfile.TemporaryDirectory() as cwd:
        for i in range(args.repeats):
            wall, proc = timed(["--help"], cwd)
            assert proc.returncode == 0
            add("--help: process s", wall)
            wall, proc = timed(["train", "algo.lrr=1"], cwd)
            assert proc.returncode == 2 and "algo.lrr" in proc.stderr, proc.stderr
            add("config error (algo.lrr=1): process s", wall)
            cache_home = f"{cwd}/cache-{i}"  # empty: a cold start
            for kind, seed in (("cold", 2 * i), ("warm", 2 * i + 1)):
                run = ["train", f"total_env_steps={args.steps}", f"run_dir={cwd}/runs"]
                run += [f"seed={seed}", f"name=default-{seed}"]
                first, compiling, wall, summary = first_lines(run, cwd, cache_home)
                if kind == "cold":
                    add("first status line: s from start", first)
                add(f"first 'compiling' line ({kind}): s from start", compiling)
                add(f"default run ({kind}): process s", wall)
                for key in ("wall_s", "startup_s", "compile_s", "train_s", "end_s"):
                    add(f"default run ({kind}): summary {key}", summary[key])
                add(f"default run ({kind}): process / summary wall_s", wall / summary["wall_s"])
            print(f"repeat {i + 1}/{args.repeats} done", file=sys.stderr, flush=True)

    print(f"{args.repeats} repeats, median (min / max); default run: {args.steps:,} env steps")
    print()
    print("| measurement | median | min | max |")
    print("|---|---:|---:|---:|")
    for name, values in rows.items():
        print(
            f"| {name} | {statistics.median(values):.3f} | {min(values):.3f} | {max(values):.3f} |"
        )


if __name__ == "__main__":
    main()
