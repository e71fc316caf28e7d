"""Multi-process training on loopback: 2 processes x 2 CPU devices (gloo collectives) against
one process with 4 devices, checkpoints across process counts, and a process that dies.

Every test starts fresh processes: a process joins a job (`jax.distributed`) before JAX starts,
and once.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from jaxrl_engine.distributed.launch import free_port
from tests.conftest import subprocess_env

REPO = Path(__file__).resolve().parents[2]
TINY = [
    "env.num_envs=8",
    "eval.num_envs=8",
    "algo.num_steps=16",
    "algo.num_minibatches=2",
    "algo.update_epochs=2",
    "algo.hidden_sizes=[16,16]",
    "total_env_steps=2048",  # 16 epochs
    "eval.interval=4",
    "save_interval=8",
    "progress=false",
    "loggers=[jsonl]",
]
CLI = [sys.executable, "-m", "jaxrl_engine.cli"]
# Launched jobs that are not about heartbeats: on 2 cores shared with the other pytest worker,
# a healthy process can go tens of seconds without a heartbeat getting through, so these jobs
# allow 300 s rather than fail for a reason they do not test.
PATIENT = "distributed.heartbeat_timeout_s=300"


def cli(args: list[str], n_devices: int, timeout: float = 420) -> subprocess.CompletedProcess:
    """Run the CLI; past `timeout`, every process of it prints its threads' stacks (SIGUSR1,
    which `jaxrl-engine launch` passes on) and the test fails showing them."""
    proc = subprocess.Popen(
        [*CLI, *args],
        env=subprocess_env(devices=n_devices),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)
        time.sleep(5)
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"{args[:6]} ran past {timeout} s; the stacks:\n{stderr[-20000:]}")
    assert proc.returncode == 0, f"{stderr[:3000]}\n...\n{stderr[-3000:]}"
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def params(run: Path) -> dict[str, np.ndarray]:
    with np.load(run / "policy" / "params.npz") as f:
        return {k: f[k] for k in f.files}


def assert_same_params(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """The same config trained by 2 processes x 2 devices (`jaxrl-engine launch`) and by 1
    process x 4 devices."""
    root = tmp_path_factory.mktemp("multihost")
    common = [*TINY, f"run_dir={root}"]
    launched = cli(
        ["launch", "-n", "2", "--cpu-devices", "2", "--", "train", *common, PATIENT, "name=two"],
        4,
    )
    cli(["train", *common, "name=one"], 4)
    (root / "launch_stdout.txt").write_text(launched.stdout)
    (root / "launch_stderr.txt").write_text(launched.stderr)
    return root


@pytest.mark.multidevice
def test_two_processes_train_the_params_of_one_process_with_as_many_devices(runs):
    two, one = runs / "two", runs / "one"
    assert_same_params(params(two), params(one))
    stderr = (runs / "launch_stderr.txt").read_text()
    assert "process 0 of 2" in stderr and "process 1 of 2" in stderr
    assert "2 local of 4 devices" in stderr
    # One run directory, written once by process 0: 16 records, one summary.
    records = [json.loads(line) for line in (two / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == list(range(1, 17))
    theirs = [json.loads(line) for line in (one / "metrics.jsonl").read_text().splitlines()]
    for mine, other in zip(records, theirs, strict=True):
        assert mine["train/loss"] == pytest.approx(other["train/loss"], rel=1e-4, abs=1e-6)
    # stdout is the summary alone: Gloo's C++ connection line goes to stderr.
    (line,) = (runs / "launch_stdout.txt").read_text().strip().splitlines()
    summary = json.loads(line)
    assert summary["status"] == "completed" and summary["epochs"] == 16
    assert "[Gloo]" in stderr
    written = json.loads((two / "summary.json").read_text())
    assert written["final_eval_return"] == summary["final_eval_return"]
    assert sorted(p.name for p in (two / "checkpoints").iterdir()) == ["epoch_16", "epoch_8"]


@pytest.mark.multidevice
def test_a_two_process_checkpoint_resumes_in_one_process(runs, tmp_path):
    """The 2-process run's epoch-8 checkpoint (env state sharded over both processes, checked
    by its sum64 checksums) continued by one process with one device ends where the
    uninterrupted runs do (1 process x 4 devices gave the same when tried)."""
    run = tmp_path / "two"
    subprocess.run(["cp", "-r", str(runs / "two"), str(run)], check=True)
    (run / "policy" / "params.npz").unlink()
    meta = json.loads((run / "checkpoints" / "epoch_8" / "meta" / "metadata").read_text())
    sharded = [leaf["path"] for leaf in meta["leaves"] if leaf.get("sum64") is not None]
    assert ".env.obs" in sharded and all(
        leaf["crc32"] is None for leaf in meta["leaves"] if leaf["path"] in sharded
    )
    cli(["train", "--resume", str(run), "--from-checkpoint", "8"], 1)
    assert_same_params(params(run), params(runs / "one"))


@pytest.mark.multidevice
def test_a_process_that_dies_stops_the_other_with_its_last_checkpoint_intact(tmp_path):
    """Process 1 is killed (SIGKILL) after the first checkpoint: process 0 ends on its own
    within the heartbeat timeout, naming the cause, and the checkpoint restores."""
    port = free_port()
    args = [
        *TINY,
        "total_env_steps=200000",  # far more than the test waits for
        "save_interval=2",
        f"run_dir={tmp_path}",
        "name=dies",
        f"distributed.coordinator=127.0.0.1:{port}",
        "distributed.num_processes=2",
        "distributed.heartbeat_timeout_s=5",
    ]
    procs = [
        subprocess.Popen(
            [*CLI, "train", *args, f"distributed.process_id={i}"],
            env=subprocess_env(devices=2),
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    try:
        checkpoints = tmp_path / "dies" / "checkpoints"
        deadline = time.monotonic() + 300
        while not any(p.name.removeprefix("epoch_").isdigit() for p in _listing(checkpoints)):
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            assert all(p.poll() is None for p in procs), procs[0].stderr.read()[-2000:]
            time.sleep(0.5)
        procs[1].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        _, err = procs[0].communicate(timeout=120)
        stopped_after = time.monotonic() - killed_at
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert procs[0].returncode != 0
    assert stopped_after < 60
    assert "another task died" in err or "stopped sending heartbeats" in err, err[-2000:]
    assert "Traceback" not in err, err[-3000:]  # (a failed collective is one message)
    # The last committed checkpoint is whole: one process restores it (its checksums pass).
    script = (
        "import sys, jaxrl_engine as jre\n"
        "engine, state = jre.resume(sys.argv[1])\n"
        "print(int(state.counters.epoch))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "dies")],
        env=subprocess_env(devices=2),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(proc.stdout.split()[-1]) >= 2


def _listing(path: Path) -> list[Path]:
    return list(path.iterdir()) if path.is_dir() else []


@pytest.mark.multidevice
def test_a_sweep_over_two_processes_equals_it_in_one(tmp_path):
    """2 seeds x 2 learning rates: the member axis over 2 processes x 2 devices, then in one
    process with 4 devices; every member's final params are the same."""
    common = [
        *[item for item in TINY if not item.startswith(("total_env_steps", "save_interval"))],
        "total_env_steps=1024",
        "save_interval=4",
        "seeds=0..1",
        "algo.lr=[0.0003,0.001]",
        f"run_dir={tmp_path}",
    ]
    launched = cli(
        ["launch", "-n", "2", "--cpu-devices", "2", "--", "sweep", *common, PATIENT, "name=two"],
        4,
    )
    cli(["sweep", *common, "name=one"], 4)
    summary = json.loads(launched.stdout.strip().splitlines()[-1])
    assert summary["members"] == 4 and summary["completed"] == 4
    members = sorted(p.name for p in (tmp_path / "one").iterdir() if p.name.startswith("seed"))
    assert len(members) == 4
    for member in members:
        assert_same_params(params(tmp_path / "two" / member), params(tmp_path / "one" / member))
    rows = (tmp_path / "two" / "sweep.csv").read_text().strip().splitlines()
    assert len(rows) == 1 + 4


