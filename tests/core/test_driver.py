"""The driver (`engine.run`): run-directory files, eval cadence, profiling mode = fused mode."""

from __future__ import annotations

import itertools
import json
import math

import jax
import numpy as np
import pytest

import jaxrl_engine as jre
from jaxrl_engine.run.host_hooks import eval_text
from tests.conftest import small_config

SUMMARY_KEYS = {"final_eval_return", "env_steps", "wall_s", "steps_per_second", "compile_s"}


def assert_times_add_up(summary: dict) -> None:
    """wall_s is its parts (startup, setup, compile, train, end of run), each non-negative:
    no time of the call goes unaccounted."""
    parts = [summary[k] for k in ("startup_s", "setup_s", "compile_s", "train_s", "end_s")]
    assert all(p >= 0 for p in parts), summary
    assert summary["wall_s"] == pytest.approx(sum(parts), abs=1e-3), summary
    assert summary["end_s"] > 0  # the final checkpoint and the export are counted


def test_compiling_before_run_is_not_counted_in_its_summary(tmp_path):
    """compile_s is what this run compiled: phases warmed up before it (or a previous run's)
    are not in it, so compile_s <= wall_s in library use too."""
    cfg = small_config("total_env_steps=128", tmp_path=tmp_path)
    engine = jre.build(cfg)
    state = engine.warm_up(engine.init(jax.random.key(0)), phases=["epochs", "evaluate"])
    assert engine.compile_seconds > 0
    _, summary = engine.run(state)
    assert summary["compile_s"] < engine.compile_seconds / 10, summary
    assert_times_add_up(summary)


def key_data(state):
    return state.replace(rng=jax.random.key_data(state.rng))


def test_run_writes_metrics_jsonl_summary_and_config(tmp_path):
    cfg = small_config("total_env_steps=320", "eval.interval=2", tmp_path=tmp_path)  # 5 epochs
    engine = jre.build(cfg)
    state, history_summary = engine.run(engine.init(jax.random.key(0)))
    history = history_summary["records"]
    run_dir = tmp_path / cfg.name

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2, 3, 4, 5]
    assert [r["env_steps"] for r in records] == [64 * e for e in range(1, 6)]
    evaluated = [r["epoch"] for r in records if "evaluate/episode_return" in r]
    assert evaluated == [2, 4, 5]  # every eval.interval epochs, and after the last
    assert all("train/loss" in r and "rollout/reward_mean" in r for r in records)
    assert not any(k.startswith("guard/") for r in records for k in r)
    assert [r["epoch"] for r in history] == [1, 2, 3, 4, 5]
    # Each epoch its own time (epochs 1-2 ran in one compiled call: they share it out).
    walls = [r["wall_s"] for r in records]
    assert all(0 < a < b for a, b in itertools.pairwise(walls)), walls

    summary = json.loads((run_dir / "summary.json").read_text())
    assert set(summary) >= SUMMARY_KEYS
    assert summary["env_steps"] == 5 * 4 * 16 == int(state.counters.env_steps)
    assert summary["final_eval_return"] == records[-1]["evaluate/episode_return"]
    assert summary["final_eval_return_std"] == records[-1]["evaluate/episode_return_std"]
    assert summary["final_eval_return_iqm"] == records[-1]["evaluate/episode_return_iqm"]
    assert summary["final_eval_epoch"] == 5  # the run's last epoch: it completed
    assert summary["algorithm"] == "ppo"  # (the engine's: a user's algorithm names itself)
    assert math.isfinite(summary["final_eval_return"])
    assert summary["wall_s"] > 0 and summary["steps_per_second"] > 0 and summary["compile_s"] > 0
    assert_times_add_up(summary)
    assert summary["startup_s"] == 0.0  # the library counts from `run`
    assert summary == {k: v for k, v in history_summary.items() if k != "records"}

    assert jre.load_config(run_dir / "config.yaml") == cfg
    assert int(state.counters.epoch) == 5


def test_run_resumes_up_to_the_total_number_of_epochs(small_cfg, tmp_path):
    engine = jre.build(small_cfg)  # 4 epochs
    state, _ = engine.epoch(engine.init(jax.random.key(0)))
    state, history_summary = engine.run(state, run_dir=tmp_path)
    history = history_summary["records"]
    assert [r["epoch"] for r in history] == [2, 3, 4]
    assert int(state.counters.epoch) == 4


def test_a_run_directory_given_to_run_names_the_run(small_cfg, tmp_path):
    """`run(run_dir=X)`: the summary and the stored config name X, so what the directory
    says is what `jre.resume(X)` continues."""
    engine = jre.build(small_cfg)
    _, summary = engine.run(engine.init(jax.random.key(0)), run_dir=tmp_path / "mine")
    stored = jre.load_config(tmp_path / "mine" / "config.yaml")
    assert summary["name"] == stored.name == "mine" and stored.run_dir == str(tmp_path)
    assert summary["run_dir"] == str((tmp_path / "mine").absolute())
    assert not (tmp_path / small_cfg.name).exists()
    with pytest.raises(jre.ConfigError, match=r"run_dir=.*-r': its last part must be one folder"):
        engine.run(engine.init(jax.random.key(0)), run_dir=tmp_path / "-r")


