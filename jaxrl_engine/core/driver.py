"""The Python driver around the compiled phases: epochs, evaluation, logging, progress.

Host hooks live here (timing, logging, progress); traced hooks are already inside the phases.
By default each epoch is ONE compiled call; `profile: true` runs the four phases as separate
compiled calls so each gets its own timer (same results, see tests/core/test_driver.py).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from jaxrl_engine.core.hooks import check_guards
from jaxrl_engine.core.state import EngineState
from jaxrl_engine.io.run_dir import RunDir

if TYPE_CHECKING:
    from jaxrl_engine.core.engine import Engine


def _progress(enabled: bool) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]} steps/s"),
        TextColumn("eval {task.fields[eval]}"),
        TimeElapsedColumn(),
        disable=not enabled,
    )


def run(
    engine: Engine,
    state: EngineState,
    *,
    num_epochs: int | None = None,
    run_dir: str | Path | None = None,
    progress: bool | None = None,
) -> tuple[EngineState, list[dict[str, float]]]:
    """Train from `state` up to `num_epochs` epochs in total (default: the config's).

    Evaluates every `eval.interval` epochs and after the last; writes `metrics.jsonl` and
    `summary.json` to `run_dir` (default `<run_dir>/<name>`). Returns the final state and the
    per-epoch records.
    """
    from jaxrl_engine.core.engine import EPOCH_PHASES

    cfg = engine.cfg
    total = engine.num_epochs if num_epochs is None else num_epochs
    first = int(jax.device_get(state.counters.epoch))
    out = RunDir(run_dir if run_dir is not None else Path(cfg.run_dir) / cfg.name, cfg)
    wall_start = time.perf_counter()
    needed = [*EPOCH_PHASES, "evaluate"] if cfg.profile else ["epoch", "evaluate"]
    missing = [name for name in needed if name not in engine._compiled]
    if missing:
        state = engine.warm_up(state, phases=missing)
    compile_s = engine.compile_seconds
    history: list[dict[str, float]] = []
    final_eval = float("nan")
    train_start = time.perf_counter()
    show = cfg.progress if progress is None else progress
    try:
        with _progress(show) as bar:
            task = bar.add_task(cfg.name, total=total, completed=first, rate="-", eval="-")
            for epoch in range(first, total):
                if cfg.profile:
                    metrics: dict[str, Any] = {}
                    for name in EPOCH_PHASES:
                        state, m = engine.timed_call(name, state)
                        metrics.update(m)
                    state = jax.device_put(state, engine.state_sharding)
                else:
                    state, metrics = engine.timed_call("epoch", state)
                done = epoch + 1
                if done % cfg.eval.interval == 0 or done == total:
                    state, eval_metrics = engine.timed_call("evaluate", state)
                    metrics = {**metrics, **eval_metrics}
                metrics = jax.device_get(metrics)
                check_guards(metrics, engine.guarded_names, done)
                elapsed = time.perf_counter() - train_start
                env_steps = done * engine.steps_per_epoch
                record = {
                    "epoch": done,
                    "env_steps": env_steps,
                    "wall_s": time.perf_counter() - wall_start,
                    **{
                        k: float(np.asarray(v))
                        for k, v in metrics.items()
                        if not k.startswith("guard/")
                    },
                }
                if "evaluate/episode_return" in record:
                    final_eval = record["evaluate/episode_return"]
                out.log(record)
                history.append(record)
                rate = (env_steps - first * engine.steps_per_epoch) / max(elapsed, 1e-9)
                bar.update(task, completed=done, rate=f"{rate:,.0f}", eval=f"{final_eval:.1f}")
        train_s = time.perf_counter() - train_start
        trained_steps = (total - first) * engine.steps_per_epoch
        summary = {
            "name": cfg.name,
            "final_eval_return": final_eval,
            "epochs": total,
            "env_steps": total * engine.steps_per_epoch,
            "requested_env_steps": cfg.total_env_steps,
            "wall_s": time.perf_counter() - wall_start,
            "train_s": train_s,
            "compile_s": compile_s,
            "steps_per_second": trained_steps / max(train_s, 1e-9),
            "run_dir": str(out.path),
        }
        out.write_summary(summary)
    finally:
        out.close()
    engine.last_summary = summary
    return state, history
