"""Learning curves from run directories: eval return vs env steps and vs wall time.

Runs whose resolved configs agree on everything but the seed (and where/how they were shown:
name, run_dir, progress, loggers, ...) are one group: plotted as the mean over seeds with the
min-max band shaded. Groups are labelled by the config keys in which they differ (or by name
when there is one group). Figures are built with matplotlib's object API (no pyplot, no GUI
backend), written as PNG or SVG by the file's suffix.

A reference curve (another library's run, a published figure) can be drawn beside the runs: a
JSON file `{"label": ..., "curve": [{"env_steps": ..., "return": ..., "wall_s": ...}, ...]}`
(`wall_s` optional; `benchmarks/brax_reference.py` writes this format), read as data only.
"""

from __future__ import annotations

import csv
import io
import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from jaxrl_engine.io.config import flat_config, is_presentation_key
from jaxrl_engine.io.files import META_FILE, STEP_PREFIX

EVAL_RETURN = "evaluate/episode_return"


@dataclass
class Run:
    path: Path
    config: dict[str, Any]  # flat: {"algo.lr": 0.0005, ...}
    records: list[dict[str, Any]]  # metrics.jsonl


@dataclass
class Curve:
    """One group's series: x and the mean/min/max of the metric over its runs."""

    label: str
    runs: int
    seeds: int  # distinct seeds among the runs (two sweeps may hold the same member)
    env_steps: np.ndarray
    wall_s: np.ndarray  # mean over runs at each point
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray


def sweep_members(path: str | Path) -> list[Path] | None:
    """The member run directories of a sweep's directory (its `sweep.csv`, read as data: a
    member is a plain folder name inside it), those that logged records; None when `path`
    is not a sweep's directory."""
    path = Path(path)
    table = path / "sweep.csv"
    if (path / "metrics.jsonl").exists() or not table.is_file():
        return None
    try:
        rows = list(csv.DictReader(io.StringIO(table.read_text())))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise ValueError(f"{table} is not a readable sweep table ({type(e).__name__})") from None
    names = [str(row.get("member") or "") for row in rows]
    members = [
        path / name
        for name in names
        if name not in ("", ".", "..") and Path(name).name == name and "\\" not in name
    ]
    # (no symlinks: a member is a folder the sweep wrote inside its own directory)
    return [
        m
        for m in members
        if not m.is_symlink()
        and not (m / "metrics.jsonl").is_symlink()
        and (m / "metrics.jsonl").is_file()
    ]


def not_a_sweep(path: str | Path, takes: str) -> str | None:
    """Why `path` cannot be given where `takes` a run directory (e.g. "eval takes"): it is a
    sweep's directory (it holds sweep.json), whose members are the run directories; None when
    it is not one."""
    path = Path(path)
    if not (path / "sweep.json").is_file() or (path / "metrics.jsonl").exists():
        return None
    try:
        members = sweep_members(path) or []
    except ValueError:
        members = []
    example = f", e.g. {members[0]}" if members else ""
    return (
        f"{str(path)!r} is a sweep's directory: {takes} one of its members' run directories"
        f"{example} (its sweep.csv lists them; `jaxrl-engine plot {path}` plots them all)"
    )


def expand_sweeps(paths: Sequence[str | Path]) -> list[Path]:
    """`paths` with each sweep's directory replaced by its members' run directories; a run
    named twice (or a member of two sweeps given) once, so it counts once in a mean."""
    out: list[Path] = []
    seen: set[Path] = set()
    for p in paths:
        members = sweep_members(p)
        if members == []:
            raise FileNotFoundError(f"{p} is a sweep's directory whose members logged no records")
        for run in members if members is not None else [Path(p)]:
            if run.resolve() not in seen:
                seen.add(run.resolve())
                out.append(run)
    return out


def read_run(path: str | Path) -> Run:
    path = Path(path)
    metrics = path / "metrics.jsonl"
    if not metrics.is_file():
        raise FileNotFoundError(f"{path} is not a run directory: it has no metrics.jsonl")
    config_file = path / "config.yaml"
    try:
        config = yaml.safe_load(config_file.read_text()) if config_file.is_file() else {}
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ValueError(f"{config_file} is not a readable config ({type(e).__name__})") from None
    if not isinstance(config, dict | None):
        raise ValueError(f"{config_file} is not a config: it holds a {type(config).__name__}")
    records = []
    text = metrics.read_bytes().decode("utf-8", errors="replace")  # (a damaged file's bytes)
    for line in text.splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # a torn last line from a killed run
            break
    flat = flat_config(config or {})
    algorithm = _trained_algorithm(path)
    if algorithm is not None:  # a user's algorithm given to jre.build: config.yaml's
        flat["algo.name"] = algorithm  # algo.name is the config's, not what trained the run
    return Run(path, flat, records)


