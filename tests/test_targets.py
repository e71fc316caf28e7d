"""Training targets, through the CLI as a user runs it: the return reached at the budget.
Slow: CI runs them (issues 2 and 4).

The issues' wall-time targets (PPO CartPole within 60 s, ...) are measured by
`benchmarks/targets.py` (fresh processes, several runs, median; benchmarks/RESULTS.md): a test
sharing 2 cores with another worker on whatever CPU CI draws is no timer (the PPO CartPole test
took 36-44 s in CI's suite on an Intel Xeon VM, 63-66 s in the suite on an AMD EPYC one). Here a run must finish within
`HANG_FACTOR` times its target: a guard against a run that stalls, not the target itself.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import subprocess_env

ROOT = Path(__file__).resolve().parents[1]
HANG_FACTOR = 2.5


def _needs(module: str) -> pytest.MarkDecorator:
    """Skip a row whose extra (`module`) is not installed."""
    return pytest.mark.skipif(
        importlib.util.find_spec(module) is None, reason=f"{module} is not installed"
    )


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
    # XLA's default optimization level, as a user's run compiles (the suite's is 0, conftest.py)
    env = subprocess_env(default_level=True) if env is None else env
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
    wall = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), wall


def sweep_rows(summary: dict) -> dict[int, dict]:
    """A sweep's `sweep.csv` rows by seed."""
    with open(summary["csv"], newline="") as f:
        return {int(row["seed"]): row for row in csv.DictReader(f)}


@pytest.mark.slow
def test_ppo_cartpole_reaches_475_at_1m_steps_on_seeds_0_to_2(tmp_path):
    """The default config, seeds 0-2, as one `jaxrl-engine sweep` (one compiled program; each
    member is its seed's run up to float rounding, tests/distributed/test_sweep.py): one
    process and one compile instead of three. Its wall time as a single run (target 60 s) is
    `benchmarks/targets.py`'s."""
    summary, wall = train(
        "configs/ppo_cartpole.yaml", "seeds=0..2", tmp_path=tmp_path, verb="sweep"
    )
    rows = sweep_rows(summary)
    assert sorted(rows) == [0, 1, 2], rows
    for seed, row in rows.items():
        assert row["status"] == "completed" and int(row["env_steps"]) >= 1_000_000, row
        assert float(row["final_eval_return"]) >= 475, (seed, row)
    assert wall < HANG_FACTOR * 3 * 60, f"{wall:.1f} s"


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
            marks=_needs("mujoco"),
        ),
        # Brax physics inside the compiled rollout (the brax extra, in dev): seed 0 reached 1000
        # (the maximum) at 717k of the 1M env steps; the initial policy scores ~20
        # (tests/envs/test_brax_env.py). Most of its wall time is Brax's import and compile.
        pytest.param(
            "configs/ppo_brax_inverted_pendulum.yaml",
            900,
            240,
            marks=_needs("brax"),
        ),
    ],
    ids=[
        "ppo_pendulum",
        "sac_pendulum",
        "td3_pendulum",
        "ppo_gym_cartpole",
        "ppo_mujoco_inverted_pendulum",
        "ppo_brax_inverted_pendulum",
    ],
)
def test_seed_0_reaches_the_target_return_in_time(config, target, limit_s, tmp_path):
    summary, wall = train(config, "seed=0", tmp_path=tmp_path)
    assert summary["final_eval_return"] >= target, summary
    assert wall < HANG_FACTOR * limit_s, f"{wall:.1f} s"


@pytest.mark.slow
def test_ppo_minatar_breakout_leaves_the_plateau_by_410k_steps(tmp_path):
    """Breakout-MinAtar, the shipped config (lr 1e-3), seed 0, the first 409,600 of its 10M env
    steps (50 epochs, one evaluation). Greedy eval there: seeds 0-4 on an H200 15.4, 18.6, 20.5,
    22.2, 23.8 and seed 0 on this project's CPU 20.1; with gymnax-blines' lr 5e-4 6.0, 6.6,
    7.0, 11.2, 11.6, the start of a plateau at ~7 that lasted 2-5M env steps
    (benchmarks/RESULTS.md). At 10M the lr 1e-3 seeds end at mean 61.0, min 29.0 (anchor:
    gymnax-blines' PPO, 28)."""
    summary, wall = train(
        "configs/ppo_minatar_breakout.yaml", "seed=0", "total_env_steps=409600", tmp_path=tmp_path
    )
    assert summary["env_steps"] == 409_600
    assert summary["final_eval_return"] >= 12, summary
    assert wall < HANG_FACTOR * 150, f"{wall:.1f} s"


@pytest.mark.slow
def test_dqn_cartpole_ends_at_475_on_seeds_0_to_3(tmp_path):
    """DQN's final greedy CartPole return over seeds 0-3 at the shipped budget (500k steps,
    PureJaxRL's and CleanRL's settings with the squared-error loss): seeds 0-7 all ended at 500
    in one sweep of 8 on this AMD VM (benchmarks/RESULTS.md), where the Zoo-style
    configs/dqn_cartpole_zoo.yaml swings between 500 and ~100 late in training. Checked: at
    least 3 of the 4 end >= 475 (the issue's 7 of 8), and every one learns: its best evaluation
    >= 250, ten times a random policy's ~22 (in one suite run seed 1 ended at 266, best 374,
    while 0, 2 and 3 ended at 500; which seed lags moves with the CPU's floating-point code).
    One `jaxrl-engine sweep`: the four members in one compiled program, on two forced CPU
    devices; evaluation every 100k steps only."""
    summary, wall = train(
        "configs/dqn_cartpole.yaml",
        "seeds=0..3",
        "eval.interval=1000",
        tmp_path=tmp_path,
        verb="sweep",
        env=subprocess_env(devices=2, default_level=True),
    )
    rows = sweep_rows(summary)
    assert sorted(rows) == [0, 1, 2, 3], rows
    final = {seed: float(row["final_eval_return"]) for seed, row in rows.items()}
    returns = {}
    for seed, row in rows.items():
        with open(Path(summary["run_dir"]) / row["member"] / "metrics.jsonl") as f:
            records = [json.loads(line) for line in f]
        returns[seed] = [
            r["evaluate/episode_return"] for r in records if "evaluate/episode_return" in r
        ]
    assert all(len(r) == 5 and r[-1] == final[seed] for seed, r in returns.items()), returns
    assert sum(v >= 475 for v in final.values()) >= 3, final
    assert all(max(r) >= 250 for r in returns.values()), returns
    assert wall < HANG_FACTOR * 600, f"{wall:.1f} s"
