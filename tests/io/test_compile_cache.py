"""`compile_cache_dir`: JAX's persistent compilation cache, switched on from the config.

Run in a fresh process: JAX initialises its cache once per process, so a test process that
compiled anything before this test would keep its earlier cache setting.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import subprocess_env

SCRIPT = """
import sys, jax
import jaxrl_engine as jre
cfg = jre.load_config(None, ["env.num_envs=4", "eval.num_envs=4", "algo.num_steps=16",
    "algo.num_minibatches=2", "algo.hidden_sizes=[16,16]", "progress=false",
    "compile_cache_dir=" + sys.argv[1]])
engine = jre.build(cfg)
engine.warm_up(engine.init(jax.random.key(0)), phases=["evaluate"])  # (the quickest to compile)
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


HITS = (
    """
import jax
hits = []
jax.monitoring.register_event_listener(
    lambda event, **kw: hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None
)
"""
    + SCRIPT.replace('"compile_cache_dir=" + sys.argv[1]', "*sys.argv[1:]")
    + """
print("HITS", len(hits))
"""
)


def _run_auto(tmp_path, *overrides: str, jax_dir: str | None = None) -> tuple[int, str]:
    # XLA's default flags, as a user's run compiles: under the suite's faster-compiling flags
    # (tests/conftest.py) the small programs compile in under JAX's own 1 s threshold
    env = {k: v for k, v in subprocess_env(default_level=True).items() if not k.startswith("JAX_")}
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    if jax_dir is not None:
        env["JAX_COMPILATION_CACHE_DIR"] = jax_dir
    proc = subprocess.run(
        [sys.executable, "-c", HITS, *overrides],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return int(proc.stdout.split("HITS")[-1]), proc.stderr


def test_auto_caches_in_the_users_cache_folder_and_a_second_run_loads(tmp_path):
    """The default (`auto`): the first process compiles into $XDG_CACHE_HOME/jaxrl_engine/xla/
    <this CPU>, the second loads the same programs from there instead of compiling them."""
    from jaxrl_engine.io.compile_cache import host_tag

    hits, _ = _run_auto(tmp_path)
    folder = tmp_path / "xdg" / "jaxrl_engine" / "xla" / host_tag()
    entries = sorted(p.name for p in folder.iterdir())
    assert hits == 0 and any("evaluate" in name for name in entries), entries
    hits, _ = _run_auto(tmp_path)
    assert hits >= 1
    assert sorted(p.name for p in folder.iterdir() if not p.name.endswith("-atime")) == sorted(
        name for name in entries if not name.endswith("-atime")
    )  # nothing compiled again


def test_auto_uses_jaxs_own_folder_when_set_and_null_caches_nothing(tmp_path):
    jax_dir = tmp_path / "jax-own"
    _run_auto(tmp_path, jax_dir=str(jax_dir))
    assert any(jax_dir.iterdir()) and not (tmp_path / "xdg").exists()
    _run_auto(tmp_path, "compile_cache_dir=null")
    assert not (tmp_path / "xdg").exists()


def test_auto_without_a_writable_cache_folder_runs_uncached(tmp_path):
    (tmp_path / "xdg").write_text("a file where the cache folder would go")
    hits, err = _run_auto(tmp_path)
    assert hits == 0 and "no compile cache" in err and "compile_cache_dir" in err


def test_the_default_folder_follows_xdg_and_names_the_cpu(monkeypatch, tmp_path):
    from jaxrl_engine.io.compile_cache import default_cache_dir, host_tag

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "jaxrl_engine" / "xla" / host_tag()
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir().parent == Path.home() / ".cache" / "jaxrl_engine" / "xla"
    assert host_tag().startswith(platform.machine()) and len(host_tag().rsplit("-", 1)[1]) == 12


def test_auto_sets_no_cache_in_a_multi_process_run(monkeypatch, tmp_path, capsys):
    """JAX writes cache entries from process 0 only: per-node folders would leave the processes
    compiling differently, so `auto` asks for a shared folder instead."""
    import jax

    from jaxrl_engine.io.compile_cache import configure_compile_cache

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    before = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", None)  # (no JAX folder of its own)
    try:
        assert configure_compile_cache("auto") is None
        assert jax.config.jax_compilation_cache_dir is None
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
    assert "multi-process run" in capsys.readouterr().err and not any(tmp_path.iterdir())
