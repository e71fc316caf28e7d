"""The driver's side of runs that survive, in-process: checkpoint cadence, resume from Python,
the NaN stop (failing batch written, last good checkpoint untouched), and run directories whose
checkpoints do not fit the state that is started in them."""

from __future__ import annotations

import errno
import hashlib
import json
import os

import jax
import numpy as np
import pytest

import jaxrl_engine as jre
from jaxrl_engine.compose import resume
from jaxrl_engine.io.checkpoint import Checkpointer, CheckpointError
from jaxrl_engine.run import host_hooks
from jaxrl_engine.run.run_dir import RunDir
from tests.conftest import NaNRewardsFrom, small_config


def epochs_of(run_dir) -> list[int]:
    checkpoints = Checkpointer(run_dir / "checkpoints", read_only=True)
    try:
        return checkpoints.epochs()
    finally:
        checkpoints.close()


def logged(run_dir) -> list[int]:
    return [json.loads(x)["epoch"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_checkpoints_every_save_interval_epochs_and_after_the_last_keeping_the_newest(tmp_path):
    cfg = small_config(
        "total_env_steps=448", "save_interval=2", "keep_checkpoints=2", tmp_path=tmp_path
    )  # 7 epochs: saves after 2, 4, 6 and 7; keeps 6 and 7
    engine = jre.build(cfg)
    engine.run(engine.init(jax.random.key(0)))
    run_dir = tmp_path / cfg.name
    assert epochs_of(run_dir) == [6, 7]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["checkpoint"] == str((run_dir / "checkpoints" / "epoch_7").absolute())


def test_save_interval_0_writes_no_checkpoint(tmp_path):
    cfg = small_config("save_interval=0", tmp_path=tmp_path)
    engine = jre.build(cfg)
    engine.run(engine.init(jax.random.key(0)))
    assert not (tmp_path / cfg.name / "checkpoints").exists()
    assert json.loads((tmp_path / cfg.name / "summary.json").read_text())["checkpoint"] is None


def test_python_resume_continues_metrics_and_state_like_one_run(tmp_path):
    straight_cfg = small_config("total_env_steps=384", "name=straight", tmp_path=tmp_path)
    engine = jre.build(straight_cfg)  # 6 epochs
    straight, _ = engine.run(engine.init(jax.random.key(4)))

    cfg = small_config("total_env_steps=384", "save_interval=3", "name=split", tmp_path=tmp_path)
    engine = jre.build(cfg)
    engine.run(engine.init(jax.random.key(4)), num_epochs=4)  # checkpoints after 3 and 4
    run_dir = tmp_path / "split"
    checkpoints = Checkpointer(run_dir / "checkpoints")
    checkpoints._manager.delete(4)  # as if the process died in epoch 5, after logging epoch 4
    checkpoints.close()
    assert logged(run_dir) == [1, 2, 3, 4]

    engine, state = resume(run_dir)
    assert int(state.counters.epoch) == 3
    assert logged(run_dir) == [1, 2, 3, 4]  # resume only reads; `run` (holding the lock)
    assert engine.driver.cfg.name == "split" and engine.driver.cfg.save_interval == 3
    resumed, history_summary = engine.run(state)
    history = history_summary["records"]
    assert [r["epoch"] for r in history] == [4, 5, 6]
    assert logged(run_dir) == [1, 2, 3, 4, 5, 6]  # puts back the checkpoint's copy first
    for a, b in zip(
        jax.tree.leaves(straight.train.params), jax.tree.leaves(resumed.train.params), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_resume_with_overrides_that_change_no_shape_extends_the_run(tmp_path):
    cfg = small_config(tmp_path=tmp_path)  # 4 epochs
    engine = jre.build(cfg)
    engine.run(engine.init(jax.random.key(0)))
    engine, state = resume(tmp_path / cfg.name, ["total_env_steps=384", "algo.ent_coef=0.0"])
    assert engine.num_epochs == 6 and int(state.counters.epoch) == 4
    _, history_summary = engine.run(state)
    history = history_summary["records"]
    assert [r["epoch"] for r in history] == [5, 6]


def test_nan_rewards_in_epoch_3_stop_the_run_keep_checkpoint_2_and_write_the_batch(tmp_path):
    cfg = small_config(
        "total_env_steps=384", "save_interval=1", "eval.interval=10", tmp_path=tmp_path
    )
    engine = jre.build(cfg, env=NaNRewardsFrom(start=2 * 16))
    run_dir = tmp_path / cfg.name
    with pytest.raises(jre.NonFiniteError) as info:
        engine.run(engine.init(jax.random.key(0)))
    error = info.value
    assert (error.phase, error.quantity, error.epoch) == ("rollout", "rollout/reward_mean", 3)
    assert "phase 'rollout', quantity 'rollout/reward_mean', epoch 3" in str(error)
    notes = " ".join(error.__notes__)
    batch_file = run_dir / "nonfinite_epoch_3.npz"
    assert str(batch_file) in notes and "epoch_2" in notes

    assert logged(run_dir) == [1, 2]
    assert epochs_of(run_dir) == [1, 2]  # nothing written for the failing epoch
    fresh = jre.build(cfg, env=NaNRewardsFrom(start=2 * 16))  # the env state is part of it
    checkpoints = Checkpointer(run_dir / "checkpoints", read_only=True)
    state, checkpoint = checkpoints.restore(fresh)
    assert checkpoint.epoch == 2 and int(state.counters.epoch) == 2
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(state.train.params))

    batch = np.load(batch_file)
    rewards = batch["buffer.reward"]
    assert rewards.shape == (16, 4) and np.isnan(rewards).all()
    assert "batch.advantages" in batch and "env.obs" in batch
    assert np.isnan(batch["metrics/rollout/reward_mean"])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "non_finite" and summary["epochs"] == 2
    assert summary["failing_batch"] == str(batch_file)


def test_a_non_finite_run_without_checkpoints_says_so_and_a_fresh_start_clears_its_batch(
    tmp_path,
):
    cfg = small_config("save_interval=0", "eval.interval=10", tmp_path=tmp_path)
    engine = jre.build(cfg, env=NaNRewardsFrom(start=2 * 16))
    with pytest.raises(jre.NonFiniteError) as info:
        engine.run(engine.init(jax.random.key(0)))
    notes = " ".join(info.value.__notes__)
    assert "no checkpoint was written before it" in notes and "None" not in notes
    batch = tmp_path / cfg.name / "nonfinite_epoch_3.npz"
    assert batch.is_file()
    clean = jre.build(cfg)  # started over (no checkpoint to refuse it), with finite rewards
    _, summary = clean.run(clean.init(jax.random.key(0)))
    assert summary["status"] == "completed" and not batch.exists()


def test_a_fresh_run_over_an_unfinished_one_is_refused_naming_resume(tmp_path):
    cfg = small_config("save_interval=1", tmp_path=tmp_path)
    engine = jre.build(cfg)
    engine.run(engine.init(jax.random.key(0)), num_epochs=2)  # 2 of 4 epochs
    again = jre.build(cfg)
    with pytest.raises(CheckpointError, match=r"unfinished run \(checkpoint of epoch 2 of 4\)"):
        again.run(again.init(jax.random.key(0)))
    assert epochs_of(tmp_path / cfg.name) == [1, 2]  # untouched
    assert logged(tmp_path / cfg.name) == [1, 2]


def test_a_fresh_run_over_a_finished_one_starts_it_over(tmp_path, capsys):
    cfg = small_config(tmp_path=tmp_path)
    for _ in range(2):
        engine = jre.build(cfg)
        engine.run(engine.init(jax.random.key(0)))
    assert "held a finished run; starting it over" in capsys.readouterr().err
    assert logged(tmp_path / cfg.name) == [1, 2, 3, 4]  # not 1..4 twice
    assert epochs_of(tmp_path / cfg.name) == [4]


def test_a_start_over_stopped_while_compiling_leaves_no_summary_of_the_replaced_run(
    tmp_path, monkeypatch
):
    # Its records and checkpoints are gone by then: a summary saying "completed" with a
    # checkpoint that no longer exists would contradict the directory.
    cfg = small_config(tmp_path=tmp_path)
    engine = jre.build(cfg)
    engine.run(engine.init(jax.random.key(0)))
    again = jre.build(cfg)

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(again, "warm_up", ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        again.run(again.init(jax.random.key(0)))
    assert not (tmp_path / cfg.name / "summary.json").exists()
    assert logged(tmp_path / cfg.name) == [] and epochs_of(tmp_path / cfg.name) == []


def test_a_fresh_run_of_another_env_over_a_finished_one_is_refused(tmp_path):
    # e.g. `train env.id=Acrobot-v1` with the default name: the finished CartPole run is not
    # this run's earlier version, and starting over would delete it.
    cfg = small_config(tmp_path=tmp_path)
    engine = jre.build(cfg)
    engine.run(engine.init(jax.random.key(0)))
    other = jre.build(small_config("env.id=Acrobot-v1", tmp_path=tmp_path))
    with pytest.raises(CheckpointError, match=r"finished run of ppo on CartPole-v1; this one is"):
        other.run(other.init(jax.random.key(0)))
    assert epochs_of(tmp_path / cfg.name) == [4]  # untouched
    assert logged(tmp_path / cfg.name) == [1, 2, 3, 4]


def test_a_fresh_run_over_a_finished_run_of_a_users_algorithm_is_refused(tmp_path):
    # Its config.yaml says algo.name=ppo (a config cannot name the user's algorithm); its
    # checkpoints name the algorithm that trained it
    cfg = small_config(tmp_path=tmp_path)
    sizes = jre.build(cfg)
    mine = jre.build(cfg, algorithm=sizes.algo._replace(name="mine"))
    mine.run(mine.init(jax.random.key(0)))
    other = jre.build(cfg)
    with pytest.raises(CheckpointError, match=r"finished run of mine on CartPole-v1; this one is"):
        other.run(other.init(jax.random.key(0)))
    assert epochs_of(tmp_path / cfg.name) == [4]  # untouched
    assert logged(tmp_path / cfg.name) == [1, 2, 3, 4]


def test_a_state_older_than_the_directorys_checkpoints_is_refused(tmp_path):
    cfg = small_config("save_interval=1", tmp_path=tmp_path)
    engine = jre.build(cfg)
    state = engine.init(jax.random.key(0))
    state, _ = engine.epoch(state)
    later = jre.build(cfg)
    later.run(later.init(jax.random.key(0)), num_epochs=3)
    with pytest.raises(CheckpointError, match=r"checkpoints up to epoch 3, after this state's"):
        engine.run(state)


def test_cli_reports_a_non_finite_stop_with_exit_3_and_the_summary(tmp_path, monkeypatch, capsys):
    import jaxrl_engine.compose as engine_module
    from jaxrl_engine import cli
    from tests.conftest import SMALL

    real_build = engine_module.build
    monkeypatch.setattr(
        engine_module, "build", lambda cfg, **kw: real_build(cfg, env=NaNRewardsFrom(32), **kw)
    )
    argv = ["train", *SMALL, f"run_dir={tmp_path}", "name=poisoned", "eval.interval=10"]
    assert cli.main(argv) == cli.EXIT_NON_FINITE
    out, err = capsys.readouterr()
    assert json.loads(out.strip().splitlines()[-1])["status"] == "non_finite"
    assert err.startswith("jaxrl-engine: non-finite value in phase 'rollout'")
    assert "epoch 3" in err and "nonfinite_epoch_3.npz" in err and "Traceback" not in err


def test_several_epochs_per_call_stop_after_the_epoch_whose_guard_fired():
    """The driver's multi-epoch call ends its loop at a firing nan_guard, so the state it
    returns (whose batch the driver writes) is the failing epoch's, not a later one's."""
    cfg = small_config("total_env_steps=384", "eval.interval=6")  # 6 epochs, one call
    engine = jre.build(cfg, env=NaNRewardsFrom(start=2 * 16))
    assert engine.epochs_per_call == 6
    state, table, ran = engine.call("epochs", engine.init(jax.random.key(0)), 6)
    assert int(ran) == 3 and int(state.counters.epoch) == 3
    guard = np.asarray(table["guard/rollout"])
    assert list(guard[:2]) == [-1, -1] and guard[2] >= 0


def test_a_checkpoint_records_the_metrics_file_by_length_and_hash_not_its_records(tmp_path):
    """A checkpoint's size does not grow with the run (it records `metrics.jsonl`'s length and
    SHA-256, not its lines); a resume cuts the file back to that length (the records after
    the checkpoint go) after checking the file starts as the checkpoint saw it."""
    cfg = small_config("total_env_steps=384", "save_interval=1", tmp_path=tmp_path)  # 6 epochs
    engine = jre.build(cfg)
    engine.run(engine.init(jax.random.key(0)), num_epochs=5)
    run_dir = tmp_path / cfg.name
    checkpoints = Checkpointer(run_dir / "checkpoints")
    metas = {e: checkpoints.meta_file(e).stat().st_size for e in checkpoints.epochs()}
    info = checkpoints.info(4)
    checkpoints._manager.delete(5)  # as if killed in epoch 6, after logging epoch 5
    checkpoints.close()
    # (a leaf's CRC-32 takes 1 to 10 digits: the sizes vary by some bytes; the records of
    # epochs 2-5 would add over 1,000)
    record = len((run_dir / "metrics.jsonl").read_bytes().splitlines()[0])
    assert max(metas.values()) - min(metas.values()) < min(400, record), (metas, record)
    text = (run_dir / "metrics.jsonl").read_bytes()
    four = b"".join(text.splitlines(keepends=True)[:4])
    assert info.metrics_log == {
        "bytes": len(four),
        "sha256": hashlib.sha256(four).hexdigest(),
        "records": 4,
    }
    engine, state = resume(run_dir)
    engine.run(state)
    assert logged(run_dir) == [1, 2, 3, 4, 5, 6]
    assert (run_dir / "metrics.jsonl").read_bytes().startswith(four)


def test_a_damaged_metrics_file_is_kept_to_its_whole_records_with_a_warning(tmp_path, capsys):
    cfg = small_config("save_interval=2", tmp_path=tmp_path)  # 4 epochs
    engine = jre.build(cfg)
    engine.run(engine.init(jax.random.key(0)), num_epochs=3)
    run_dir = tmp_path / cfg.name
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    lines[0] = lines[0][:10]  # (an edit: epoch 1's record is no longer a record)
    (run_dir / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))
    engine, state = resume(run_dir)
    assert int(state.counters.epoch) == 3
    engine.run(state)
    assert "is not what the checkpoint of epoch 3 saw (3 records" in capsys.readouterr().err
    assert logged(run_dir) == [2, 3, 4]  # the whole records kept


def test_a_failed_write_leaves_metrics_jsonl_at_its_last_whole_record_naming_it(tmp_path):
    """A full disk in the middle of a record: the file is cut back to the records before it,
    and the error names the file."""
    out = RunDir(tmp_path / "run", small_config("loggers=[jsonl]", tmp_path=tmp_path))
    out.open_logs(0)
    out.log({"epoch": 1, "x": 1.0})

    def half_then_full(data):
        os.write(out._metrics.fileno(), bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    out._metrics.write = half_then_full
    with pytest.raises(OSError, match=r"No space left on device: .*metrics.jsonl"):
        out.log({"epoch": 2, "x": 2.0})
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == '{"epoch": 1, "x": 1.0}\n'
    assert out.metrics_mark()["records"] == 1
    out.close()


def test_a_full_disk_exporting_the_policy_fails_the_run_leaving_no_half_policy(
    tmp_path, monkeypatch
):
    """The summary said "completed" before the export; an export that fails (a full disk)
    makes it "failed" with the error, removes the artefacts it wrote, keeps the checkpoint."""

    def half_export(engine, params, where):
        where.mkdir(parents=True, exist_ok=True)
        (where / "act.jaxexport").write_bytes(b"x")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(host_hooks, "export_policy", half_export)
    cfg = small_config(tmp_path=tmp_path)
    engine = jre.build(cfg)
    with pytest.raises(
        OSError, match=r"No space left on device \(exporting the policy\): .*policy"
    ):
        engine.run(engine.init(jax.random.key(0)))
    run_dir = tmp_path / cfg.name
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and "No space left" in summary["error"]
    assert not list((run_dir / "policy").glob("*"))
    assert epochs_of(run_dir) == [4]


def test_a_checkpoint_written_with_the_records_themselves_still_resumes(tmp_path):
    """Checkpoints of earlier versions hold `metrics.jsonl`'s records (`metrics_lines`), not
    its length and hash: a resume from one puts those records back, as it did."""
    cfg = small_config("save_interval=2", tmp_path=tmp_path)  # 4 epochs
    engine = jre.build(cfg)
    engine.run(engine.init(jax.random.key(0)), num_epochs=3)
    run_dir = tmp_path / cfg.name
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    meta_path = Checkpointer(run_dir / "checkpoints", read_only=True).meta_file(3)
    meta = json.loads(meta_path.read_text())
    del meta["metrics_log"], meta["sha256"]
    meta["metrics_lines"], meta["format"] = lines, 3  # (as earlier versions wrote it)
    canonical = json.dumps(meta, sort_keys=True, separators=(",", ":"), allow_nan=False)
    meta["sha256"] = hashlib.sha256(canonical.encode()).hexdigest()
    meta_path.write_text(json.dumps(meta))
    (run_dir / "metrics.jsonl").write_text("")  # (lost: the checkpoint's records put it back)
    engine, state = resume(run_dir)
    engine.run(state)
    assert logged(run_dir) == [1, 2, 3, 4]
    assert (run_dir / "metrics.jsonl").read_text().startswith("".join(x + "\n" for x in lines))


def halve_lr(phase):
    def wrapped(state):
        state, metrics = phase(state)
        hp = state.hparams.replace(lr=state.hparams.lr / 2)
        return state.replace(hparams=hp), {**metrics, "train/my_lr": hp.lr}

    return wrapped


def test_a_resume_keeps_hyperparameters_a_hook_changed_unless_overridden(tmp_path, capsys):
    """A hook that anneals `state.hparams` resumes exactly (the checkpoint's values, not the
    config's); an override of the key applies from the resumed epoch on."""
    hooks = {"train": [halve_lr]}
    cfg = small_config("name=straight", tmp_path=tmp_path)  # 4 epochs
    engine = jre.build(cfg, hooks=hooks)
    straight, _ = engine.run(engine.init(jax.random.key(0)))
    cfg = small_config("name=split", "save_interval=2", tmp_path=tmp_path)
    engine = jre.build(cfg, hooks=hooks)
    engine.run(engine.init(jax.random.key(0)), num_epochs=2)
    engine, state = resume(tmp_path / "split", hooks=hooks)
    assert "hyperparameters as the checkpoint has them: algo.lr=" in capsys.readouterr().err
    resumed, _ = engine.run(state)
    for a, b in zip(jax.tree.leaves(straight.train), jax.tree.leaves(resumed.train), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    engine, state = resume(tmp_path / "split", ["algo.lr=0.125"], hooks=hooks)
    assert float(state.hparams.lr) == 0.125
    with pytest.warns(UserWarning, match=r"trained with hooks on train, which this resume lacks"):
        resume(tmp_path / "split")  # (the CLI's `--resume` cannot pass them)


def test_open_logs_keeps_the_last_numeric_evaluation_and_counts_the_files_bytes(tmp_path):
    """On resume: the last evaluation is the last with a number (not one logged as null), by
    the checkpoint's mark and by the fallback; a kept line whose bytes are not UTF-8 is
    rewritten, so the mark the run records next is the file's own."""
    cfg = small_config("loggers=[jsonl]", tmp_path=tmp_path)
    lines = [
        b'{"epoch": 1, "evaluate/episode_return": 5.0, "note": "\xff"}\n',
        b'{"epoch": 2, "evaluate/episode_return": null}\n',
    ]
    text = b"".join(lines)
    mark = {"bytes": len(text), "sha256": hashlib.sha256(text).hexdigest(), "records": 2}
    for given in (mark, None):
        (tmp_path / "run").mkdir(exist_ok=True)
        (tmp_path / "run" / "metrics.jsonl").write_bytes(text)
        out = RunDir(tmp_path / "run", cfg)
        last, last_eval = out.open_logs(2, mark=given)
        assert last["epoch"] == 2 and last_eval["epoch"] == 1
        stored = (tmp_path / "run" / "metrics.jsonl").read_bytes()
        assert out.metrics_mark()["bytes"] == len(stored)
        assert out.metrics_mark()["sha256"] == hashlib.sha256(stored).hexdigest()
        out.close()