def test_launch_stops_and_reports_a_failing_job(tmp_path):
    """Every process refuses a bad key: the launcher returns their exit status (2)."""
    proc = subprocess.run(
        [*CLI, "launch", "-n", "2", "--", "train", "bogus.key=1", f"run_dir={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "unknown config key 'bogus'" in proc.stderr
    assert "exited with status 2" in proc.stderr
    assert "process 0 of 2" not in proc.stderr  # refused before joining the job


def test_a_terminal_ctrl_c_stops_a_launched_job_once_with_a_checkpoint(tmp_path):
    """Ctrl-C in a terminal signals the whole foreground process group: each process must see
    it once (from the launcher), stop after its epoch with a checkpoint and the summary, and
    the job exit 75, not take the second-signal path (exit at once, no checkpoint)."""
    args = [*TINY, "total_env_steps=2e6", "save_interval=1000", PATIENT, f"run_dir={tmp_path}"]
    proc = subprocess.Popen(
        [*CLI, "launch", "-n", "2", "--", "train", *args, "name=job"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        start_new_session=True,  # its own process group, as a shell gives a foreground job
    )
    metrics = tmp_path / "job" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.is_file() and metrics.stat().st_size > 0):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no epoch in 300 s"
        time.sleep(0.2)
    # The processes are outside the launcher's group (two SIGINTs sent at once may merge into
    # one pending signal, so the exit status alone would not show a double delivery).
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    assert len(children) == 2 and all(os.getpgid(int(c)) != proc.pid for c in children)
    os.killpg(proc.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 75, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["status"] == "interrupted" and summary["checkpoint"] is not None, summary
    assert Path(summary["checkpoint"]).is_dir()
    assert "before training starts" not in err, err[-3000:]


def test_distributed_keys_are_checked_before_jax_starts():
    proc = subprocess.run(
        [*CLI, "train", "distributed.coordinator=localhost", "distributed.num_processes=2"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 2
    assert "config key 'distributed.coordinator': 'localhost' is not HOST:PORT" in proc.stderr


def join_alone(port: int, process_id: int, *extra: str) -> subprocess.CompletedProcess:
    """`train` as one process of a 2-process job on 127.0.0.1:`port`, the other never started."""
    job = [f"distributed.coordinator=127.0.0.1:{port}", "distributed.num_processes=2"]
    return subprocess.run(
        [*CLI, "train", *job, f"distributed.process_id={process_id}", *extra],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


def test_a_busy_port_an_absent_coordinator_and_a_missing_process_exit_2_naming_them():
    # jaxlib crashed on each (SIGSEGV binding a taken port; SIGABRT with a C++ stack trace
    # when no coordinator answers or a process never joins).
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = join_alone(port, 0)
    assert proc.returncode == 2, proc.stderr
    assert f"on port {port}, which cannot be opened on this machine" in proc.stderr
    began = time.monotonic()
    proc = join_alone(free_port(), 1, "distributed.init_timeout_s=2")
    assert proc.returncode == 2, proc.stderr
    assert "no coordinator answered at 127.0.0.1:" in proc.stderr
    assert "init_timeout_s=2" in proc.stderr and time.monotonic() - began < 60
    proc = join_alone(free_port(), 0, "distributed.init_timeout_s=2")
    assert proc.returncode == 2, proc.stderr
    assert "process(es) [1] of 2 did not join at 127.0.0.1:" in proc.stderr


@pytest.mark.multidevice
def test_processes_given_different_configs_are_refused_naming_the_keys(tmp_path):
    # One process with another learning rate trained silently with it; another num_envs
    # ended both in a gloo abort. Both processes exit 2 before anything is built.
    port = free_port()
    job = [f"distributed.coordinator=127.0.0.1:{port}", "distributed.num_processes=2", PATIENT]
    procs = [
        subprocess.Popen(
            [
                *CLI,
                "train",
                *TINY,
                *job,
                f"distributed.process_id={i}",
                f"run_dir={tmp_path}",
                *extra,
            ],
            env=subprocess_env(devices=1),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for i, extra in ((0, ["algo.lr=0.001"]), (1, ["env.num_envs=16"]))
    ]
    errors = [p.communicate(timeout=300)[1] for p in procs]
    for proc, err in zip(procs, errors, strict=True):
        assert proc.returncode == 2, err[-3000:]
        assert "process 1: algo.lr, env.num_envs" in err, err[-3000:]
    assert not (tmp_path / "ppo_cartpole").exists()


SLURM_TWO_TASKS = {
    "SLURM_JOB_ID": "7",
    "SLURM_STEP_NODELIST": "node[1-2]",
    "SLURM_NTASKS": "2",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "0",
}


@pytest.mark.parametrize(
    ("environ", "launch"),
    [
        ({}, None),
        (SLURM_TWO_TASKS, "SLURM"),
        ({**SLURM_TWO_TASKS, "SLURM_NTASKS": "1"}, None),  # a one-task job: one process
        ({k: v for k, v in SLURM_TWO_TASKS.items() if k != "SLURM_STEP_NODELIST"}, None),
        (
            {"OMPI_MCA_orte_hnp_uri": "1.0;tcp://10.0.0.1:1", "OMPI_COMM_WORLD_SIZE": "4"},
            "Open MPI",
        ),
        ({"OMPI_MCA_orte_hnp_uri": "1.0;tcp://10.0.0.1:1", "OMPI_COMM_WORLD_SIZE": "1"}, None),
    ],
)
def test_a_cluster_launch_is_read_from_the_environment(environ, launch):
    from jaxrl_engine.distributed.multihost import cluster_launch

    assert cluster_launch(environ) == launch


def test_joining_after_jax_started_is_refused_and_one_process_needs_no_join():
    """In this (pytest) process JAX has started: a job to join is a clear error naming the fix;
    settings that describe no job leave it alone."""
    import jax.numpy as jnp

    import jaxrl_engine as jre
    from jaxrl_engine.distributed import join

    jnp.zeros(1).block_until_ready()  # JAX has started
    none = jre.load_distributed(None, ["distributed.auto=false"])
    assert join(none) is False
    job = jre.load_distributed(
        None,
        [
            "distributed.coordinator=127.0.0.1:1",
            "distributed.num_processes=2",
            "distributed.process_id=0",
        ],
    )
    with pytest.raises(jre.ConfigError, match="JAX has already started in this process"):
        join(job)