def _trained_algorithm(path: Path) -> str | None:
    """The algorithm the run's own records name, read as data: its `summary.json` (a run that
    ended), else its newest checkpoint's metadata (a run in progress or killed); None when
    neither names one (then config.yaml's algo.name stands)."""
    named = _algorithm_in(path / "summary.json")
    if named is not None:
        return named
    folder = path / "checkpoints"
    if folder.is_symlink() or not folder.is_dir():
        return None
    epochs = []
    for entry in folder.iterdir():
        prefix, _, number = entry.name.partition("_")
        if prefix == STEP_PREFIX and number.isdigit() and not entry.is_symlink():
            epochs.append(int(number))
    for epoch in sorted(epochs, reverse=True):  # (the newest whose metadata reads)
        meta = folder / f"{STEP_PREFIX}_{epoch}" / META_FILE
        if meta.is_file() and not meta.is_symlink():
            named = _algorithm_in(meta)
            if named is not None:
                return named
    return None


def _algorithm_in(file: Path) -> str | None:
    """The non-empty string a JSON file holds under "algorithm" (None for anything else)."""
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    name = data.get("algorithm") if isinstance(data, dict) else None
    return name if isinstance(name, str) and name else None


def _grouping_key(run: Run) -> tuple[tuple[str, str], ...]:
    return tuple(
        sorted(
            (k, json.dumps(v))
            for k, v in run.config.items()
            if k != "seed" and not is_presentation_key(k)
        )
    )


LABEL_FIRST = ("algo.name", "env.id", "env.suite")
LABEL_KEYS = 3


def group_runs(runs: list[Run]) -> list[tuple[str, list[Run]]]:
    """Runs grouped by config less the seed; labels name what differs between groups."""
    groups: dict[tuple[tuple[str, str], ...], list[Run]] = {}
    for run in runs:
        groups.setdefault(_grouping_key(run), []).append(run)
    keys = list(groups)
    if len(keys) == 1:
        members = groups[keys[0]]
        return [(_seed_group_label(members), members)]
    common = set(keys[0]).intersection(*keys[1:])
    varying = sorted(
        {k for key in keys for k, v in key if (k, v) not in common},
        key=lambda k: (k not in LABEL_FIRST, LABEL_FIRST.index(k) if k in LABEL_FIRST else 0, k),
    )

    def label(key: tuple[tuple[str, str], ...], most: int | None) -> str:
        values = dict(key)
        shown = [k for k in varying if k in values]
        text = ", ".join(f"{k}={json.loads(values[k])}" for k in shown[:most])
        more = len(shown) - len(shown[:most])
        return (text + (f" (+{more} more)" if more else "")) or groups[key][0].path.name

    # At most LABEL_KEYS keys a label (algo.name and env.id first): runs of two algorithms
    # differ in every key of each; all of them when fewer would not tell the groups apart.
    labels = [label(key, LABEL_KEYS) for key in keys]
    if len(set(labels)) < len(labels):
        labels = [label(key, None) for key in keys]
    return [(text, groups[key]) for text, key in zip(labels, keys, strict=True)]


def _seed_group_label(members: list[Run]) -> str:
    """The runs' common `name`; a sweep's members (`seed0`, `seed1`, ... in the sweep's
    directory) are labelled by the sweep's directory, its name."""
    names = {str(m.config.get("name", m.path.name)) for m in members}
    if len(names) == 1:
        return names.pop()
    parents = {m.path.resolve().parent for m in members}
    return parents.pop().name if len(parents) == 1 else members[0].path.name


def curve(label: str, runs: list[Run], metric: str = EVAL_RETURN) -> Curve:
    """Mean and min-max over `runs` at the env steps every run evaluated at."""
    series = [
        {r["env_steps"]: (r["wall_s"], r[metric]) for r in run.records if r.get(metric) is not None}
        for run in runs
    ]
    steps = sorted(set.intersection(*(set(s) for s in series)))
    for run, points in zip(runs, series, strict=True):
        if not points:
            logged = sorted({k for r in run.records for k in r} - {"epoch", "env_steps", "wall_s"})
            raise ValueError(
                f"run {str(run.path)!r} has no values of {metric!r}"
                + (f"; its metrics: {', '.join(logged)}" if logged else " (it has no records)")
            )
    if not steps:
        raise ValueError(
            f"runs {[str(r.path) for r in runs]} have no common env steps with {metric!r}"
        )
    shortest = min(range(len(runs)), key=lambda i: max(series[i], default=0))
    dropped = {x for s in series for x in s if x > max(steps, default=0)}
    if dropped and len(runs) > 1:  # (a run not finished, or one evaluated on another schedule)
        warnings.warn(
            f"curve {label!r}: {str(runs[shortest].path)!r} ends at "
            f"{max(series[shortest], default=0):,} env steps, so the curve of its "
            f"{len(runs)} runs stops there ({len(dropped)} later points of the others are not "
            "shown: plot those runs without it to see them)",
            stacklevel=2,
        )
    values = np.array([[s[x][1] for x in steps] for s in series], dtype=float)
    wall = np.array([[s[x][0] for x in steps] for s in series], dtype=float)
    return Curve(
        label=label,
        runs=len(runs),
        seeds=len({json.dumps(run.config.get("seed")) for run in runs}),
        env_steps=np.array(steps, dtype=float),
        wall_s=wall.mean(0),
        mean=values.mean(0),
        low=values.min(0),
        high=values.max(0),
    )


