"""Logging backends: TensorBoard event files readable by TensorBoard's own reader, W&B calls,
and the `loggers` config key."""

from __future__ import annotations

import errno
import importlib.machinery
import json
import subprocess
import sys
import types

import jax
import numpy as np
import pytest

import jaxrl_engine as jre
from jaxrl_engine.io.logging import window_record
from jaxrl_engine.run.run_dir import RunDir
from tests.conftest import NaNRewardsFrom, small_config


def run_small(tmp_path, *overrides):
    cfg = small_config("total_env_steps=320", "eval.interval=2", *overrides, tmp_path=tmp_path)
    engine = jre.build(cfg)
    engine.run(engine.init(jax.random.key(0)))
    run_dir = tmp_path / cfg.name
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return run_dir, records


def test_tensorboard_events_hold_the_eval_curve_for_the_standard_reader(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, records = run_small(tmp_path, "loggers=[jsonl,tensorboard]")
    assert list(run_dir.glob("events.out.tfevents.*")), "no event file in the run directory"

    events = EventAccumulator(str(run_dir))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert {"evaluate/episode_return", "train/loss", "rollout/reward_mean"} <= set(tags)

    curve = events.Scalars("evaluate/episode_return")
    expected = [
        (r["env_steps"], r["evaluate/episode_return"])
        for r in records
        if "evaluate/episode_return" in r
    ]
    assert [e.step for e in curve] == [step for step, _ in expected] == [128, 256, 320]
    np.testing.assert_allclose([e.value for e in curve], [v for _, v in expected], rtol=1e-6)
    # One point per epoch for per-epoch metrics, at env steps.
    assert [e.step for e in events.Scalars("train/loss")] == [r["env_steps"] for r in records]


def test_jsonl_only_writes_no_event_files(tmp_path):
    run_dir, records = run_small(tmp_path, "loggers=[jsonl]")
    assert len(records) == 5
    assert not list(run_dir.glob("events.out.tfevents.*"))


def fake_wandb(calls):
    module = types.ModuleType("wandb")
    module.__spec__ = importlib.machinery.ModuleSpec("wandb", None)

    class Run:
        def log(self, values, step):
            calls.append(("log", dict(values), step))

        def finish(self):
            calls.append(("finish",))

    def init(**kwargs):
        calls.append(("init", kwargs))
        return Run()

    module.init = init
    return module


def test_wandb_gets_one_log_per_epoch_at_env_steps(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb(calls))
    run_dir, records = run_small(tmp_path, "loggers=[wandb]", "wandb.mode=offline")

    init = calls[0]
    assert init[0] == "init"
    assert init[1]["mode"] == "offline" and init[1]["project"] == "jaxrl_engine"
    assert init[1]["config"]["loggers"] == ["jsonl", "wandb"]
    logs = [c for c in calls if c[0] == "log"]
    assert [step for _, _, step in logs] == [r["env_steps"] for r in records]
    for (_, values, _), record in zip(logs, records, strict=True):
        assert values["train/loss"] == pytest.approx(record["train/loss"])
        assert ("evaluate/episode_return" in values) == ("evaluate/episode_return" in record)
    assert calls[-1] == ("finish",)
    assert (run_dir / "metrics.jsonl").is_file()  # jsonl is always written


def test_loggers_key_always_keeps_jsonl_and_rejects_unknown_backends():
    assert jre.load_config(None, ["loggers=[tensorboard]"]).loggers == ["jsonl", "tensorboard"]
    assert jre.Config().loggers == ["jsonl", "tensorboard"]
    with pytest.raises(jre.ConfigError, match=r"'loggers\.0'.*'jsonl', 'tensorboard' or 'wandb'"):
        jre.load_config(None, ["loggers=[mlflow]"])


def test_wandb_without_the_package_fails_at_config_time(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    with pytest.raises(jre.ConfigError, match=r"'loggers'.*pip install 'jaxrl-engine\[wandb\]'"):
        jre.load_config(None, ["loggers=[jsonl,wandb]"])


def test_a_resumed_run_replaces_the_events_logged_after_its_checkpoint(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from jaxrl_engine.io.logging import TensorBoardLogger

    def record(epoch, value):
        return {"epoch": epoch, "env_steps": 100 * epoch, "wall_s": 1.0, "train/loss": value}

    first = TensorBoardLogger(tmp_path)  # logs epochs 1-5, "dies" after a checkpoint at 2
    for epoch in range(1, 6):
        first.log(record(epoch, float(epoch)))
    first.close()
    resumed = TensorBoardLogger(tmp_path)  # resumes from epoch 2
    for epoch in (3, 4):
        resumed.log(record(epoch, 10.0 + epoch))
    resumed.close()

    events = EventAccumulator(str(tmp_path))
    events.Reload()
    curve = [(e.step, e.value) for e in events.Scalars("train/loss")]
    assert curve == [(100, 1.0), (200, 2.0), (300, 13.0), (400, 14.0)]


def test_event_framing_checksums_are_crc32c():
    from jaxrl_engine.io.tfevents import crc32c, tfrecord

    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    record = tfrecord(b"payload")
    assert len(record) == 8 + 4 + len(b"payload") + 4
    assert record[12:-4] == b"payload"


def test_writing_tensorboard_events_imports_neither_torch_nor_tensorboardX(tmp_path):
    """In a fresh process: a torch install must not put torch's import into every run's start."""
    script = (
        "import sys; from jaxrl_engine.io.logging import TensorBoardLogger\n"
        f"w = TensorBoardLogger(__import__('pathlib').Path({str(tmp_path)!r}))\n"
        "w.log({'epoch': 1, 'env_steps': 10, 'wall_s': 0.1, 'train/loss': 0.5}); w.close()\n"
        "print(sorted(m for m in ('torch', 'tensorboardX', 'tensorflow') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 1


def test_tensorboards_reader_checks_our_checksums(tmp_path):
    """TensorBoard's loader verifies each record's CRC (a flipped payload byte drops the record),
    so the curve tests above, which read every record back, also check our CRC-32C framing."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    from jaxrl_engine.io.tfevents import EventFileWriter

    writer = EventFileWriter(tmp_path, purge_step=0)
    writer.add_scalars(10, {"a": 1.5, "b": -2.0})
    writer.close()
    kinds = [(e.step, e.WhichOneof("what")) for e in EventFileLoader(str(writer.path)).Load()]
    assert kinds == [(0, "file_version"), (0, "file_version"), (0, "session_log"), (10, "summary")]
    data = bytearray(writer.path.read_bytes())
    data[-6] ^= 0xFF  # inside the last record's payload
    writer.path.write_bytes(bytes(data))
    assert [e.step for e in EventFileLoader(str(writer.path)).Load()] == [0, 0, 0]


def test_a_window_record_weights_episode_returns_by_episodes_and_keeps_the_evaluation():
    def epoch(n, returned, episodes, loss, **extra):
        return {
            "epoch": n,
            "env_steps": 64 * n,
            "wall_s": 0.5 * n,
            "rollout/episode_return": returned,
            "rollout/episode_length": 2 * returned,
            "rollout/episodes": episodes,
            "train/loss": loss,
            "train/epsilon": 1.0 / n,
            "sync_weights/version": float(n),
            "update_dataset/buffer_overflowed": 1.0 if n == 2 else 0.0,
            **extra,
        }

    # epoch 3 ended no episode: its return is epoch 2's, carried, and weighs nothing
    records = [epoch(1, 10.0, 1.0, 1.0), epoch(2, 40.0, 3.0, 2.0), epoch(3, 40.0, 0.0, 6.0)]
    records[-1]["evaluate/episode_return"] = 99.0
    merged = window_record(records)
    assert merged == {
        "epoch": 3,
        "env_steps": 192,
        "wall_s": 1.5,
        "rollout/episode_return": (10.0 + 3 * 40.0) / 4,
        "rollout/episode_length": (20.0 + 3 * 80.0) / 4,
        "rollout/episodes": 4.0,
        "train/loss": 3.0,
        "train/epsilon": 1.0 / 3,
        "sync_weights/version": 3.0,
        "update_dataset/buffer_overflowed": 1.0,
        "evaluate/episode_return": 99.0,
    }
    # no episode ended in the window: the value carried into it (NaN before any episode)
    quiet = window_record([epoch(4, 40.0, 0.0, 1.0), epoch(5, 40.0, 0.0, 1.0)])
    assert quiet["rollout/episode_return"] == 40.0 and quiet["rollout/episodes"] == 0.0
    first = window_record([epoch(1, float("nan"), 0.0, 1.0), epoch(2, float("nan"), 0.0, 1.0)])
    assert np.isnan(first["rollout/episode_return"])


def test_a_window_leaves_out_the_epochs_a_metric_was_not_computed_in():
    """NaN is "not computed" (`jre.every` pads skipped epochs, off-policy losses before
    learning_starts): the window averages the epochs that have a value; all NaN stays NaN. An
    inf and a -inf give NaN (nan_guard=false), and a key only some epochs have is kept."""
    nan, inf = float("nan"), float("inf")
    records = [
        {"epoch": 1, "env_steps": 8, "wall_s": 1.0, "train/loss": nan, "hook/x": nan, "y": inf},
        {"epoch": 2, "env_steps": 16, "wall_s": 2.0, "train/loss": 4.0, "hook/x": 3.0, "y": -inf},
        {"epoch": 3, "env_steps": 24, "wall_s": 3.0, "train/loss": 2.0, "hook/x": nan, "y": 1.0},
        {"epoch": 4, "env_steps": 32, "wall_s": 4.0, "train/loss": nan, "only/first": 7.0},
    ]
    records[3].update({"hook/x": nan, "y": 1.0})
    for r in records:
        r["update_dataset/buffer_overflowed"] = nan if r["epoch"] == 4 else float(r["epoch"] == 2)
    records[0]["only/first"] = 5.0
    merged = window_record(records)
    assert merged["train/loss"] == 3.0 and merged["hook/x"] == 3.0
    assert np.isnan(merged["y"])
    assert merged["only/first"] == 6.0
    assert merged["update_dataset/buffer_overflowed"] == 1.0
    assert (merged["epoch"], merged["env_steps"], merged["wall_s"]) == (4, 32, 4.0)
    assert np.isnan(window_record(records[:1] * 2 + [records[3]])["train/loss"])


def test_log_interval_writes_one_record_per_window_closed_by_evaluations_and_checkpoints(
    tmp_path,
):
    """12 epochs, a window every 4, an evaluation at 10 and 12, a checkpoint at 6 (a pause at
    7 in the first call, a resume to 12): each record of metrics.jsonl and of the TensorBoard
    events is `window_record` over its epochs' own records, as `engine.run` returns them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = small_config(
        "total_env_steps=768",  # 64 env steps an epoch
        "eval.interval=10",
        "log_interval=4",
        "save_interval=6",
        "loggers=[jsonl,tensorboard]",
        tmp_path=tmp_path,
    )
    engine = jre.build(cfg)
    state, first = engine.run(engine.init(jax.random.key(0)), num_epochs=7)
    assert first["status"] == "paused"
    run_dir = tmp_path / cfg.name
    engine, state = jre.resume(run_dir)
    _, second = engine.run(state)
    epochs = {r["epoch"]: r for r in [*first["records"], *second["records"]]}
    assert sorted(epochs) == list(range(1, 13))
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    written = [json.loads(line) for line in lines]
    assert [r["epoch"] for r in written] == [4, 6, 7, 8, 10, 12]
    windows = [(1, 4), (5, 6), (7, 7), (8, 8), (9, 10), (11, 12)]
    for record, (lo, hi) in zip(written, windows, strict=True):
        want = window_record([epochs[e] for e in range(lo, hi + 1)])
        assert record.keys() == want.keys()
        for key, value in want.items():
            assert record[key] == pytest.approx(value, rel=1e-6, nan_ok=True), (hi, key)
    assert sum(r["rollout/episodes"] for r in written) == sum(
        r["rollout/episodes"] for r in epochs.values()
    )
    assert [r["epoch"] for r in written if "evaluate/episode_return" in r] == [7, 10, 12]

    events = EventAccumulator(str(run_dir))
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == [r["env_steps"] for r in written]


def test_log_interval_must_be_positive():
    with pytest.raises(jre.ConfigError, match="log_interval"):
        jre.load_config(None, ["log_interval=0"])


def test_a_failed_write_of_the_held_epochs_still_leaves_the_failures_summary(tmp_path, monkeypatch):
    """NaN rewards stop the run in epoch 3 with epochs 1-2 held (log_interval=4); the disk
    refuses their record: summary.json still says non_finite, and the NaN error is raised."""

    cfg = small_config(
        "total_env_steps=384",
        "log_interval=4",
        "eval.interval=10",
        "save_interval=0",
        tmp_path=tmp_path,
    )
    engine = jre.build(cfg, env=NaNRewardsFrom(start=2 * 16))

    def full(self, record):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(RunDir, "_write", full)
    with pytest.raises(jre.NonFiniteError) as info:
        engine.run(engine.init(jax.random.key(0)))
    assert info.value.epoch == 3
    summary = json.loads((tmp_path / cfg.name / "summary.json").read_text())
    assert summary["status"] == "non_finite" and summary["epochs"] == 2
