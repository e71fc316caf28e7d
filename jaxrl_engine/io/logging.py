"""Logging backends behind one interface: JSONL (always), TensorBoard, Weights & Biases.

The driver pulls each epoch's metrics to the host once (one `device_get` per epoch, nothing per
step) and hands the record to `RunDir.log`, which appends it to `metrics.jsonl` and fans it out
to every other backend selected by the config key `loggers`. A backend is anything with
`log(record)` and `close()`; the record is a flat dict of Python floats/ints keyed like the
metrics (`evaluate/episode_return`), plus `epoch`, `env_steps` and `wall_s`. Backends import
their library lazily, so `import jaxrl_engine` never needs wandb.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Protocol

from jaxrl_engine.io.config import Config
from jaxrl_engine.io.tfevents import EventFileWriter

# Record fields that index the curve rather than being metrics.
INDEX_KEYS = ("epoch", "env_steps", "wall_s")


class Logger(Protocol):
    def log(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The finite metrics of a record (index fields and NaN "no episode yet" values dropped)."""
    out = {}
    for key, value in record.items():
        if key in INDEX_KEYS or isinstance(value, bool | str) or value is None:
            continue
        value = float(value)
        if math.isfinite(value):
            out[key] = value
    return out


class TensorBoardLogger:
    """TensorBoard event files in the run directory (`jaxrl_engine.io.tfevents`: no TensorFlow,
    no tensorboardX).

    Every metric is a scalar tagged by its name (`evaluate/episode_return`) at step = env steps,
    so curves from runs with different epoch sizes line up; the event wall time is the real one.
    One event per record holds all its scalars, written through to the file. The file opens at
    the first record with `purge_step` at its env steps: a resumed run replaces what an
    interrupted one logged after its checkpoint, instead of doubling it.
    """

    def __init__(self, path: Path):
        self._path = path
        self._writer: EventFileWriter | None = None

    def log(self, record: dict[str, Any]) -> None:
        step = int(record["env_steps"])
        if self._writer is None:
            self._writer = EventFileWriter(self._path, purge_step=step)
        self._writer.add_scalars(step, scalars(record))

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


class WandbLogger:
    """Weights & Biases (`pip install 'jaxrl-engine[wandb]'`): one `wandb.log` per epoch.

    The run is named after the config's `name`, its config is the resolved config, and the step
    axis is env steps (`env_steps` is logged as a metric too, for wandb's x-axis selector).
    """

    def __init__(self, path: Path, cfg: Config):
        wandb = import_wandb()
        self._run = wandb.init(
            project=cfg.wandb.project,
            entity=cfg.wandb.entity,
            mode=cfg.wandb.mode,
            name=cfg.name,
            dir=str(path),
            config=cfg.model_dump(mode="json"),
        )

    def log(self, record: dict[str, Any]) -> None:
        values: dict[str, Any] = scalars(record)
        values["env_steps"] = int(record["env_steps"])
        values["wall_s"] = float(record["wall_s"])
        self._run.log(values, step=int(record["env_steps"]))

    def close(self) -> None:
        self._run.finish()


def import_wandb() -> Any:
    try:
        import wandb
    except ImportError:
        raise ImportError(
            "config key 'loggers' lists 'wandb' but wandb is not installed: "
            "pip install 'jaxrl-engine[wandb]' (or remove 'wandb' from loggers)"
        ) from None
    return wandb


def make_loggers(path: Path, cfg: Config) -> list[Logger]:
    """The backends `cfg.loggers` selects besides JSONL, which `RunDir` itself always writes
    (`metrics.jsonl` is what `plot`, `eval` and resume read)."""
    loggers: list[Logger] = []
    for name in cfg.loggers:
        if name == "tensorboard":
            loggers.append(TensorBoardLogger(path))
        elif name == "wandb":
            loggers.append(WandbLogger(path, cfg))
    return loggers