@dataclass
class Reference:
    """A reference curve from a JSON file: one series, no seeds band."""

    label: str
    env_steps: np.ndarray
    values: np.ndarray
    wall_s: np.ndarray | None  # None unless every point has wall_s


def read_reference(path: str | Path) -> Reference:
    """Parse a reference-curve JSON file (data only); ValueError naming the file and the point
    when it is not `{"label"?: str, "curve": [{"env_steps": n, "return": x, "wall_s"?: s}, ...]}`."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"reference curve {str(path)!r}: no such file")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"reference curve {str(path)!r}: not readable as JSON ({e})") from None
    points = data.get("curve") if isinstance(data, dict) else None
    if not isinstance(points, list) or not points:
        raise ValueError(
            f"reference curve {str(path)!r}: expected an object with a non-empty list 'curve' "
            'of {"env_steps", "return"[, "wall_s"]} points'
        )
    steps, values, walls = [], [], []
    for i, point in enumerate(points):
        try:
            steps.append(float(point["env_steps"]))
            values.append(float(point["return"]))
            walls.append(float(point["wall_s"]) if "wall_s" in point else None)
        except (TypeError, KeyError, ValueError) as e:
            raise ValueError(
                f"reference curve {str(path)!r}: point {i} ({point!r}) needs numeric "
                f"'env_steps' and 'return' ({type(e).__name__}: {e})"
            ) from None
    label = data.get("label")
    return Reference(
        label=str(label) if label else path.stem,
        env_steps=np.array(steps),
        values=np.array(values),
        wall_s=None if any(w is None for w in walls) else np.array(walls, dtype=float),
    )


def plot_runs(
    paths: list[str | Path],
    out: str | Path | None = None,
    metric: str = EVAL_RETURN,
    references: Sequence[str | Path] = (),
) -> Any:
    """Figure with `metric` vs env steps (left) and vs wall time (right) of the runs at
    `paths` (a sweep's directory stands for its members), with any reference curves
    (`read_reference`) dashed; saved to `out` (.png or .svg) when given. Returns the
    matplotlib Figure."""
    from matplotlib.figure import Figure

    if references and metric != EVAL_RETURN:
        raise ValueError(
            f"reference curves are returns ({EVAL_RETURN}); with --metric {metric} there is "
            "nothing to compare them with: plot them without --metric"
        )
    refs = [read_reference(r) for r in references]  # bad files fail before any run is read
    curves = [
        curve(label, runs, metric)
        for label, runs in group_runs([read_run(p) for p in expand_sweeps(paths)])
    ]
    fig = Figure(figsize=(11, 4), layout="constrained")
    by_steps, by_time = fig.subplots(1, 2, sharey=True)
    for c in curves:
        over = f"{c.runs} seeds" if c.seeds == c.runs else f"{c.runs} runs, {c.seeds} seeds"
        label = c.label + (f" (mean, min-max of {over})" if c.runs > 1 else "")
        for ax, x in ((by_steps, c.env_steps), (by_time, c.wall_s)):
            (line,) = ax.plot(x, c.mean, label=label, marker="o", markersize=3)
            if c.runs > 1:
                ax.fill_between(x, c.low, c.high, color=line.get_color(), alpha=0.2, linewidth=0)
    for r in refs:
        (line,) = by_steps.plot(
            r.env_steps, r.values, label=r.label, linestyle="--", marker="s", markersize=3
        )
        if r.wall_s is not None:
            by_time.plot(
                r.wall_s, r.values, linestyle="--", marker="s", markersize=3, color=line.get_color()
            )
    by_steps.set_xlabel("env steps")
    by_time.set_xlabel("wall time (s, incl. start-up and compile; mean over runs)")
    by_steps.set_ylabel(metric)
    for ax in (by_steps, by_time):
        ax.grid(alpha=0.3)
    # Below both panels (long labels would squeeze the axes inside one of them).
    handles, labels = by_steps.get_legend_handles_labels()
    if labels:
        fig.legend(
            handles, labels, loc="outside lower center", ncols=min(2, len(labels)), fontsize="small"
        )
    fig.suptitle(metric)
    if out is not None:
        import matplotlib

        out = Path(out)
        if out.suffix.lower() not in (".png", ".svg"):
            raise ValueError(f"plot output {str(out)!r}: use a .png or .svg file name")
        out.parent.mkdir(parents=True, exist_ok=True)
        with matplotlib.rc_context({"svg.fonttype": "none"}):  # labels stay text in SVG
            fig.savefig(out, dpi=120)
    return fig