def test_profile_mode_gives_the_fused_result_and_times_each_phase(tmp_path):
    fused_engine = jre.build(small_config(tmp_path=tmp_path / "fused"))  # 4 epochs, eval every 2
    fused, fused_history_summary = fused_engine.run(fused_engine.init(jax.random.key(3)))
    fused_history = fused_history_summary["records"]
    profile_engine = jre.build(small_config("profile=true", tmp_path=tmp_path / "profile"))
    profiled, profile_history_summary = profile_engine.run(profile_engine.init(jax.random.key(3)))
    profile_history = profile_history_summary["records"]

    for a, b in zip(
        jax.tree.leaves(key_data(fused)), jax.tree.leaves(key_data(profiled)), strict=True
    ):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        [r["evaluate/episode_return"] for r in profile_history if "evaluate/episode_return" in r],
        [r["evaluate/episode_return"] for r in fused_history if "evaluate/episode_return" in r],
        rtol=1e-5,
    )
    assert set(profile_history[-1]) == set(fused_history[-1])

    counts = {name: r["count"] for name, r in profile_engine.timer.summary().items()}
    assert counts == {
        "rollout": 4,
        "update_dataset": 4,
        "train": 4,
        "sync_weights": 4,
        "evaluate": 2,
    }
    assert {name: r["count"] for name, r in fused_engine.timer.summary().items()} == {
        "epoch": 4,
        "evaluate": 2,
    }
    for r in profile_engine.timer.summary().values():
        assert r["total_s"] > 0 and r["avg_s"] == r["total_s"] / r["count"]


def test_several_epochs_per_call_equal_one_call_per_epoch():
    """`engine.epochs(state, n)` (what the driver runs between evaluations) is n fused epochs:
    same state and the same per-epoch metrics, row by row; `n` below the table size is fine."""
    engine = jre.build(small_config("eval.interval=4"))  # 4 epochs, all in one call
    assert engine.epochs_per_call == 4
    state = engine.init(jax.random.key(5))
    singles = []
    one = state
    for _ in range(3):
        one, metrics = engine.epoch(one)
        singles.append(jax.device_get(metrics))

    state = engine.init(jax.random.key(5))
    several, table, ran = engine.call("epochs", state, 3)
    assert int(ran) == 3 and int(several.counters.epoch) == 3
    for a, b in zip(
        jax.tree.leaves(key_data(one)), jax.tree.leaves(key_data(several)), strict=True
    ):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    table = jax.device_get(table)
    assert set(table) == set(singles[0])
    for name, rows in table.items():
        assert rows.shape[0] == 4  # epochs_per_call rows; the 4th was not run
        np.testing.assert_allclose(
            rows[:3], [m[name] for m in singles], rtol=1e-5, atol=1e-6, err_msg=name
        )


def test_the_driver_calls_once_per_evaluation_interval(tmp_path):
    cfg = small_config("total_env_steps=640", "eval.interval=4", tmp_path=tmp_path)  # 10 epochs
    engine = jre.build(cfg)
    calls = []
    compiled = engine.call

    def counting(name, state, *args):
        calls.append((name, *map(int, args)))
        return compiled(name, state, *args)

    engine.call = counting  # type: ignore[method-assign]
    state, history_summary = engine.run(engine.init(jax.random.key(0)))
    history = history_summary["records"]
    # Chunks end at evaluations (4, 8) and at the end (10).
    assert calls == [
        ("epochs", 4),
        ("evaluate",),
        ("epochs", 4),
        ("evaluate",),
        ("epochs", 2),
        ("evaluate",),
    ]
    assert [r["epoch"] for r in history] == list(range(1, 11))
    assert int(state.counters.epoch) == 10
    assert engine.timer.summary()["epoch"]["count"] == 10


def test_progress_off_a_terminal_is_plain_lines_naming_each_compilation(tmp_path, capsys):
    """Without a terminal (CI logs, pipes) progress is plain stderr lines: each compilation as
    it starts, then epochs (the last always); stdout stays empty for the caller's summary."""
    cfg = small_config("total_env_steps=320", "progress=true", tmp_path=tmp_path)  # 5 epochs
    engine = jre.build(cfg)
    engine.run(engine.init(jax.random.key(0)))
    out, err = capsys.readouterr()
    lines = err.splitlines()
    compiling = [line for line in lines if "compiling" in line]
    assert compiling == [
        f"jaxrl-engine: {cfg.name}: compiling evaluate (1/2)",
        f"jaxrl-engine: {cfg.name}: compiling epochs (2/2)",
    ], err
    assert lines[-1].startswith(f"jaxrl-engine: {cfg.name}: epoch 5/5, "), err
    assert "env steps/s, eval " in lines[-1] and out == ""
    assert "eval nan" not in err  # before the first evaluation: "eval -"
    assert (eval_text(float("nan")), eval_text(12.34)) == ("-", "12.3")
