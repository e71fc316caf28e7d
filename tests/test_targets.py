"""Training targets, through the CLI as a user runs it: return reached, wall time incl. compile.
Slow: CI runs them (issues 2 and 4)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def train(config: str, *overrides: str, tmp_path: Path) -> tuple[dict, float]:
    cmd = [
        sys.executable,
        "-m",
        "jaxrl_engine.cli",
        "train",
        str(ROOT / config),
        f"run_dir={tmp_path}",
        "progress=false",
        *overrides,
    ]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path)
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
def test_ppo_pendulum_reaches_minus_250_within_120s(tmp_path):
    summary, wall = train("configs/ppo_pendulum.yaml", "seed=0", tmp_path=tmp_path)
    assert summary["final_eval_return"] >= -250, summary
    assert wall < 120, f"{wall:.1f} s"


@pytest.mark.slow
def test_dqn_cartpole_reaches_475_within_180s(tmp_path):
    summary, wall = train("configs/dqn_cartpole.yaml", "seed=0", tmp_path=tmp_path)
    assert summary["final_eval_return"] >= 475, summary
    assert wall < 180, f"{wall:.1f} s"


@pytest.mark.slow
def test_sac_pendulum_reaches_minus_200_within_180s(tmp_path):
    summary, wall = train("configs/sac_pendulum.yaml", "seed=0", tmp_path=tmp_path)
    assert summary["final_eval_return"] >= -200, summary
    assert wall < 180, f"{wall:.1f} s"
