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
import numpy as np
import pytest

import jaxrl_engine as jre
import jaxrl_engine.run.driver as driver_module
import jaxrl_engine.run.sweep as sweep_module
from jaxrl_engine.distributed.sweep import SweepPrograms
from jaxrl_engine.export.policy import flatten_params
from tests.conftest import small_config

# Two static groups: 16 steps x 4 envs (4 epochs of 256 env steps) and 32 x 4 (2 epochs).
GRID = {"algo.num_steps": [16, 32]}
GROUPS = ["seed0_algo.num_steps=16", "seed0_algo.num_steps=32"]


def summary_of(path) -> dict:
    return json.loads((path / "summary.json").read_text())


def exported(run) -> dict[str, np.ndarray]:
    """The params of the run's exported policy (`policy/params.npz`)."""
    with np.load(run / "policy" / "params.npz") as f:
        return {k: f[k] for k in f.files}


def params_of(state) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in flatten_params(state.eval_params).items()}


def same(a, b) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_num_epochs_below_the_total_pauses_the_run_and_resume_completes_it(tmp_path, capsys):
    cfg = small_config("name=p", "save_interval=2", tmp_path=tmp_path)
    engine = jre.build(cfg)
    state, summary = engine.run(engine.init(jax.random.key(0)), num_epochs=2)  # 2 of 4
    run = tmp_path / "p"
    assert summary["status"] == summary_of(run)["status"] == "paused"
    assert summary["epochs"] == 2
    paused_policy = exported(run)  # the paused state's policy
    assert same(paused_policy, params_of(state))
    with pytest.raises(jre.CheckpointError, match="unfinished run"):  # not a finished run
        engine.run(engine.init(jax.random.key(0)))
    engine, state = jre.resume(run)
    assert int(state.counters.epoch) == 2
    _, summary = engine.run(state)
    assert summary["status"] == "completed" and summary["epochs"] == 4
    assert not same(exported(run), paused_policy)
    # Started over and paused again: the policy is the new run's, never the finished one's.
    completed_policy = exported(run)
    fresh = jre.build(cfg)
    state, summary = fresh.run(fresh.init(jax.random.key(1)), num_epochs=1)
    assert summary["status"] == "paused" and not same(exported(run), completed_policy)
    assert same(exported(run), params_of(state))


def test_asking_again_for_the_epochs_a_paused_run_has_changes_nothing(tmp_path, capsys):
    engine = jre.build(small_config("name=q", "save_interval=2", tmp_path=tmp_path))
    state, _ = engine.run(engine.init(jax.random.key(0)), num_epochs=2)
    before = (tmp_path / "q" / "summary.json").read_text()
    capsys.readouterr()
    _, again = engine.run(state, num_epochs=2)
    assert again["status"] == "paused" and again["records"] == []
    err = capsys.readouterr().err
    assert "is paused (epoch 2 of 2)" in err and "without num_epochs" in err
    assert (tmp_path / "q" / "summary.json").read_text() == before


def test_a_paused_run_whose_total_is_lowered_to_its_epoch_completes(tmp_path, capsys):
    engine = jre.build(small_config("name=l", "save_interval=2", tmp_path=tmp_path))
    engine.run(engine.init(jax.random.key(0)), num_epochs=2)  # paused at 2 of 4 (64 steps)
    engine, state = jre.resume(tmp_path / "l", ["total_env_steps=128"])  # 2 epochs in all
    _, summary = engine.run(state)
    assert summary["status"] == summary_of(tmp_path / "l")["status"] == "completed"


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
def sweep_stop_recorded(module=sweep_module):
    """The sweep's (or `module`'s) `StopSignal`, to wait until its watcher thread has seen a
    signal."""
    stops = []
    original = module.stop_on_signals

    @contextlib.contextmanager
    def recording(*args, **kwargs):
        with original(*args, **kwargs) as stop:
            stops.append(stop)
            yield stop

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(module, "stop_on_signals", recording)
        yield stops


def send_and_wait(stops, sig) -> None:
    os.kill(os.getpid(), sig)
    deadline = time.monotonic() + 10
    while stops[-1].signame is None:
        assert time.monotonic() < deadline, "the signal was not seen"
        time.sleep(0.01)


