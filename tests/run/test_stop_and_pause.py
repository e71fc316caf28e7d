"""Where a library run stops: `num_epochs` below the config's total pauses it (resume trains
the rest, no policy until then), and a signal in a sweep of several compiled groups stops the
sweep where it lands (the end of one group's last epochs, the next group's compile)."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import time

import jax
import pytest

import jaxrl_engine as jre
import jaxrl_engine.run.sweep as sweep_module
from jaxrl_engine.distributed.sweep import SweepPrograms
from jaxrl_engine.export.policy import POLICY_DIR
from tests.conftest import small_config

# Two static groups: 16 steps x 4 envs (4 epochs of 256 env steps) and 32 x 4 (2 epochs).
GRID = {"algo.num_steps": [16, 32]}
GROUPS = ["seed0_algo.num_steps=16", "seed0_algo.num_steps=32"]


def summary_of(path) -> dict:
    return json.loads((path / "summary.json").read_text())


def test_num_epochs_below_the_total_pauses_the_run_and_resume_completes_it(tmp_path, capsys):
    cfg = small_config("name=p", "save_interval=2", tmp_path=tmp_path)
    engine = jre.build(cfg)
    _, summary = engine.run(engine.init(jax.random.key(0)), num_epochs=2)  # 2 of 4
    run = tmp_path / "p"
    assert summary["status"] == summary_of(run)["status"] == "paused"
    assert summary["epochs"] == 2 and not (run / POLICY_DIR).exists()
    with pytest.raises(jre.CheckpointError, match="unfinished run"):  # not a finished run
        engine.run(engine.init(jax.random.key(0)))
    engine, state = jre.resume(run)
    assert int(state.counters.epoch) == 2
    _, summary = engine.run(state)
    assert summary["status"] == "completed" and summary["epochs"] == 4
    assert (run / POLICY_DIR).is_dir()


def test_asking_again_for_the_epochs_a_paused_run_has_changes_nothing(tmp_path, capsys):
    engine = jre.build(small_config("name=q", "save_interval=2", tmp_path=tmp_path))
    state, _ = engine.run(engine.init(jax.random.key(0)), num_epochs=2)
    before = (tmp_path / "q" / "summary.json").read_text()
    capsys.readouterr()
    _, again = engine.run(state, num_epochs=2)
    assert again["status"] == "paused" and again["records"] == []
    assert "is finished (epoch 2 of 2)" in capsys.readouterr().err
    assert (tmp_path / "q" / "summary.json").read_text() == before


def test_a_sweep_stopped_early_by_num_epochs_is_paused(tmp_path):
    cfg = small_config("name=s", "save_interval=2", "loggers=[jsonl]", tmp_path=tmp_path)
    first = jre.sweep(cfg, seeds=[0, 1], num_epochs=2)
    assert first["status"] == "paused" and first["completed"] == 0
    rows = list(csv.DictReader((tmp_path / "s" / "sweep.csv").open()))
    assert {r["status"] for r in rows} == {"paused"}
    assert first["settings"][0]["seeds"] == 2  # the returns reached so far are summarized
    resumed = jre.resume_sweep(tmp_path / "s")
    assert resumed["status"] == "completed" and resumed["completed"] == 2


@contextlib.contextmanager
def sweep_stop_recorded():
    """The sweep's `StopSignal`, to wait until its watcher thread has seen a signal."""
    stops = []
    original = sweep_module.stop_on_signals

    @contextlib.contextmanager
    def recording(*args, **kwargs):
        with original(*args, **kwargs) as stop:
            stops.append(stop)
            yield stop

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sweep_module, "stop_on_signals", recording)
        yield stops


def send_and_wait(stops, sig) -> None:
    os.kill(os.getpid(), sig)
    deadline = time.monotonic() + 10
    while stops[-1].signame is None:
        assert time.monotonic() < deadline, "the signal was not seen"
        time.sleep(0.01)


def split_sweep(tmp_path):
    cfg = small_config("name=g", "save_interval=2", "loggers=[jsonl]", tmp_path=tmp_path)
    return lambda: jre.sweep(cfg, seeds=[0], grid=GRID, split_static=True)


def statuses(root) -> dict[str, str]:
    return {r["member"]: r["status"] for r in csv.DictReader((root / "sweep.csv").open())}


def test_a_signal_in_a_groups_last_epochs_stops_before_the_next_group(
    tmp_path, monkeypatch, capsys
):
    run_sweep = split_sweep(tmp_path)
    original = sweep_module.SweepDriver._chunk

    with sweep_stop_recorded() as stops:

        def chunk(self, group, runs, state, start, n, total):
            state = original(self, group, runs, state, start, n, total)
            if group.label == self.groups[0].label and start + n == total:
                send_and_wait(stops, signal.SIGINT)  # as the first group's last call ends
            return state

        monkeypatch.setattr(sweep_module.SweepDriver, "_chunk", chunk)
        with pytest.raises(jre.TrainingInterrupted, match="stopped before") as e:
            run_sweep()
    root = tmp_path / "g"
    assert e.value.summary["status"] == summary_of(root)["status"] == "interrupted"
    assert statuses(root) == {GROUPS[0]: "completed", GROUPS[1]: "not_run"}
    assert "SIGINT: stopping after this epoch" in capsys.readouterr().err
    monkeypatch.undo()
    resumed = jre.resume_sweep(root)
    assert resumed["status"] == "completed" and resumed["completed"] == 2


def test_a_signal_while_a_later_group_compiles_stops_there_with_a_summary(tmp_path, monkeypatch):
    run_sweep = split_sweep(tmp_path)
    original = SweepPrograms.compile
    calls = []

    with sweep_stop_recorded() as stops:

        def compile(self):
            seconds = original(self)
            calls.append(self)
            if len(calls) == 2:
                send_and_wait(stops, signal.SIGTERM)
            return seconds

        monkeypatch.setattr(SweepPrograms, "compile", compile)
        with pytest.raises(jre.TrainingInterrupted) as e:
            run_sweep()
    root = tmp_path / "g"
    assert e.value.signame == "SIGTERM" and summary_of(root)["status"] == "interrupted"
    assert statuses(root) == {GROUPS[0]: "completed", GROUPS[1]: "interrupted"}
    assert summary_of(root / GROUPS[1])["epochs"] == 0
    monkeypatch.undo()
    assert jre.resume_sweep(root)["completed"] == 2


def test_a_signal_while_the_first_group_compiles_is_before_training(tmp_path, monkeypatch):
    run_sweep = split_sweep(tmp_path)
    original = SweepPrograms.compile

    with sweep_stop_recorded() as stops:

        def compile(self):
            seconds = original(self)
            send_and_wait(stops, signal.SIGINT)
            return seconds

        monkeypatch.setattr(SweepPrograms, "compile", compile)
        with pytest.raises(KeyboardInterrupt) as e:
            run_sweep()
    assert type(e.value) is KeyboardInterrupt and e.value.args == ("SIGINT",)
    assert not list((tmp_path / "g").rglob("epoch_*"))  # nothing trained, nothing saved
