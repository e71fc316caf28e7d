"""Logging backends behind one interface: JSONL (always), TensorBoard, Weights & Biases.

The driver pulls each epoch's metrics to the host once (one `device_get` per epoch, nothing per
step) and hands the record to `RunDir.log`, which appends it to `metrics.jsonl` and fans it out
to every other backend selected by the config key `loggers`. A backend is anything with
`log(record)` and `close()`; the record is a flat dict of Python floats/ints keyed like the
metrics (`evaluate/episode_return`), plus `epoch`, `env_steps` and `wall_s`. Backends import
their library lazily, so `import jaxrl_engine` never needs wandb.

With `log_interval` N > 1 the run directory writes one record per window of epochs instead
(`window_record`): a long off-policy run of small epochs (16 env steps each) otherwise writes
a record every 16 env steps, and its files grow with the run.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Protocol

from jaxrl_engine.io.config import Config
from jaxrl_engine.io.tfevents import EventFileWriter

# Record fields that index the curve rather than being metrics.
INDEX_KEYS = ("epoch", "env_steps", "wall_s")


# How `window_record` merges a metric over a window's epochs; a metric not named here is
# averaged. Counts add up; states and counters (a version, a schedule's value) are their last
# value; a flag is whether it was ever set.
SUMMED = frozenset({"rollout/episodes"})
LAST = frozenset(
    {
        "sync_weights/version",
        "update_dataset/buffer_size",
        "update_dataset/priority_beta",
        "train/epsilon",
        "train/alpha",
        "train/lr",
    }
)
EVER = frozenset({"update_dataset/buffer_overflowed"})
# Means over the episodes that ended in the window (an epoch's value is the mean over the
# episodes that ended in it, weighted here by `rollout/episodes`; with none, the last value).
PER_EPISODE = frozenset({"rollout/episode_return", "rollout/episode_length"})


def window_record(records: list[dict[str, Any]]) -> dict[str, Any]:
    """One record for a window of consecutive epochs' records: `epoch`, `env_steps` and
    `wall_s` of its last epoch; `rollout/episode_return` and `rollout/episode_length` the means
    over the episodes that ended in the window (the last epoch's, carried, when none did);
    `rollout/episodes` their number; the metrics of `LAST` their last value, of `EVER` their
    maximum, every other metric its mean over the epochs that have it (an evaluation's, which
    only the window's last epoch has, as it is). A NaN is a value not computed that epoch
    (`jre.every` pads the epochs it skips with NaN, off-policy losses are NaN before
    `learning_starts`): it is left out, and a metric NaN in every epoch stays NaN."""
    if len(records) == 1:
        return records[0]
    last = records[-1]
    episodes = [r.get("rollout/episodes") for r in records]
    weighted = all(_is_number(c) for c in episodes)
    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for r in records for k in r):  # (in order of appearance)
        present = [r[key] for r in records if key in r]
        if key in INDEX_KEYS or key in LAST or not all(_is_number(v) for v in present):
            out[key] = last.get(key, present[-1])
            continue
        known = [v for v in present if not math.isnan(v)]
        if not known:
            out[key] = present[-1]
        elif key in SUMMED:
            out[key] = sum(known)
        elif key in EVER:
            out[key] = max(known)
        elif key in PER_EPISODE and weighted:
            ended = [(c, r[key]) for c, r in zip(episodes, records, strict=True) if c and key in r]
            total = sum(c for c, _ in ended)
            out[key] = sum(c * v for c, v in ended) / total if total else present[-1]
        else:  # (plain sums: an inf and a -inf give NaN, which nan_guard=false lets through)
            out[key] = sum(known) / len(known)
    return out


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


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
