"""JAX's persistent compilation cache, switched on by the `compile_cache_dir` config key.

`compile_cache_dir: auto` (the default) keeps compiled programs in the user's cache folder, so
that a second run of a config (another seed, run directory or value of a traced hyperparameter
such as `algo.lr`; not another size) loads its programs instead of compiling them: the default run's
compile goes from ~4.5 s to ~1 s on a 2-core CPU (benchmarks/RESULTS.md, issue 15). A path
names the folder; null leaves JAX's own setting alone.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
from pathlib import Path

import jax
from jax.experimental.compilation_cache import compilation_cache

from jaxrl_engine.io.config import AUTO_COMPILE_CACHE as AUTO

# What `auto` caches: compiles of at least this long (the engine's programs take 0.2-3 s; the
# many tiny jits of a user's own code in the same process are not worth a file each).
AUTO_MIN_COMPILE_S = 0.1
# `auto`'s size bound: least recently used entries go first (one config's programs: ~0.6 MB).
AUTO_MAX_BYTES = 1 << 30


def host_tag() -> str:
    """The machine's architecture and a hash of its CPU's features: executables compiled for
    one CPU (AVX-512, say) must not be loaded on another, e.g. from a home folder shared over
    a cluster's network; JAX's cache key does not hold the CPU's features."""
    features = platform.processor()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):  # x86 / ARM
                    features = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    digest = hashlib.sha256(features.encode()).hexdigest()[:12]
    return f"{platform.machine() or 'cpu'}-{digest}"


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/jaxrl_engine/xla/<host tag>` (default `~/.cache/...`)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "jaxrl_engine" / "xla" / host_tag()


def configure_compile_cache(setting: str | None) -> Path | None:
    """Apply a config's `compile_cache_dir`; returns the folder in use (None: no cache).

    null: nothing changes. auto: JAX's own cache folder when one is set (the
    `JAX_COMPILATION_CACHE_DIR` variable or `jax.config`, with JAX's own thresholds), else
    `default_cache_dir()`; when that cannot be made (a read-only home), the run goes on without
    a cache and says so. In a multi-process run `auto` sets no cache: JAX writes entries from
    process 0 only, so per-node folders would leave the processes compiling differently; a
    shared folder is given as a path. A path: that folder, whatever JAX had
    (`enable_compile_cache`).
    """
    if setting is None:
        return None
    if setting != AUTO:
        enable_compile_cache(setting)
        return Path(setting)
    current = jax.config.jax_compilation_cache_dir  # type: ignore[attr-defined]
    if current:
        return Path(current)
    if jax.process_count() > 1:
        print(
            "jaxrl-engine: no compile cache in a multi-process run unless compile_cache_dir names "
            "a folder all processes share",
            file=sys.stderr,
        )
        return None
    try:
        directory = default_cache_dir()
        directory.mkdir(parents=True, exist_ok=True)
    except (OSError, RuntimeError) as e:  # (RuntimeError: no home folder to be found)
        print(
            f"jaxrl-engine: no compile cache ({e}); set compile_cache_dir to a writable folder "
            "or to null",
            file=sys.stderr,
        )
        return None
    # (a minimum compile time the user set, i.e. not JAX's default of 1 s, is kept)
    keep = jax.config.jax_persistent_cache_min_compile_time_secs != 1.0  # type: ignore[attr-defined]
    enable_compile_cache(directory, min_compile_s=None if keep else AUTO_MIN_COMPILE_S)
    if jax.config.jax_compilation_cache_max_size == -1:  # type: ignore[attr-defined]
        # (JAX's size bound locks the folder with `filelock`, a dependency of this package)
        jax.config.update("jax_compilation_cache_max_size", AUTO_MAX_BYTES)
    return directory


def enable_compile_cache(directory: str | Path, min_compile_s: float | None = 0.0) -> None:
    """Cache every compiled executable of at least `min_compile_s` under `directory`.

    JAX only caches compiles over 1 s by default; the engine's phases compile in 0.1-3 s, so the
    threshold is lowered (to 0 by default: a second run then skips almost all of warm_up's
    compile time; None keeps JAX's current threshold). JAX decides at the process's first
    compile whether and where it caches and keeps that; unless `directory` is already the one
    in use, the cache is reset so that the next compile opens `directory` (also after compiles
    without a cache).
    """
    Path(directory).mkdir(parents=True, exist_ok=True)
    if jax.config.jax_compilation_cache_dir != str(directory):  # type: ignore[attr-defined]
        compilation_cache.reset_cache()
    jax.config.update("jax_compilation_cache_dir", str(directory))
    if min_compile_s is not None:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", min_compile_s)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
