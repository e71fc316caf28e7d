"""Runs that survive: SIGKILL and exact resume, a crash inside the checkpoint writer, SIGINT and
SIGTERM, a second SIGINT. Each test runs real training processes (`tests/core/run_child.py` or
the `jaxrl-engine` executable) on a tiny config; they share one XLA compilation cache, so only
the first process of the module pays for compiling."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

import jaxrl_engine as jre
from jaxrl_engine.io.checkpoint import TMP_SUFFIX, Checkpointer
from tests.conftest import SMALL

ROOT = Path(__file__).resolve().parents[2]
EXECUTABLE = Path(sys.executable).parent / "jaxrl-engine"
TIMING = {"wall_s"}  # the only fields of metrics.jsonl that may differ between runs
# 10 epochs of 4 envs x 16 steps; evaluation every 3 epochs (and after the last).
TEN_EPOCHS = [*SMALL, "total_env_steps=640", "eval.interval=3", "save_interval=5"]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("xla_cache")


def child(mode: str, run_dir: Path, overrides: list[str], cache: Path, **env: str):
    """A `run_child` process (stdout piped, one `epoch N` line per epoch)."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.core.run_child",
            mode,
            str(run_dir),
            *overrides,
            f"compile_cache_dir={cache}",
        ],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_line(proc: subprocess.Popen, wanted: str, timeout: float = 300) -> list[str]:
    """Read stdout lines until `wanted` (the process must still be running then)."""
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"process ended before {wanted!r}: {proc.stderr.read()[-3000:]}")
        lines.append(line.strip())
        if line.strip() == wanted or line.startswith(wanted):
            return lines
    raise AssertionError(f"no {wanted!r} within {timeout}s")


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def run_to_end(mode: str, run_dir: Path, overrides: list[str], cache: Path) -> None:
    rc, _, err = finish(child(mode, run_dir, overrides, cache))
    assert rc == 0, err[-3000:]


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def without_timing(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def checkpoint_epochs(run_dir: Path) -> list[int]:
    checkpoints = Checkpointer(run_dir / "checkpoints", read_only=True)
    try:
        return checkpoints.epochs()
    finally:
        checkpoints.close()


def restore(run_dir: Path, overrides: list[str], epoch: int | None = None):
    engine = jre.build(jre.load_config(None, overrides))
    checkpoints = Checkpointer(run_dir / "checkpoints", read_only=True)
    try:
        return checkpoints.restore(engine, epoch)
    finally:
        checkpoints.close()


def state_bytes(state) -> list[tuple[str, str, bytes]]:
    """(path, dtype, bytes) of every leaf; keys as their key data."""
    flat = jax.tree_util.tree_flatten_with_path(state.replace(rng=jax.random.key_data(state.rng)))[
        0
    ]
    return [
        (jax.tree_util.keystr(p), str(x.dtype), np.asarray(jax.device_get(x)).tobytes())
        for p, x in flat
    ]


def assert_same_final_state(run_a: Path, run_b: Path, overrides: list[str]) -> None:
    a, info_a = restore(run_a, overrides, 10)
    b, info_b = restore(run_b, overrides, 10)
    assert int(a.counters.epoch) == int(b.counters.epoch) == 10
    leaves_a, leaves_b = state_bytes(a), state_bytes(b)
    assert [p for p, _, _ in leaves_a] == [p for p, _, _ in leaves_b]
    for (path, dtype_a, bytes_a), (_, dtype_b, bytes_b) in zip(leaves_a, leaves_b, strict=True):
        assert dtype_a == dtype_b and bytes_a == bytes_b, f"{path} differs"
    assert info_a.metrics_log["records"] == info_b.metrics_log["records"] == 10
    assert without_timing(records(run_a)[:10]) == without_timing(records(run_b)[:10])


@pytest.fixture(scope="module")
def straight_ppo(tmp_path_factory, cache_dir) -> Path:
    """10 PPO epochs in one process, never interrupted."""
    run_dir = tmp_path_factory.mktemp("straight") / "ppo"
    run_to_end("fresh", run_dir, TEN_EPOCHS, cache_dir)
    return run_dir


def sigkill_in_epoch_7_and_resume(run_dir: Path, overrides: list[str], cache: Path) -> None:
    proc = child("fresh", run_dir, overrides, cache, PAUSE_IN_EPOCH="7")
    seen = wait_for_line(proc, "in epoch 7")
    assert "epoch 6" in seen and "epoch 7" not in seen
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    # Killed inside epoch 7: six epochs logged, the last checkpoint is epoch 5's.
    assert [r["epoch"] for r in records(run_dir)] == [1, 2, 3, 4, 5, 6]
    assert checkpoint_epochs(run_dir) == [5]
    run_to_end("resume", run_dir, [], cache)


def test_sigkill_in_epoch_7_then_resume_equals_ten_straight_epochs_bitwise(
    straight_ppo, tmp_path, cache_dir
):
    run_dir = tmp_path / "ppo"
    sigkill_in_epoch_7_and_resume(run_dir, TEN_EPOCHS, cache_dir)

    assert_same_final_state(straight_ppo, run_dir, TEN_EPOCHS)
    # metrics.jsonl continues without duplicate or missing epochs, equal but for timing.
    resumed, straight = records(run_dir), records(straight_ppo)
    assert [r["epoch"] for r in resumed] == list(range(1, 11))
    assert without_timing(resumed) == without_timing(straight)
    assert checkpoint_epochs(run_dir) == checkpoint_epochs(straight_ppo) == [5, 10]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["epochs"] == 10


def test_sigkill_and_exact_resume_for_dqn(tmp_path, cache_dir):
    dqn = [
        *(item for item in TEN_EPOCHS if not item.startswith("algo.")),
        "algo.name=dqn",
        "algo.num_steps=16",
        "algo.buffer_size=512",
        "algo.batch_size=32",
        "algo.learning_starts=64",
        "algo.hidden_sizes=[16,16]",
        "algo.target_update_interval=8",
    ]
    straight = tmp_path / "straight"
    run_to_end("fresh", straight, dqn, cache_dir)
    run_dir = tmp_path / "dqn"
    sigkill_in_epoch_7_and_resume(run_dir, dqn, cache_dir)
    assert_same_final_state(straight, run_dir, dqn)
    assert without_timing(records(run_dir)) == without_timing(records(straight))


def test_kill_inside_the_checkpoint_writer_keeps_the_previous_checkpoint(
    straight_ppo, tmp_path, cache_dir
):
    overrides = [*TEN_EPOCHS, "save_interval=2"]
    run_dir = tmp_path / "ppo"
    proc = child("fresh", run_dir, overrides, cache_dir, KILL_IN_CHECKPOINT_WRITER="4")
    rc, out, err = finish(proc)
    assert rc == -signal.SIGKILL, err[-3000:]
    assert "killed while writing epoch_4" in out
    # The write was under way: its files sit in orbax's temporary directory, never committed.
    assert list((run_dir / "checkpoints").glob(f"epoch_4{TMP_SUFFIX}*"))
    assert checkpoint_epochs(run_dir) == [2]
    state, info = restore(run_dir, overrides)
    assert info.epoch == 2 and int(state.counters.epoch) == 2
    assert info.metrics_log["records"] == 2

    run_to_end("resume", run_dir, [], cache_dir)
    assert not list((run_dir / "checkpoints").glob(f"*{TMP_SUFFIX}*"))
    assert checkpoint_epochs(run_dir) == [6, 8, 10]
    assert_same_final_state(straight_ppo, run_dir, overrides)
    assert without_timing(records(run_dir)) == without_timing(records(straight_ppo))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_finishes_the_epoch_checkpoints_writes_summary_and_exits_75(
    sig, tmp_path, cache_dir
):
    run_dir = tmp_path / "run"
    endless = [
        *SMALL,
        "total_env_steps=64000000",  # a million epochs: only the signal ends it
        "save_interval=100000",  # so the checkpoint on disk is the one the signal asked for
        f"run_dir={tmp_path}",
        "name=run",
        f"compile_cache_dir={cache_dir}",
    ]
    proc = subprocess.Popen(
        [str(EXECUTABLE), "train", *endless],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 300
    while not (run_dir / "metrics.jsonl").is_file() or len(records(run_dir)) < 3:
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.05)
    proc.send_signal(sig)
    rc, out, err = finish(proc, timeout=120)

    assert rc == 75, err[-3000:]
    assert f"{sig.name}: stopped after epoch" in err and "--resume" in err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert json.loads(out.strip().splitlines()[-1]) == summary
    logged = [r["epoch"] for r in records(run_dir)]
    last = logged[-1]
    assert logged == list(range(1, last + 1))  # every epoch it started, it finished and logged
    assert summary["status"] == "interrupted" and summary["signal"] == sig.name
    assert summary["epochs"] == last and summary["env_steps"] == last * 64
    assert checkpoint_epochs(run_dir) == [last]
    assert summary["checkpoint"] == str((run_dir / "checkpoints" / f"epoch_{last}").absolute())
    state, info = restore(run_dir, endless)
    assert int(state.counters.epoch) == last and info.metrics_log["records"] == last


def test_a_second_sigint_exits_at_once_and_leaves_a_loadable_run(tmp_path, cache_dir):
    run_dir = tmp_path / "ppo"
    overrides = [*TEN_EPOCHS, "save_interval=2"]
    # Epoch 4 sleeps for two minutes inside its compiled rollout: the first SIGINT can only
    # ask to stop after it; the second must end the process without waiting.
    proc = child("fresh", run_dir, overrides, cache_dir, PAUSE_IN_EPOCH="4")
    wait_for_line(proc, "in epoch 4")
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    rc, _, err = finish(proc, timeout=60)  # the paused epoch alone would take 120 s

    assert rc == 128 + signal.SIGINT, err[-3000:]
    assert "stopping after the epochs running now" in err
    assert checkpoint_epochs(run_dir) == [2]
    assert [r["epoch"] for r in records(run_dir)] == [1, 2, 3]
    state, _ = restore(run_dir, overrides)
    assert int(state.counters.epoch) == 2
    run_to_end("resume", run_dir, [], cache_dir)
    assert [r["epoch"] for r in records(run_dir)] == list(range(1, 11))
