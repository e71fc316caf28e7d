"""`compile_cache_dir`: JAX's persistent compilation cache, switched on from the config.

Run in a fresh process: JAX initialises its cache once per process, so a test process that
compiled anything before this test would keep its earlier cache setting.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = """
import sys, jax
import jaxrl_engine as jre
cfg = jre.load_config(None, ["env.num_envs=4", "eval.num_envs=4", "algo.num_steps=16",
    "algo.num_minibatches=2", "algo.hidden_sizes=[16,16]", "progress=false",
    "compile_cache_dir=" + sys.argv[1]])
engine = jre.build(cfg)
engine.warm_up(engine.init(jax.random.key(0)), phases=["epoch"])
"""


@pytest.mark.parametrize("jax_env_cache", [False, True], ids=["alone", "over_JAX_env_var"])
def test_compile_cache_dir_receives_the_compiled_phases(tmp_path, jax_env_cache):
    """Also when JAX_COMPILATION_CACHE_DIR names another directory (the test session sets one):
    the config's directory is the one that receives the executables."""
    cache, other = tmp_path / "xla-cache", tmp_path / "from-env"
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    if jax_env_cache:
        env["JAX_COMPILATION_CACHE_DIR"] = str(other)
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(cache)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert cache.is_dir() and any(cache.iterdir())  # (what compiled before `build` may be in other)
