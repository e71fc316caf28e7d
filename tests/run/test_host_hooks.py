"""Host hooks: the driver's work around the compiled calls, and a user's own hook."""

from __future__ import annotations

import json

import jax
import pytest

import jaxrl_engine as jre
from tests.conftest import small_config


class Recorder(jre.HostHook):
    """Records every event it sees, with what the run looked like then."""

    def __init__(self, boundary: int | None = None):
        self.events: list[tuple] = []
        self.boundary = boundary

    def start(self, run):
        self.events.append(("start", run.first, run.total))

    def next_boundary(self, epoch):
        return None if self.boundary is None else (epoch // self.boundary + 1) * self.boundary

    def on_records(self, run, records):
        self.events.append(("records", [r["epoch"] for r in records]))

    def after_chunk(self, run, state):
        # Logging and checkpoints (earlier in the chain) have seen this chunk already.
        lines = (run.out.path / "metrics.jsonl").read_text().splitlines()
        self.events.append(("after_chunk", run.done, int(state.counters.epoch), len(lines)))

    def end(self, run, state):
        self.events.append(("end", run.status))

    def close(self, run):
        self.events.append(("close",))


def test_a_user_host_hook_sees_every_chunk_in_order(tmp_path):
    hook = Recorder()
    cfg = small_config("total_env_steps=320", "eval.interval=2", tmp_path=tmp_path)  # 5 epochs
    engine = jre.build(cfg, host_hooks=[hook])
    engine.run(engine.init(jax.random.key(0)))
    assert hook.events == [
        ("start", 0, 5),
        ("records", [1, 2]),
        ("after_chunk", 2, 2, 2),
        ("records", [3, 4]),
        ("after_chunk", 4, 4, 4),
        ("records", [5]),
        ("after_chunk", 5, 5, 5),
        ("end", "completed"),
        ("close",),
    ]


def test_a_host_hook_boundary_splits_the_compiled_chunks(tmp_path):
    hook = Recorder(boundary=3)
    cfg = small_config("total_env_steps=448", "eval.interval=4", tmp_path=tmp_path)  # 7 epochs
    engine = jre.build(cfg, host_hooks=[hook])
    engine.run(engine.init(jax.random.key(0)))
    chunks = [e[1] for e in hook.events if e[0] == "records"]
    assert chunks == [[1, 2, 3], [4], [5, 6], [7]]  # stops after 3, 4 (eval), 6, 7 (end)


def test_run_returns_the_summary_it_writes(tmp_path):
    cfg = small_config(tmp_path=tmp_path)
    engine = jre.build(cfg)
    state, summary = engine.run(engine.init(jax.random.key(0)))
    written = json.loads((tmp_path / cfg.name / "summary.json").read_text())
    records = summary.pop("records")
    assert summary.keys() == written.keys()
    assert summary["status"] == written["status"] == "completed"
    assert summary["epochs"] == written["epochs"] == int(state.counters.epoch) == len(records)
    assert summary["final_eval_return"] == pytest.approx(written["final_eval_return"])
    assert summary["checkpoint"] == written["checkpoint"] is not None


def test_a_failing_host_hook_stops_the_run_and_still_closes_files(tmp_path):
    class Boom(jre.HostHook):
        def after_chunk(self, run, state):
            raise RuntimeError("hook failed")

    closed = Recorder()
    cfg = small_config(tmp_path=tmp_path)
    engine = jre.build(cfg, host_hooks=[closed, Boom()])
    with pytest.raises(RuntimeError, match="hook failed"):
        engine.run(engine.init(jax.random.key(0)))
    assert closed.events[-1] == ("close",)
    lines = (tmp_path / cfg.name / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [1, 2]  # the chunk was logged


def test_the_summary_paths_are_absolute_for_a_relative_run_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = small_config("run_dir=runs", "name=rel", "save_interval=2", "total_env_steps=128")
    engine = jre.build(cfg)
    _, summary = engine.run(engine.init(jax.random.key(0)))
    run = tmp_path / "runs" / "rel"
    assert summary["run_dir"] == str(run)
    assert summary["checkpoint"] == str(run / "checkpoints" / "epoch_2")
    assert json.loads((run / "summary.json").read_text())["run_dir"] == str(run)
