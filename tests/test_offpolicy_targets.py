"""Off-policy training targets through the CLI, as a user runs it: return and wall time incl.
compile (issue 4). Slow: CI runs them."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def cli_train(config: str, *overrides: str, tmp_path: Path) -> tuple[dict, float]:
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
def test_dqn_cartpole_reaches_475_within_180s(tmp_path):
    summary, wall = cli_train("configs/dqn_cartpole.yaml", "seed=0", tmp_path=tmp_path)
    assert summary["final_eval_return"] >= 475, summary
    assert wall < 180, f"{wall:.1f} s"


@pytest.mark.slow
def test_sac_pendulum_reaches_minus_200_within_180s(tmp_path):
    summary, wall = cli_train("configs/sac_pendulum.yaml", "seed=0", tmp_path=tmp_path)
    assert summary["final_eval_return"] >= -200, summary
    assert wall < 180, f"{wall:.1f} s"
