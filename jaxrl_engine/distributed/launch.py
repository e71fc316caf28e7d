"""`jaxrl-engine launch -n N [--cpu-devices D] -- train CONFIG [key=value ...]`: N processes of
one job on this machine, joined over loopback (127.0.0.1), for trying multi-process training
without a cluster (on a cluster, the scheduler starts the processes: `examples/slurm/`).

Each process runs the given `jaxrl-engine` command with `distributed.coordinator`,
`distributed.num_processes` and `distributed.process_id` added (and
`XLA_FLAGS=--xla_force_host_platform_device_count=D` with `--cpu-devices D`). Process 0's
stdout is passed through (its last line is the run's summary); the others' stdout is dropped
(their summaries repeat it); every process's stderr is shown. When one process fails, the
others are stopped at once (SIGTERM, then SIGKILL after a grace period) and the launcher exits
with the failed process's status; SIGINT/SIGTERM to the launcher are passed on to all of them
once (each process stops after its epoch with a checkpoint, and the launcher waits for them),
and SIGUSR1 too (each process prints every thread's stack: what a stuck job is doing). The
processes run in their own sessions, so a terminal's Ctrl-C (sent to the whole foreground
process group) reaches them only through the launcher, not twice (a second signal ends a
process at once). On Linux a process also gets SIGTERM when the launcher dies without
stopping it (SIGKILL).

Standard library only: it starts processes and watches them, JAX starts in each of them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence

GRACE_S = 10.0  # after SIGTERM, before SIGKILL
POLL_S = 0.2


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def commands(
    n: int, command: Sequence[str], port: int, cpu_devices: int | None = None
) -> list[tuple[list[str], dict[str, str]]]:
    """Per process: its argv and environment."""
    out = []
    for i in range(n):
        argv = [
            sys.executable,
            "-m",
            "jaxrl_engine.cli",
            *command,
            f"distributed.coordinator=127.0.0.1:{port}",
            f"distributed.num_processes={n}",
            f"distributed.process_id={i}",
        ]
        env = dict(os.environ)
        if cpu_devices is not None:
            flags = [
                f
                for f in env.get("XLA_FLAGS", "").split()
                if not f.startswith("--xla_force_host_platform_device_count")
            ]
            flags.append(f"--xla_force_host_platform_device_count={cpu_devices}")
            env["XLA_FLAGS"] = " ".join(flags)
        out.append((argv, env))
    return out


def _wait(procs: list[subprocess.Popen[bytes]], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(POLL_S)


def _stop(procs: list[subprocess.Popen[bytes]], sig: int = signal.SIGTERM) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(sig)
    _wait(procs, GRACE_S)
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the launcher dies (Linux prctl PR_SET_PDEATHSIG),
    so that a launcher killed outright leaves no process of the job behind."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def launch(n: int, command: Sequence[str], cpu_devices: int | None = None, port: int = 0) -> int:
    """Run `command` (a jaxrl-engine verb and its arguments) as `n` processes of one job;
    returns the job's exit status (0 when every process succeeded)."""
    port = port or free_port()
    print(
        f"jaxrl-engine launch: {n} processes on 127.0.0.1:{port}"
        + (f", {cpu_devices} CPU devices each" if cpu_devices else ""),
        file=sys.stderr,
    )
    procs: list[subprocess.Popen[bytes]] = []
    received: list[int] = []

    def forward(signum: int, frame: object) -> None:
        if signum != signal.SIGUSR1:
            received.append(signum)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    previous = {
        s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
    }
    try:
        for i, (argv, env) in enumerate(commands(n, command, port, cpu_devices)):
            stdout = None if i == 0 else subprocess.DEVNULL
            procs.append(
                subprocess.Popen(
                    argv,
                    env=env,
                    stdout=stdout,
                    preexec_fn=_die_with_parent,
                    start_new_session=True,  # (signals come through `forward` only)
                )
            )
        while True:
            codes = [p.poll() for p in procs]
            failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if failed and received:
                # Every process was signalled and is stopping on its own (checkpoint, summary):
                # wait for all, then report process 0's status (the others' repeat it).
                _wait(procs, GRACE_S)
                first = procs[0].returncode
                code = first if first is not None and first != 0 else failed[0][1]
                _stop(procs)
                return code if code > 0 else 128 - code
            if failed:
                i, code = failed[0]
                print(
                    f"jaxrl-engine launch: process {i} exited with status {code}; stopping "
                    "the others",
                    file=sys.stderr,
                )
                _stop(procs)
                return code if code > 0 else 128 - code  # killed by a signal: 128 + signum
            if all(c == 0 for c in codes):
                return 0
            time.sleep(POLL_S)
    finally:
        _stop(procs)
        for s, handler in previous.items():
            signal.signal(s, handler)
