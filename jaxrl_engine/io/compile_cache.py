"""JAX's persistent compilation cache, switched on by the `compile_cache_dir` config key."""

from __future__ import annotations

from pathlib import Path

import jax
from jax.experimental.compilation_cache import compilation_cache


def enable_compile_cache(directory: str | Path) -> None:
    """Cache every compiled executable under `directory`, however short its compile.

    JAX only caches compiles over 1 s by default; the engine's phases compile in 0.1-3 s, so the
    threshold is lowered to 0 (a second run then skips almost all of warm_up's compile time).
    JAX opens its cache at the process's first compile and keeps that directory; when another
    one (from `JAX_COMPILATION_CACHE_DIR`, or an earlier call) is already set, the cache is
    reset so the next compile opens `directory`.
    """
    Path(directory).mkdir(parents=True, exist_ok=True)
    if jax.config.jax_compilation_cache_dir not in (None, str(directory)):  # type: ignore[attr-defined]
        compilation_cache.reset_cache()
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