def signal_as_a_groups_last_call_ends(monkeypatch, stops, index: int) -> None:
    """SIGINT as the sweep's group `index` (in `self.groups`) ends its last compiled call."""
    original = sweep_module.SweepDriver._chunk

    def chunk(self, group, runs, state, start, n, total):
        state = original(self, group, runs, state, start, n, total)
        if group.label == self.groups[index].label and start + n == total:
            send_and_wait(stops, signal.SIGINT)
        return state

    monkeypatch.setattr(sweep_module.SweepDriver, "_chunk", chunk)


def split_sweep(tmp_path):
    cfg = small_config("name=g", "save_interval=2", "loggers=[jsonl]", tmp_path=tmp_path)
    return lambda: jre.sweep(cfg, seeds=[0], grid=GRID, split_static=True)


def statuses(root) -> dict[str, str]:
    return {r["member"]: r["status"] for r in csv.DictReader((root / "sweep.csv").open())}


def test_a_signal_in_a_groups_last_epochs_stops_before_the_next_group(
    tmp_path, monkeypatch, capsys
):
    run_sweep = split_sweep(tmp_path)
    with sweep_stop_recorded() as stops:
        signal_as_a_groups_last_call_ends(monkeypatch, stops, 0)
        with pytest.raises(jre.TrainingInterrupted, match="stopped before") as e:
            run_sweep()
    root = tmp_path / "g"
    assert e.value.summary["status"] == summary_of(root)["status"] == "interrupted"
    assert statuses(root) == {GROUPS[0]: "completed", GROUPS[1]: "not_run"}
    assert "SIGINT: stopping after the epochs running now" in capsys.readouterr().err
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
    assert "stopped before training group1" in str(e.value)
    assert statuses(root) == {GROUPS[0]: "completed", GROUPS[1]: "not_run"}
    monkeypatch.undo()
    assert jre.resume_sweep(root)["completed"] == 2


def test_a_sweep_started_over_and_stopped_early_never_shows_the_old_members(tmp_path, monkeypatch):
    """The second sweep (another lr) stops before its second group: that group's members are
    `not_run`, not the first sweep's completed ones, and resume trains them with the new lr."""
    cfg = small_config("name=g", "save_interval=2", "loggers=[jsonl]", tmp_path=tmp_path)
    jre.sweep(cfg, seeds=[0], grid=GRID, split_static=True)
    again = small_config(
        "name=g", "save_interval=2", "loggers=[jsonl]", "algo.lr=0.002", tmp_path=tmp_path
    )
    original = sweep_module.SweepDriver._chunk

    with sweep_stop_recorded() as stops:

        def chunk(self, group, runs, state, start, n, total):
            state = original(self, group, runs, state, start, n, total)
            if group.label == self.groups[0].label and start + n == total:
                send_and_wait(stops, signal.SIGINT)
            return state

        monkeypatch.setattr(sweep_module.SweepDriver, "_chunk", chunk)
        with pytest.raises(jre.TrainingInterrupted):
            jre.sweep(again, seeds=[0], grid=GRID, split_static=True)
    root = tmp_path / "g"
    assert statuses(root) == {GROUPS[0]: "completed", GROUPS[1]: "not_run"}
    assert not (root / GROUPS[1] / "policy" / "params.npz").exists()
    monkeypatch.undo()
    assert jre.resume_sweep(root)["completed"] == 2
    for member in GROUPS:
        assert jre.load_config(root / member / "config.yaml").algo.lr == 0.002


def test_a_signal_while_the_first_group_compiles_is_before_training(tmp_path, monkeypatch, capsys):
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
    err = capsys.readouterr().err  # (no promise of a checkpoint and summary)
    assert "SIGINT: stopping before training starts" in err and "summary follow" not in err


def test_an_interrupted_sweeps_table_counts_the_returns_reached(tmp_path, monkeypatch):
    cfg = small_config("name=i", "save_interval=2", "loggers=[jsonl]", tmp_path=tmp_path)
    original = sweep_module.SweepDriver._chunk

    with sweep_stop_recorded() as stops:

        def chunk(self, group, runs, state, start, n, total):
            state = original(self, group, runs, state, start, n, total)
            if start == 0:
                send_and_wait(stops, signal.SIGINT)  # after epoch 2's evaluation
            return state

        monkeypatch.setattr(sweep_module.SweepDriver, "_chunk", chunk)
        with pytest.raises(jre.TrainingInterrupted) as e:
            jre.sweep(cfg, seeds=[0, 1])
    (setting,) = e.value.summary["settings"]
    assert setting["seeds"] == 2 and setting["mean"] is not None
    assert set(statuses(tmp_path / "i").values()) == {"interrupted"}


