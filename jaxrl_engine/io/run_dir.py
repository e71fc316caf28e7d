"""A run directory: resolved config, `metrics.jsonl`, `summary.json`."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from jaxrl_engine.io.config import Config, dump_config


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

    def log(self, record: dict[str, Any]) -> None:
        self._metrics.write(json.dumps({k: _jsonable(v) for k, v in record.items()}) + "\n")
        self._metrics.flush()

    def write_summary(self, summary: dict[str, Any]) -> None:
        tmp = self.path / "summary.json.tmp"
        tmp.write_text(json.dumps({k: _jsonable(v) for k, v in summary.items()}, indent=2))
        os.replace(tmp, self.path / "summary.json")

    def close(self) -> None:
        self._metrics.close()
