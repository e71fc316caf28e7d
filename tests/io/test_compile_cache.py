"""`compile_cache_dir`: JAX's persistent compilation cache, switched on from the config.

Run in a fresh process: JAX initialises its cache once per process, so a test process that
compiled anything before this test would keep its earlier cache setting.
"""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys, jax
import jaxrl_engine as jre
cfg = jre.load_config(None, ["env.num_envs=4", "eval.num_envs=4", "algo.num_steps=16",
    "algo.num_minibatches=2", "algo.hidden_sizes=[16,16]", "progress=false",
    "compile_cache_dir=" + sys.argv[1]])
engine = jre.build(cfg)
engine.warm_up(engine.init(jax.random.key(0)), phases=["epoch"])
"""


def test_compile_cache_dir_receives_the_compiled_phases(tmp_path):
    cache = tmp_path / "xla-cache"
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(cache)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert cache.is_dir() and any(cache.iterdir())