def test_a_signal_after_training_ended_says_the_run_is_closing_not_starting(capsys, monkeypatch):
    from jaxrl_engine.run import signals

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    monkeypatch.setattr(signals, "_pending", [])
    try:
        signals.stop_before_training()  # the CLI's start-up handler
        signals._record_early(signal.SIGINT, None)
        assert "SIGINT: stopping before training starts" in capsys.readouterr().err
        signals._pending.clear()
        with signals.stop_on_signals():
            pass  # a training ran and gave the CLI's handler back
        signals._record_early(signal.SIGINT, None)  # (as the handler would, while it closes)
        err = capsys.readouterr().err
        assert "SIGINT: the run has ended and is closing" in err and "before training" not in err
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        signals._training_ended = False


def test_a_signal_while_an_interrupted_run_closes_is_its_second_and_exits_at_once(monkeypatch):
    # The first SIGINT stopped the training (its handler took it); one more while the run
    # closes (the CLI's handler is back) ends the process at once, as the README promises.
    from jaxrl_engine.run import signals

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    monkeypatch.setattr(signals, "_pending", [])
    exits: list[int] = []
    monkeypatch.setattr(signals.os, "_exit", exits.append)
    try:
        signals.stop_before_training()
        with signals.stop_on_signals() as stop:
            stop.signame = "SIGINT"  # (as its watcher records the first signal)
        signals._record_early(signal.SIGINT, None)
        assert exits == [128 + signal.SIGINT]
        signals._pending.clear()  # (the fake exit returned: as a fresh process)
        signals.stop_before_training()
        exits.clear()
        with signals.stop_on_signals():
            pass
        signals._record_early(signal.SIGINT, None)
        assert exits == []
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        signals._training_ended = signals._stopped_in_training = False


def test_a_signal_after_the_last_epoch_lets_the_run_complete_and_says_so(tmp_path, capsys):
    with sweep_stop_recorded(driver_module) as stops:

        class SignalAtTheEnd(jre.HostHook):
            def end(self, run, state):  # (as the final checkpoint or the export is written)
                send_and_wait(stops, signal.SIGTERM)

        engine = jre.build(small_config(tmp_path=tmp_path), host_hooks=[SignalAtTheEnd()])
        _, summary = engine.run(engine.init(jax.random.key(0)))
    assert summary["status"] == "completed"
    err = capsys.readouterr().err
    assert "SIGTERM: the run has trained its last epoch; its checkpoint, summary and export" in err
    assert "stopping after the epochs running now" not in err


def test_a_signal_during_the_runs_last_compiled_call_says_the_run_completes(
    tmp_path, monkeypatch, capsys
):
    # The signal lands while the last epochs run: no stop comes after them (the run ends
    # there), so the message says the run completes, not that it stops.
    original = driver_module.Driver._chunk
    with sweep_stop_recorded(driver_module) as stops:

        def chunk(self, engine, state, run, hooks, stop=None):
            out = original(self, engine, state, run, hooks, stop)
            if stop is not None and stop.last:  # (as the last compiled call ends)
                send_and_wait(stops, signal.SIGTERM)
            return out

        monkeypatch.setattr(driver_module.Driver, "_chunk", chunk)
        engine = jre.build(small_config("save_interval=2", tmp_path=tmp_path))
        _, summary = engine.run(engine.init(jax.random.key(0)))
    assert summary["status"] == "completed"
    err = capsys.readouterr().err
    assert "SIGTERM: the epochs running now are the last this run trains" in err
    assert "stopping after the epochs running now" not in err


def test_a_signal_in_the_last_groups_last_epochs_lets_the_sweep_complete(
    tmp_path, monkeypatch, capsys
):
    run_sweep = split_sweep(tmp_path)
    with sweep_stop_recorded() as stops:
        signal_as_a_groups_last_call_ends(monkeypatch, stops, -1)
        summary = run_sweep()
    assert summary["status"] == "completed" and summary["completed"] == 2
    err = capsys.readouterr().err
    assert "SIGINT: the epochs running now are the last this run trains" in err
    assert "stopping after the epochs running now" not in err
