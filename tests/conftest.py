"""Shared fixtures: a small, fast config so that unit tests compile in seconds."""

from __future__ import annotations

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
