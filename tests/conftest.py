"""Shared fixtures: a small, fast config so that unit tests compile in seconds."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# One persistent XLA compilation cache for the whole test session: the pytest process, its xdist
# workers and every subprocess a test starts inherit it through the environment (set before JAX
# is imported). Most of the suite's time is compiling small programs that other tests compile
# again (the same config under another seed, run directory or test); a hit loads the executable
# the miss compiled, so results are unchanged. tests/core + tests/algos took 12.5 min with it,
# 18.1 min without, on a 2-core AMD EPYC VM. The session's cache starts empty and is removed at
# the end; a JAX_COMPILATION_CACHE_DIR set by the caller is used (and kept) instead.
_SESSION_CACHE: str | None = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _SESSION_CACHE = tempfile.mkdtemp(prefix="jaxrl-engine-tests-xla-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _SESSION_CACHE
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

# The suite compiles at XLA's backend optimization level 0 (LLVM's -O0 on a CPU) with XLA's
# older CPU fusion emitters (`--xla_cpu_use_fusion_emitters=false`), set on import of this module
# for the pytest process, its workers and the subprocesses they start. Compiling is most of the
# suite's time and a test's programs run briefly: the README's library-and-sweep test took
# 110.8 s at the default level and 71.9 s at level 0 (its compiles 75.6 s and 34.9 s), while the
# default config's epochs run ~3.4x slower at level 0 (benchmarks/RESULTS.md, "The test suite at
# XLA's optimization level 0"); the older emitters halve what is left of the compile at level 0
# (RESULTS.md, "The test suite's XLA flags, session 34"). The flags change how fast a program
# compiles and runs, not what it computes: results differ in float rounding only, and each
# comparison in a test is between programs compiled with the same flags. The runs that train to
# a target return (tests/test_targets.py, also the torch targets) compile with XLA's defaults,
# as a user's run does: `subprocess_env(default_level=True)`. A flag the caller set in XLA_FLAGS
# is kept, and the emitter flag is passed only to an XLA that knows it (XLA aborts on a flag it
# does not know, and this one goes when the older emitters do).
OPT_LEVEL = "--xla_backend_optimization_level"
FUSION_EMITTERS = "--xla_cpu_use_fusion_emitters"
SUITE_FLAGS = (OPT_LEVEL, FUSION_EMITTERS)


def _xla_knows(flag: str) -> bool:
    """Whether this jaxlib's XLA starts with `flag` in XLA_FLAGS (a fresh process: XLA reads
    its flags once, when JAX first starts a backend)."""
    env = {**os.environ, "XLA_FLAGS": flag, "JAX_PLATFORMS": "cpu"}
    code = "import jax; jax.devices()"
    return (
        subprocess.run([sys.executable, "-c", code], env=env, capture_output=True).returncode == 0
    )


def _add_xla_flag(flag: str, value: str, probe: bool = False) -> None:
    flags = os.environ.get("XLA_FLAGS", "")
    if flag not in flags and (not probe or _xla_knows(f"{flag}={value}")):
        os.environ["XLA_FLAGS"] = f"{flags} {flag}={value}".strip()


_add_xla_flag(OPT_LEVEL, "0")
_add_xla_flag(FUSION_EMITTERS, "false", probe=True)


def subprocess_env(devices: int | None = None, default_level: bool = False) -> dict[str, str]:
    """The environment for a fresh Python: the suite's XLA flags, with `devices` forced CPU
    devices (XLA_FLAGS must be set before JAX starts) and, with `default_level`, XLA's default
    optimization level and emitters (the flags `SUITE_FLAGS` names)."""
    flags = [
        f
        for f in os.environ.get("XLA_FLAGS", "").split()
        if not f.startswith("--xla_force_host_platform_device_count")
        and not (default_level and f.startswith(SUITE_FLAGS))
    ]
    if devices is not None:
        flags.append(f"--xla_force_host_platform_device_count={devices}")
    return {**os.environ, "XLA_FLAGS": " ".join(flags)}


import jax.numpy as jnp  # noqa: E402  (after the cache's environment)

import jaxrl_engine as jre  # noqa: E402
from jaxrl_engine.envs.gymnax_env import GymnaxEnv  # noqa: E402
from jaxrl_engine.io.compile_cache import enable_compile_cache  # noqa: E402

if _SESSION_CACHE is not None:  # in case a plugin imported JAX before this module
    enable_compile_cache(_SESSION_CACHE)


def pytest_unconfigure(config):
    if _SESSION_CACHE is not None:
        shutil.rmtree(_SESSION_CACHE, ignore_errors=True)


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
    env = subprocess_env(devices=4)
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


class NaNRewardsFrom(GymnaxEnv):
    """CartPole whose rewards become NaN from env step `start` on (counted per env, never reset
    by episode ends): with 16 steps per epoch, start=32 poisons epoch 3."""

    def __init__(self, start: int):
        super().__init__("CartPole-v1")
        self.start = start

    def reset(self, key, params):
        obs, state = super().reset(key, params)
        return obs, (state, jnp.int32(0))

    def step(self, key, state, action, params):
        inner, t = state
        obs, inner, reward, terminated, truncated, info = super().step(key, inner, action, params)
        reward = jnp.where(t >= self.start, jnp.nan, reward)
        return obs, (inner, t + 1), reward, terminated, truncated, info
