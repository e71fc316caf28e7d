"""Timing: RLightning's per-phase count/total/average, measured after `block_until_ready`."""

from __future__ import annotations

import time

import jax

from jaxrl_engine.core.hooks import Hook
from jaxrl_engine.core.state import EngineState, Metrics, Phase


class Timer:
    """Count, total and average seconds per phase (host side).

    `record(name, seconds, count)` books one measurement that covered `count` runs of the phase
    (the driver times several epochs per compiled call); the average is per run.
    """

    def __init__(self) -> None:
        self.records: dict[str, list[tuple[float, int]]] = {}

    def record(self, name: str, seconds: float, count: int = 1) -> None:
        """Book `seconds` measured over `count` runs of `name` (nothing when `count` < 1)."""
        if count > 0:
            self.records.setdefault(name, []).append((seconds, count))

    def summary(self) -> dict[str, dict[str, float]]:
        """Per name, in the order first recorded: `count` (runs), `total_s` (seconds) and
        `avg_s` (`total_s / count`)."""
        out = {}
        for name, records in self.records.items():
            total = float(sum(s for s, _ in records))
            count = sum(c for _, c in records)
            out[name] = {"count": count, "total_s": total, "avg_s": total / count}
        return out

    def table(self) -> str:
        """`summary()` as a text table: phase, count, total (s), average (ms) per row."""
        rows = self.summary()
        lines = [f"{'phase':<16}{'count':>8}{'total (s)':>12}{'avg (ms)':>12}"]
        for name, r in rows.items():
            lines.append(
                f"{name:<16}{r['count']:>8d}{r['total_s']:>12.3f}{1e3 * r['avg_s']:>12.3f}"
            )
        return "\n".join(lines)


def timed(name: str, timer: Timer) -> Hook:
    """Host transform: time a compiled phase, measured after `block_until_ready`. A call that
    compiles counts its compiling too: `engine.warm_up(state)` first to time the runs only."""

    def transform(phase: Phase) -> Phase:
        def wrapped(state: EngineState) -> tuple[EngineState, Metrics]:
            start = time.perf_counter()
            out = jax.block_until_ready(phase(state))
            timer.record(name, time.perf_counter() - start)
            return out

        return wrapped

    return transform
