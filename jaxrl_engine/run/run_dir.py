"""A run directory: resolved config, `metrics.jsonl`, `summary.json` (and `checkpoints/`)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxrl_engine.core.state import EngineState
from jaxrl_engine.io.config import Config, dump_config
from jaxrl_engine.io.logging import make_loggers


def _jsonable(value: Any) -> Any:
    value = float(value) if hasattr(value, "dtype") or isinstance(value, float) else value
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else (1e308 if value > 0 else -1e308)
    return value


class RunDir:
    """`runs/<name>/`: created on open; the config is written at once, metrics as they come."""

    def __init__(self, root: str | Path, cfg: Config):
        self.path = Path(root)
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "config.yaml").write_text(dump_config(cfg))
        self._metrics = open(self.path / "metrics.jsonl", "a")  # noqa: SIM115 (closed in close())
        self._backends = make_loggers(self.path, cfg)  # tensorboard, wandb: as `loggers` says

    def log(self, record: dict[str, Any]) -> str:
        """Append one record; returns the line written (without its newline)."""
        line = json.dumps({k: _jsonable(v) for k, v in record.items()})
        self._metrics.write(line + "\n")
        self._metrics.flush()
        for backend in self._backends:
            backend.log(record)
        return line

    def keep_metrics_through(self, epoch: int) -> list[str]:
        """Drop records after `epoch` (left by a run that died after its last checkpoint) and a
        torn last line; returns the lines kept. A fresh run (epoch 0) starts an empty file."""
        path = self.path / "metrics.jsonl"
        lines = read_metrics_lines(path)
        kept = [line for line in lines if json.loads(line).get("epoch", 0) <= epoch]
        if kept != lines or len(lines) != len(path.read_text().splitlines()):
            self._metrics.close()
            write_metrics_lines(self.path, kept)
            self._metrics = open(path, "a")  # noqa: SIM115 (closed in close())
        return kept

    def write_summary(self, summary: dict[str, Any]) -> None:
        tmp = self.path / "summary.json.tmp"
        tmp.write_text(json.dumps({k: _jsonable(v) for k, v in summary.items()}, indent=2))
        os.replace(tmp, self.path / "summary.json")

    def close(self) -> None:
        self._metrics.close()
        for backend in self._backends:
            backend.close()


def read_metrics_lines(path: Path) -> list[str]:
    """The complete records of a `metrics.jsonl` (a torn last line, from a kill, is dropped)."""
    if not path.is_file():
        return []
    lines = []
    for line in path.read_text().splitlines():
        try:
            json.loads(line)
        except json.JSONDecodeError:
            break
        lines.append(line)
    return lines


def write_metrics_lines(run_path: Path, lines: list[str]) -> None:
    """Replace `<run_path>/metrics.jsonl` by `lines`, atomically (temp file + `os.replace`)."""
    tmp = run_path / "metrics.jsonl.tmp"
    tmp.write_text("".join(line + "\n" for line in lines))
    os.replace(tmp, run_path / "metrics.jsonl")


def write_failing_batch(
    out: RunDir, state: EngineState, metrics: dict[str, Any], epoch: int
) -> Path:
    """The failing epoch's rollout buffer, prepared batch, last observations and metrics."""
    arrays: dict[str, np.ndarray] = {}
    for name, tree in (
        ("buffer", state.buffer),
        ("batch", state.batch),
        ("env.obs", state.env.obs),
    ):
        for keys, leaf in jax.tree_util.tree_flatten_with_path(jax.device_get(tree))[0]:
            arrays[name + jax.tree_util.keystr(keys)] = np.asarray(leaf)
    for name, value in metrics.items():
        arrays[f"metrics/{name}"] = np.asarray(value)
    target = out.path / f"nonfinite_epoch_{epoch}.npz"
    tmp = out.path / f"nonfinite_epoch_{epoch}.tmp.npz"
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)  # type: ignore[arg-type]
    tmp.replace(target)
    return target
