"""`compile_cache_dir`: JAX's persistent compilation cache, switched on from the config."""

from __future__ import annotations

import jax

import jaxrl_engine as jre
from tests.conftest import small_config


def test_compile_cache_dir_receives_the_compiled_phases(tmp_path):
    cache = tmp_path / "xla-cache"
    engine = jre.build(small_config(f"compile_cache_dir={cache}", tmp_path=tmp_path))
    try:
        engine.warm_up(engine.init(jax.random.key(0)), phases=["epoch"])
        assert cache.is_dir() and any(cache.iterdir())
    finally:
        jax.config.update("jax_compilation_cache_dir", None)
