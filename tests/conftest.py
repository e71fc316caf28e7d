"""Shared fixtures: a small, fast config so that unit tests compile in seconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import jaxrl_engine as jre

SMALL = [
    "env.num_envs=4",
    "eval.num_envs=4",
    "eval.interval=2",
    "algo.num_steps=16",
    "algo.num_minibatches=2",
    "algo.update_epochs=2",
    "algo.hidden_sizes=[16,16]",
    "total_env_steps=256",
    "progress=false",
]


def small_config(*overrides: str, tmp_path=None) -> jre.Config:
    extra = [f"run_dir={tmp_path}"] if tmp_path is not None else []
    return jre.load_config(None, [*SMALL, *extra, *overrides])


@pytest.fixture
def small_cfg(tmp_path) -> jre.Config:
    return small_config(tmp_path=tmp_path)


def run_on_four_devices(script: str, *args: str) -> dict:
    """Run `script` in a fresh Python with 4 forced CPU devices (XLA_FLAGS must be set before
    JAX starts) from the repository root; return the JSON object it printed last."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    proc = subprocess.run(
        [sys.executable, "-c", script, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
