"""Multi-process training with JAX's own machinery: `jax.distributed` and a global mesh.

`join(settings)` starts `jax.distributed` for this process when the config's `distributed`
block (or the cluster's launcher) says it is one of several; it must run before anything
starts JAX (the CLI calls it right after reading the `distributed` keys). From there the
engine is unchanged: `jax.devices()` lists every process's devices, the `data` mesh spans them,
jit partitions the phases over it (GSPMD), and the env batch and buffers are sharded across
processes. Only process 0 writes the run directory (logs, summary, policy); every process takes
part in checkpoint saves and restores (orbax writes each process's shards).

A process that dies stops the others: JAX's coordination service notices the missing
heartbeats within `distributed.heartbeat_timeout_s` and ends every other process with
"Terminating process because the JAX distributed service detected fatal errors". Their last
good checkpoint is the last one committed (orbax renames a checkpoint into place only when
every process has written its part).

A process that is alive but stuck is not noticed by the heartbeats: the others wait in their
next collective, which on CPU fails after `distributed.collective_timeout_s`. `kill -USR1` on
a CLI process (or on `jaxrl-engine launch`, which passes it on) prints every thread's stack.

CPU processes exchange data through gloo (`jax_cpu_collectives_implementation`); GPU and TPU
processes use their own collectives.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from typing import Any

from jaxrl_engine.io.config import ConfigError

SLURM_VARS = (
    "SLURM_JOB_ID",
    "SLURM_STEP_NODELIST",
    "SLURM_NTASKS",
    "SLURM_PROCID",
    "SLURM_LOCALID",
)


class DistributedError(RuntimeError):
    """This process could not join the job (coordinator unreachable, a process missing)."""


def cluster_launch(environ: Any = None) -> str | None:
    """The launcher of a multi-process job this process belongs to, read from the environment
    as `jax.distributed.initialize()` reads it (None: none, or a job of one task)."""
    env = os.environ if environ is None else environ
    if all(name in env for name in SLURM_VARS) and _int(env["SLURM_NTASKS"]) > 1:
        return "SLURM"
    if "OMPI_MCA_orte_hnp_uri" in env and _int(env.get("OMPI_COMM_WORLD_SIZE", "1")) > 1:
        return "Open MPI"
    return None


def _int(text: str) -> int:
    return int(text) if text.strip().isdigit() else 0


def join(settings: Any) -> bool:
    """Join the multi-process job `settings` (a config's `distributed` block) describes;
    returns whether this run has more than one process.

    coordinator given: join it as `process_id` of `num_processes`. Else `auto` null: join
    the job a SLURM or Open MPI launch describes, if any; `auto` true: let
    `jax.distributed.initialize()` detect any cluster it knows; false: stay one process.
    Raises `ConfigError` when JAX has started already, `DistributedError` when joining fails.
    A process with no job to join does not import JAX here (nor can it have joined one before
    JAX was imported).
    """
    if "jax" in sys.modules:
        import jax

        if jax.distributed.is_initialized():
            return jax.process_count() > 1
    launch = None
    if settings.coordinator is None and settings.auto is not False:
        launch = cluster_launch() if settings.auto is None else "auto-detected"
    if settings.coordinator is None and launch is None:
        return False
    import jax
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized():
        raise ConfigError(
            "distributed: JAX has already started in this process, so it cannot join a "
            "multi-process job: call jaxrl_engine.distributed.join(cfg.distributed) before "
            "anything uses JAX (load the config with jre.load_distributed first)"
        )
    where = settings.coordinator or launch
    if settings.coordinator is not None and settings.process_id is not None:
        # jaxlib ends the process from C++ (SIGSEGV, SIGABRT) when the port is taken, the
        # coordinator never answers or a process never comes: a rendezvous of our own first.
        rendezvous(
            settings.coordinator,
            settings.process_id,
            settings.num_processes,
            settings.init_timeout_s,
        )
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    _set_collective_timeout(settings.collective_timeout_s)
    try:
        jax.distributed.initialize(
            coordinator_address=settings.coordinator,
            num_processes=settings.num_processes,
            process_id=settings.process_id,
            initialization_timeout=settings.init_timeout_s,
            heartbeat_timeout_seconds=settings.heartbeat_timeout_s,
        )
    except Exception as e:  # e.g. DEADLINE_EXCEEDED: a process never came
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise DistributedError(
            f"cannot join the multi-process job ({where}) as process "
            f"{settings.process_id if settings.process_id is not None else '?'} of "
            f"{settings.num_processes or '?'} within distributed.init_timeout_s="
            f"{settings.init_timeout_s}: {first}"
        ) from None
    print(
        f"jaxrl-engine: process {jax.process_index()} of {jax.process_count()} ({where}); "
        f"{jax.local_device_count()} local of {jax.device_count()} devices",
        file=sys.stderr,
    )
    return jax.process_count() > 1


# What may differ between the processes of a job: each its own id, display, logging (process
# 0 logs), compile cache folder and name for the coordinator's host.
PER_PROCESS_KEYS = (
    "distributed.process_id",
    "distributed.coordinator",
    "progress",
    "loggers",
    "wandb",
    "compile_cache_dir",
)


def check_same_config(described: dict[str, Any], what: str = "config") -> None:
    """ConfigError in every process of a multi-process job whose processes were given
    different configs (a shape differing stopped them in a collective with a gloo abort; a
    hyperparameter differing trained each process with its own, silently). `described`: the
    resolved config as JSON-able data (a sweep's: its seeds and grid too); the keys that may
    differ (`PER_PROCESS_KEYS`) are left out. Two small collectives; nothing in one process."""
    import jax

    if jax.process_count() == 1:
        return
    import numpy as np
    from jax.experimental import multihost_utils

    flat = {k: v for k, v in _flat(described).items() if not _per_process(k)}
    mine = np.frombuffer(json.dumps(flat, sort_keys=True).encode(), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.array([mine.size], np.int32)))
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[: mine.size] = mine
    texts = np.asarray(multihost_utils.process_allgather(padded))
    configs = [
        json.loads(bytes(t[: int(n)]).decode()) for t, n in zip(texts, sizes.ravel(), strict=True)
    ]
    differ = {
        i: sorted(k for k in set(c) | set(configs[0]) if c.get(k) != configs[0].get(k))
        for i, c in enumerate(configs)
    }
    differ = {i: keys for i, keys in differ.items() if keys}
    if differ:
        shown = "; ".join(
            f"process {i}: {', '.join(keys[:5])}{' ...' if len(keys) > 5 else ''}"
            for i, keys in differ.items()
        )
        raise ConfigError(
            f"the job's processes were given different {what}s (keys that differ from process "
            f"0's: {shown}): give every process the same config and overrides (only "
            f"{' and '.join(PER_PROCESS_KEYS)} may differ)"
        )


def _per_process(key: str) -> bool:
    """`key` (or a sweep spec's `config.<key>`) is one of `PER_PROCESS_KEYS` or inside one."""
    parts = key.split(".")
    for start in (0, 1) if parts[0] == "config" else (0,):
        for p in PER_PROCESS_KEYS:
            given = p.split(".")
            if parts[start : start + len(given)] == given:
                return True
    return False


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict) and tree:
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_flat(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: tree}


def _host_port(coordinator: str) -> tuple[str, int]:
    host, _, port = coordinator.rpartition(":")
    return host.strip("[]"), int(port)


HELLO = b"jaxrl-engine join"


def rendezvous(coordinator: str, process_id: int, num_processes: int, timeout_s: float) -> None:
    """Meet every process of the job on the coordinator's port before `jax.distributed` does:
    process 0 listens there (its coordination service binds the port next) until each other
    process has said its id; the others connect until it answers. Each failure is a
    `DistributedError` naming the port, the coordinator or the processes that never came,
    within `timeout_s` (jaxlib's own failures end the process from C++)."""
    deadline = time.monotonic() + timeout_s
    if process_id == 0:
        _host(coordinator, num_processes, deadline, timeout_s)
    else:
        _join(coordinator, process_id, num_processes, deadline, timeout_s)


def _host(coordinator: str, num_processes: int, deadline: float, timeout_s: float) -> None:
    port = _host_port(coordinator)[1]
    try:
        if socket.has_dualstack_ipv6():
            server = socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
        else:
            server = socket.create_server(("", port))
    except OSError as e:
        raise DistributedError(
            f"distributed.coordinator={coordinator}: process 0 runs the job's coordinator on "
            f"port {port}, which cannot be opened on this machine ({e}): choose another port "
            "(the same for every process), unless another process of this job was given "
            "distributed.process_id=0 too"
        ) from None
    waiting = set(range(1, num_processes))
    with server:
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DistributedError(
                    f"cannot start the multi-process job: process(es) {sorted(waiting)} of "
                    f"{num_processes} did not join at {coordinator} within "
                    f"distributed.init_timeout_s={timeout_s} (started with the same "
                    "distributed.coordinator and num_processes?)"
                )
            server.settimeout(min(left, 1.0))
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5.0)
                try:
                    words = conn.recv(256).split()  # b"jaxrl-engine join <id> <count>"
                    if words[:2] != HELLO.split():
                        continue  # not one of the job's processes
                    pid, count = int(words[2]), int(words[3])
                    if count != num_processes:
                        reply = f"process 0 has num_processes={num_processes}, you {count}"
                    elif pid not in waiting:
                        reply = f"process id {pid} is not awaited (a duplicate or out of range)"
                    else:
                        reply = "ok"
                    conn.sendall(reply.encode() + b"\n")
                except (OSError, ValueError, IndexError):
                    continue  # a process that went away mid-handshake comes again
                if reply == "ok":  # (it goes on to jax.distributed from here)
                    waiting.discard(pid)
                    with contextlib.suppress(OSError):
                        conn.recv(1)  # their close first: no TIME_WAIT left on this port


def _join(
    coordinator: str, process_id: int, num_processes: int, deadline: float, timeout_s: float
) -> None:
    host, port = _host_port(coordinator)
    while True:
        try:
            with socket.create_connection((host, port), timeout=5.0) as conn:
                conn.sendall(HELLO + f" {process_id} {num_processes}\n".encode())
                reply = conn.recv(256).decode(errors="replace").strip()
            if reply == "ok":
                return
            if reply:
                raise DistributedError(
                    f"cannot join the multi-process job at {coordinator} as process "
                    f"{process_id}: {reply}"
                )
        except OSError as e:
            problem = e
        else:
            problem = ConnectionError("no answer")
        if time.monotonic() >= deadline:
            raise DistributedError(
                f"cannot join the multi-process job: no coordinator answered at {coordinator} "
                f"within distributed.init_timeout_s={timeout_s} ({problem}); start process 0 "
                "(it runs the coordinator) with the same distributed.coordinator"
            )
        time.sleep(0.25)


def _set_collective_timeout(seconds: int) -> None:
    """Bound every wait in a CPU collective (read by XLA when the backend starts, after this):
    a process that never arrives (stuck, or gone without the coordinator noticing) fails the
    others' collective after `seconds` rather than leaving them waiting forever. Flags the
    user set in XLA_FLAGS are kept."""
    flags = os.environ.get("XLA_FLAGS", "").split()
    for name in (
        "--xla_cpu_collective_timeout_seconds",
        "--xla_cpu_collective_call_terminate_timeout_seconds",
    ):
        if not any(f.startswith(name + "=") for f in flags):
            flags.append(f"{name}={seconds}")
    os.environ["XLA_FLAGS"] = " ".join(flags)
