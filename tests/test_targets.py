"""Training targets, through the CLI as a user runs it: return reached, wall time incl. compile.
Slow: CI runs them (issues 2 and 4)."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def train(
    config: str, *overrides: str, tmp_path: Path, verb: str = "train", env: dict | None = None
) -> tuple[dict, float]:
    """`jaxrl-engine <verb> <config> ...` in a fresh process: (its JSON summary, wall s)."""
    cmd = [
        sys.executable,
        "-m",
        "jaxrl_engine.cli",
        verb,
        str(ROOT / config),
        f"run_dir={tmp_path}",
        "progress=false",
        *overrides,
    ]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
    wall = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), wall


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ppo_cartpole_reaches_475_within_60s(seed, tmp_path):
    summary, wall = train("configs/ppo_cartpole.yaml", f"seed={seed}", tmp_path=tmp_path)
    assert summary["final_eval_return"] >= 475, summary
    assert summary["env_steps"] >= 1_000_000
    assert wall < 60, f"{wall:.1f} s"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("config", "target", "limit_s"),
    [
        ("configs/ppo_pendulum.yaml", -250, 120),
        ("configs/sac_pendulum.yaml", -200, 180),
        ("configs/td3_pendulum.yaml", -250, 180),
        ("configs/ppo_gym_cartpole.yaml", 475, 120),  # gymnasium envs stepped on the host
        # MuJoCo through the host path (the mujoco extra, in dev): the untrained policy
        # scores ~24 (tests/envs/test_mujoco.py); seeds 0-5 reached the maximum, 1000, by 41k
        # of the 102k env steps and ended at 1000; seeds 0-2 took 37-40 s on a 2-core CPU
        # (benchmarks/RESULTS.md)
        pytest.param(
            "configs/ppo_mujoco_inverted_pendulum.yaml",
            900,
            120,
            marks=pytest.mark.skipif(
                importlib.util.find_spec("mujoco") is None, reason="mujoco is not installed"
            ),
        ),
    ],
    ids=[
        "ppo_pendulum",
        "sac_pendulum",
        "td3_pendulum",
        "ppo_gym_cartpole",
        "ppo_mujoco_inverted_pendulum",
    ],
)
def test_seed_0_reaches_the_target_return_in_time(config, target, limit_s, tmp_path):
    summary, wall = train(config, "seed=0", tmp_path=tmp_path)
    assert summary["final_eval_return"] >= target, summary
    assert wall < limit_s, f"{wall:.1f} s"


@pytest.mark.slow
def test_dqn_cartpole_reaches_475_on_at_least_3_of_seeds_0_to_3(tmp_path):
    """DQN's greedy CartPole return at the end of the shipped budget, over seeds: it ends at
    500 on most seeds and lower on some (6 of seeds 0-7 in benchmarks/RESULTS.md), so one seed
    passing says little. One `jaxrl-engine sweep`: the four members in one compiled program,
    on two forced CPU devices."""
    summary, wall = train(
        "configs/dqn_cartpole.yaml",
        "seeds=0..3",
        tmp_path=tmp_path,
        verb="sweep",
        env={**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"},
    )
    with open(summary["csv"], newline="") as f:
        returns = {int(row["seed"]): float(row["final_eval_return"]) for row in csv.DictReader(f)}
    assert sorted(returns) == [0, 1, 2, 3], returns
    assert sum(r >= 475 for r in returns.values()) >= 3, returns
    assert wall < 300, f"{wall:.1f} s"
