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

import os
import sys
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
