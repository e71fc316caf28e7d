"""Faults from outside, through the `jaxrl-engine train` process: Ctrl-C at any moment and a
full disk. Each gives one message and a documented exit status, never a traceback, and keeps
the last good checkpoint. (A fresh process is the point: signals and resource limits.)"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import jaxrl_engine as jre
from jaxrl_engine import cli
from jaxrl_engine.io.checkpoint import Checkpointer
from jaxrl_engine.run.run_dir import LOCK_FILE
from tests.conftest import SMALL

ROOT = Path(__file__).resolve().parents[2]
CHILD = """
import sys
from jaxrl_engine import cli
sys.exit(cli.main(["train", *sys.argv[1:]]))
"""


def start(*args: str, script: str = CHILD) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(condition, proc: subprocess.Popen, what: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, (what, proc.communicate())
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def assert_one_message(err: str, *fragments: str) -> None:
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("jaxrl-engine: ")]
    assert lines, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


def test_ctrl_c_during_imports_exits_130_with_a_message(tmp_path):
    proc = start(*SMALL, f"run_dir={tmp_path}")
    time.sleep(0.4)  # python is starting or importing jax
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == cli.EXIT_CTRL_C, err
    assert_one_message(err, "interrupted (Ctrl-C) before training started")
    assert out == ""


def test_ctrl_c_during_compile_exits_130_without_a_resume_hint(tmp_path):
    proc = start(*SMALL, f"run_dir={tmp_path}", "name=c")
    wait_for(lambda: (tmp_path / "c" / LOCK_FILE).is_file(), proc, "the run to start")
    proc.send_signal(signal.SIGINT)  # the driver is compiling its phases now
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == cli.EXIT_CTRL_C, err
    assert_one_message(err, "before training started")
    assert "--resume" not in err
    assert not list((tmp_path / "c").rglob("epoch_*"))  # nothing trained, nothing saved


def test_sigterm_during_compile_is_named_as_such(tmp_path):
    proc = start(*SMALL, f"run_dir={tmp_path}", "name=t")
    wait_for(lambda: (tmp_path / "t" / LOCK_FILE).is_file(), proc, "the run to start")
    proc.send_signal(signal.SIGTERM)  # as `timeout` or a scheduler stops a job
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == cli.EXIT_CTRL_C, err
    assert_one_message(err, "interrupted (SIGTERM) before training started")
    assert "Ctrl-C" not in err


def test_ctrl_c_while_training_without_checkpoints_gives_no_resume_hint(tmp_path):
    proc = start(*SMALL, f"run_dir={tmp_path}", "name=s", "save_interval=0", "total_env_steps=2e6")
    metrics = tmp_path / "s" / "metrics.jsonl"
    wait_for(lambda: metrics.is_file() and metrics.stat().st_size > 0, proc, "the first epoch")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == cli.EXIT_INTERRUPTED, err
    assert_one_message(err, "save_interval=0 writes no checkpoint", "nothing to resume")
    assert "--resume" not in err
    assert json.loads(out.splitlines()[-1])["status"] == "interrupted"


DISK_FULL = """
import resource, signal, sys
from jaxrl_engine import cli
from jaxrl_engine.run import host_hooks

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead
save = host_hooks.Checkpointing.save
LIMIT = int(sys.argv.pop(1))

def save_then_fill_the_disk(self, run, state):
    save(self, run, state)
    if run.done == 2:  # from here on no file may grow past LIMIT bytes
        resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))

host_hooks.Checkpointing.save = save_then_fill_the_disk
sys.exit(cli.main(["train", *sys.argv[1:]]))
"""


@pytest.mark.parametrize(
    "limit, where",
    [(0, "every write (metrics first)"), (8000, "the checkpoint of epoch 4 (its files > 8 kB)")],
)
def test_a_full_disk_stops_the_run_with_one_message_and_keeps_the_last_checkpoint(
    limit, where, tmp_path
):
    proc = start(
        str(limit),
        *SMALL,
        f"run_dir={tmp_path}",
        "name=full",
        "save_interval=2",
        "eval.interval=1",
        "loggers=[jsonl]",
        script=DISK_FULL,
    )
    _out, err = proc.communicate(timeout=300)
    assert proc.returncode == cli.EXIT_OS_ERROR, (where, err)
    assert_one_message(err, "stopped by an OS error", "File too large", "epoch_2")
    assert err.count("jaxrl-engine: ") == 1 and len(err) < 2000, err
    run = tmp_path / "full"
    assert not [p for p in run.rglob("*") if "tmp" in p.name], list(run.rglob("*"))
    cfg = jre.load_config(run / "config.yaml")
    checkpoints = Checkpointer(run / "checkpoints", read_only=True)
    try:
        assert checkpoints.epochs() == [2]
        state, _info = checkpoints.restore(jre.build(cfg))  # intact: CRCs and checksum pass
        assert int(state.counters.epoch) == 2
    finally:
        checkpoints.close()
