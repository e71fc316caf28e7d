"""A run directory belongs to one run at a time, holds no symlinks, and loses no result:
the lock, refused runs that change nothing, resuming a finished run, strict JSON."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import jax
import pytest

import jaxrl_engine as jre
from jaxrl_engine import cli
from jaxrl_engine.io.files import RunDirError, strict_json
from jaxrl_engine.run.run_dir import LOCK_FILE, RunDir, RunLock
from tests.conftest import SMALL, NaNRewardsFrom, small_config

ROOT = Path(__file__).resolve().parents[2]


def snapshot(directory: Path) -> dict[str, str]:
    """Every file under `directory` (symlinks not followed) -> sha256 of its bytes."""
    files = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file() and not path.is_symlink():
            files[str(path.relative_to(directory))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return files


def strict_loads(text: str) -> dict:
    def refuse(token: str):
        raise AssertionError(f"non-JSON token {token} on stdout")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A small finished run (4 epochs, checkpoints after 2 and 4)."""
    root = tmp_path_factory.mktemp("owned")
    cfg = small_config(f"run_dir={root}", "name=done", "save_interval=2", "loggers=[jsonl]")
    engine = jre.build(cfg)
    engine.run(engine.init(jax.random.key(0)))
    return root / "done"


@pytest.fixture
def run_copy(finished, tmp_path) -> Path:
    copy = tmp_path / "done"
    shutil.copytree(finished, copy)
    return copy


# ------------------------------------------------------------------------------------- the lock
def test_a_run_of_a_locked_directory_is_refused_naming_the_holder_and_changes_nothing(
    run_copy, capsys
):
    before = snapshot(run_copy)
    holder = RunLock(run_copy)
    holder.acquire()
    try:
        status = cli.main(["train", *SMALL, f"run_dir={run_copy.parent}", "name=done", "seed=7"])
        resumed = cli.main(["train", "--resume", str(run_copy)])
        exported = cli.main(["export", str(run_copy), "--checkpoint"])
    finally:
        holder.release()
    err = capsys.readouterr().err
    assert status == cli.EXIT_BAD_INPUT
    # A resume too, of a finished run as well: the run holding it may be starting it over
    assert resumed == cli.EXIT_BAD_INPUT
    assert err.count(f"is in use by another run (pid {os.getpid()})") == 3, err
    # Each with advice for what it was asked: `export` has no name= to choose
    assert "or choose another name=" in err.splitlines()[0]
    assert exported == cli.EXIT_BAD_INPUT and "or let it end: it exports its policy" in err
    assert "Traceback" not in err
    after = snapshot(run_copy)
    after.pop(LOCK_FILE), before.pop(LOCK_FILE)
    assert after == before  # config.yaml included: a refused run overwrites nothing


def test_a_stale_lock_of_a_dead_process_is_taken_over_with_a_notice(run_copy, capsys):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (run_copy / LOCK_FILE).write_text(f"{dead.pid}\n")  # written by a killed run: no flock held
    lock = RunLock(run_copy)
    lock.acquire()
    assert (run_copy / LOCK_FILE).read_text() == f"{os.getpid()}\n"
    lock.release()
    assert f"taking over the lock left by pid {dead.pid}" in capsys.readouterr().err
    assert (run_copy / LOCK_FILE).read_text() == ""  # a clean release leaves no pid behind


def test_one_process_cannot_hold_a_directory_twice(run_copy):
    first = RunLock(run_copy)
    first.acquire()
    try:
        with pytest.raises(RunDirError, match=f"pid {os.getpid()}"):
            RunLock(run_copy).acquire()
    finally:
        first.release()
    second = RunLock(run_copy)
    second.acquire()  # released: free again
    second.release()


CHILD = """
import sys
from jaxrl_engine import cli
sys.exit(cli.main(["train", *sys.argv[1:]]))
"""


def test_two_concurrent_runs_of_one_name_one_trains_the_other_exits_2(tmp_path):
    common = [*SMALL, f"run_dir={tmp_path}", "name=shared", "loggers=[jsonl]", "save_interval=4"]
    first_args = [*common, "seed=1", "total_env_steps=3200"]  # 50 epochs: still running below

    def start(args):
        return subprocess.Popen(
            [sys.executable, "-c", CHILD, *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    first = start(first_args)
    lock = tmp_path / "shared" / LOCK_FILE
    deadline = time.monotonic() + 120
    while not (lock.is_file() and lock.read_text().strip() == str(first.pid)):
        assert first.poll() is None, first.communicate()
        assert time.monotonic() < deadline, "the first run never took the lock"
        time.sleep(0.05)
    second = start([*common, "seed=2"])
    out2, err2 = second.communicate(timeout=300)
    out1, err1 = first.communicate(timeout=300)
    assert first.returncode == 0, err1
    assert second.returncode == cli.EXIT_BAD_INPUT, err2
    assert f"in use by another run (pid {first.pid})" in err2 and "Traceback" not in err2
    assert out2 == ""
    run = tmp_path / "shared"
    epochs = [
        json.loads(line)["epoch"] for line in (run / "metrics.jsonl").read_text().splitlines()
    ]
    assert epochs == list(range(1, 51))  # each epoch once: the first run's records alone
    assert "seed: 1\n" in (run / "config.yaml").read_text()
    assert strict_loads(out1.splitlines()[-1])["epochs"] == 50


# ------------------------------------------------------------------------------------- symlinks
@pytest.mark.parametrize("entry", ["config.yaml", "policy", "checkpoints/epoch_4"])
def test_a_symlink_inside_a_run_directory_is_refused_and_nothing_is_written_through_it(
    entry, run_copy, tmp_path, capsys
):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_text("precious")
    target = run_copy / entry
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    target.symlink_to(outside if entry != "config.yaml" else outside / "victim")
    status = cli.main(["train", *SMALL, f"run_dir={run_copy.parent}", "name=done"])
    resumed = cli.main(["train", "--resume", str(run_copy)])
    err = capsys.readouterr().err
    assert status == cli.EXIT_BAD_INPUT and resumed == cli.EXIT_BAD_INPUT, err
    assert "holds symlinks" in err and str(target) in err and "Traceback" not in err
    assert [p.name for p in outside.iterdir()] == ["victim"]
    assert (outside / "victim").read_text() == "precious"


# ---------------------------------------------------------------------------- no result is lost
def test_resuming_a_finished_run_prints_its_summary_and_rewrites_nothing(run_copy, capsys):
    before = snapshot(run_copy)
    summary = json.loads((run_copy / "summary.json").read_text())
    assert cli.main(["train", "--resume", str(run_copy)]) == 0
    out, err = capsys.readouterr()
    assert strict_loads(out.strip().splitlines()[-1]) == summary
    assert "is finished (epoch 4 of 4)" in err
    after = snapshot(run_copy)
    after.pop(LOCK_FILE), before.pop(LOCK_FILE)
    assert after == before


def test_a_run_killed_after_its_last_checkpoint_is_completed_on_resume_without_nulls(
    run_copy, capsys
):
    # As if killed between the final checkpoint and the end of the run.
    (run_copy / "summary.json").unlink()
    shutil.rmtree(run_copy / "policy")
    assert cli.main(["train", "--resume", str(run_copy)]) == 0
    summary = strict_loads(capsys.readouterr().out.strip().splitlines()[-1])
    last = json.loads((run_copy / "metrics.jsonl").read_text().splitlines()[-1])
    assert summary["status"] == "completed" and summary["epochs"] == 4
    assert summary["final_eval_return"] == last["evaluate/episode_return"]
    assert (run_copy / "policy" / "params.npz").is_file()
    assert json.loads((run_copy / "summary.json").read_text()) == summary
    # Nothing left to train: nothing compiled, and this call's rate is not made up.
    assert summary["compile_s"] == 0 and summary["trained_env_steps"] == 0
    assert summary["steps_per_second"] is None
    assert summary["run_wall_s"] >= last["wall_s"]


def test_a_resumed_runs_summary_says_which_numbers_are_this_calls(run_copy, capsys):
    last_record = json.loads((run_copy / "metrics.jsonl").read_text().splitlines()[-1])
    before = json.loads((run_copy / "summary.json").read_text())["run_wall_s"]
    assert before > last_record["wall_s"]  # its end (final checkpoint, export) came after it
    assert cli.main(["train", "--resume", str(run_copy), "total_env_steps=384"]) == 0
    out, err = capsys.readouterr()
    summary = strict_loads(out.strip().splitlines()[-1])
    # The annealed learning rate is stretched over the new total: said when resuming.
    assert "total_env_steps: 256 -> 384" in err
    assert "the learning rate (algo.anneal_lr): scheduled over the new total_env_steps" in err
    assert summary["epochs"] == 6 and summary["env_steps"] == 384
    assert summary["trained_env_steps"] == 128  # epochs 5 and 6
    assert summary["steps_per_second"] == pytest.approx(128 / summary["train_s"])
    # The run's wall time: the first call's whole (to its summary) and this one's.
    assert summary["run_wall_s"] == pytest.approx(before + summary["wall_s"], abs=0.05)
    records = [json.loads(x) for x in (run_copy / "metrics.jsonl").read_text().splitlines()]
    assert records[4]["wall_s"] > before  # epoch 5's, counted on from the first call's end
    # The algorithm's own name, quoted or not, is no change; nor is the torso auto resolves to.
    same = ["total_env_steps=448", 'algo.name="ppo"', "algo.torso=mlp"]
    assert cli.main(["train", "--resume", str(run_copy), *same]) == 0
    out, _ = capsys.readouterr()
    again = strict_loads(out.strip().splitlines()[-1])
    # This call's rate and times are its own, never the earlier summary's.
    assert again["trained_env_steps"] == 64
    assert again["steps_per_second"] == pytest.approx(64 / again["train_s"])


def test_a_finished_runs_resume_answers_without_taking_the_directory(run_copy, capsys, monkeypatch):
    # As on a read-only copy of the run: taking the lock (a write) is not needed to say so.
    before = snapshot(run_copy)
    earlier = json.loads((run_copy / "summary.json").read_text())

    def read_only(self):
        raise OSError(30, "Read-only file system", str(self.path))

    monkeypatch.setattr(RunLock, "acquire", read_only)
    assert cli.main(["train", "--resume", str(run_copy)]) == 0
    out, err = capsys.readouterr()
    assert strict_loads(out.strip().splitlines()[-1]) == earlier
    assert "is finished (epoch 4 of 4)" in err
    assert snapshot(run_copy) == before


def test_bytes_that_are_not_utf8_in_metrics_jsonl_do_not_stop_a_resume(run_copy, capsys):
    with (run_copy / "metrics.jsonl").open("ab") as f:
        f.write(b"\xff\xfe\n")
    assert cli.main(["train", "--resume", str(run_copy), "total_env_steps=384"]) == 0
    summary = strict_loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["status"] == "completed" and summary["epochs"] == 6
    lines = (run_copy / "metrics.jsonl").read_text().splitlines()  # UTF-8 again
    assert [json.loads(line)["epoch"] for line in lines] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("name", ["summary.json", "metrics.jsonl", "policy"])
def test_a_folder_where_a_run_file_belongs_is_refused_before_training(run_copy, name, capsys):
    path = run_copy / name
    if path.is_dir():
        shutil.rmtree(path)
        path.write_text("not a folder")
    else:
        path.unlink()
        path.mkdir()
    before = snapshot(run_copy)
    assert cli.main(["train", "--resume", str(run_copy), "total_env_steps=384"]) == 2
    err = capsys.readouterr().err
    assert f"{str(path)!r} is not a" in err and "Traceback" not in err, err
    after = snapshot(run_copy)
    after.pop(LOCK_FILE, None), before.pop(LOCK_FILE, None)
    assert after == before


def test_a_resumed_session_that_trains_nothing_keeps_the_earlier_summary_numbers(run_copy):
    earlier = json.loads((run_copy / "summary.json").read_text())
    earlier["status"] = "interrupted"  # as if SIGINT came after the final checkpoint
    (run_copy / "summary.json").write_text(json.dumps(earlier))
    engine, state = jre.resume(run_copy)
    _, summary = engine.run(state)
    assert summary["status"] == "completed"
    assert summary["final_eval_return"] == earlier["final_eval_return"] is not None
    assert summary["final_eval_epoch"] == summary["epochs"]  # (read back from metrics.jsonl)
    # This call's own rate is not the earlier call's: it trained nothing.
    assert summary["trained_env_steps"] == 0 and summary["steps_per_second"] is None


def test_resume_with_an_empty_path_exits_2(capsys):
    for argv in (["--resume", ""], ["--resume", " "], ["--from-checkpoint", "2"]):
        assert cli.main(["train", *argv]) == cli.EXIT_BAD_INPUT
        err = capsys.readouterr().err
        assert "--resume" in err and "Traceback" not in err


def test_stdout_json_is_strict_when_the_summary_holds_nan(tmp_path, capsys):
    # No evaluation before the stop: final_eval_return is NaN inside, null on stdout.
    import jaxrl_engine.compose as compose

    real_build = compose.build
    try:
        compose.build = lambda cfg, **kw: real_build(cfg, env=NaNRewardsFrom(32), **kw)
        argv = ["train", *SMALL, f"run_dir={tmp_path}", "name=poisoned", "eval.interval=10"]
        assert cli.main(argv) == cli.EXIT_NON_FINITE
    finally:
        compose.build = real_build
    summary = strict_loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["final_eval_return"] is None
    assert strict_json({"a": float("inf"), "b": [float("nan")]}) == (
        '{"a": 1.7976931348623157e+308, "b": [null]}'
    )


# ------------------------------------------------------------------- choosing an older checkpoint
def test_from_checkpoint_continues_an_older_checkpoint_and_sets_the_later_ones_aside(
    run_copy, capsys
):
    (run_copy / "summary.json").unlink()
    assert cli.main(["train", "--resume", str(run_copy), "--from-checkpoint", "2"]) == 0
    err = capsys.readouterr().err
    assert "from its checkpoint of epoch 2" in err and "set aside, not deleted" in err
    assert (run_copy / "discarded_checkpoints" / "epoch_4").is_dir()
    epochs = [
        json.loads(line)["epoch"] for line in (run_copy / "metrics.jsonl").read_text().splitlines()
    ]
    assert epochs == [1, 2, 3, 4]
    assert sorted(p.name for p in (run_copy / "checkpoints").iterdir() if "epoch" in p.name) == [
        "epoch_2",
        "epoch_4",
    ]
    assert cli.main(["train", "--resume", str(run_copy), "--from-checkpoint", "3"]) == 2
    assert "no checkpoint of epoch 3" in capsys.readouterr().err


def test_a_train_and_a_sweep_do_not_share_a_directory(run_copy, tmp_path):
    """A train into a sweep's directory (it holds sweep.json) and a sweep into a train run's
    (it holds metrics.jsonl) are refused before anything in it changes: either would replace
    the other's summary.json and mix their files."""
    cfg = small_config(f"run_dir={tmp_path}", "loggers=[jsonl]")
    sweep_dir = tmp_path / "a_sweep"
    sweep_dir.mkdir()
    (sweep_dir / "sweep.json").write_text("{}")
    with pytest.raises(RunDirError, match=r"sweep's directory .*sweep --resume"):
        RunDir(sweep_dir, cfg)
    before = snapshot(run_copy)
    with pytest.raises(RunDirError, match=r"train run's directory .*train --resume"):
        RunDir(run_copy, cfg, kind="sweep")
    assert snapshot(run_copy) == before
    RunDir(run_copy, cfg).release()  # each kind still opens its own


def test_a_sweep_refuses_a_member_folder_holding_a_run_not_its_own_and_writes_nothing(
    run_copy, tmp_path
):
    # A train run (then one in use) where a planned member's folder would be: the sweep would
    # replace its records, summary and policy with a member's, and its sweep.json would make
    # the train run a member that `train --resume` refuses.
    cfg = small_config(f"run_dir={tmp_path}", "name=sw", "loggers=[jsonl]")
    root = tmp_path / "sw"
    root.mkdir()
    shutil.copytree(run_copy, root / "seed1")
    before = snapshot(root)
    with pytest.raises(RunDirError, match=r"folder .*seed1' holds a run of its own \(check"):
        jre.sweep(cfg, seeds=[0, 1])
    after = snapshot(root)
    after.pop(LOCK_FILE, None)
    assert after == before and not (root / "sweep.json").exists()
    assert not (root / "checkpoints").exists() and not (root / "seed0").exists()
    shutil.rmtree(root / "seed1")
    (root / "seed1").mkdir()
    lock = RunLock(root / "seed1")
    lock.acquire()  # a run of that folder, still going
    try:
        with pytest.raises(
            RunDirError, match=rf"seed1' is in use by another run \(pid {os.getpid()}"
        ):
            jre.sweep(cfg, seeds=[0, 1])
    finally:
        lock.release()
    assert not (root / "sweep.json").exists()


def test_a_fresh_start_drops_the_old_tensorboard_events_a_resume_keeps_them(run_copy, tmp_path):
    """And `plot`'s default curves of the old records (a user's own file names stay)."""
    cfg = small_config(f"run_dir={tmp_path}", "loggers=[jsonl]")
    names = ["events.out.tfevents.0000000001.host.1.0", "curves.png", "curves_2_runs.png"]
    for name in [*names, "mine.png"]:
        (run_copy / name).write_bytes(b"old run")
    out = RunDir(run_copy, cfg)
    out.open_logs(2)  # a resumed run
    out.close()
    assert all((run_copy / name).is_file() for name in names)
    out = RunDir(run_copy, cfg)
    out.open_logs(0)  # a fresh state: the run starts over
    out.close()
    assert not any((run_copy / name).exists() for name in names)
    assert (run_copy / "mine.png").is_file()


def test_a_resumed_runs_records_count_wall_time_on(run_copy):
    """Records' wall_s after a resume continue from the last record's: a learning curve
    against wall time never runs backwards."""
    engine, state = jre.resume(run_copy, ["total_env_steps=512"])
    engine.run(state)
    walls = [json.loads(line)["wall_s"] for line in (run_copy / "metrics.jsonl").open()]
    assert len(walls) == 8 and walls == sorted(walls), walls


@pytest.mark.parametrize(
    "override, said",
    [
        ("algo.normalize_obs=true", "trained with algo.normalize_obs=False"),
        ("algo.activation=relu", "trained with algo.activation=tanh"),
        ("algo.name=dqn", "continues its checkpoint's algorithm (ppo)"),
    ],
)
def test_a_resume_refuses_changes_that_would_change_what_the_params_compute(
    run_copy, capsys, override, said
):
    # No shape changes (the layout check lets them through), but the trained network would
    # compute something else from the resumed epoch on, and that policy would be exported.
    before = snapshot(run_copy)
    assert cli.main(["train", "--resume", str(run_copy), "total_env_steps=384", override]) == 2
    assert said in capsys.readouterr().err
    after = snapshot(run_copy)
    after.pop(LOCK_FILE, None), before.pop(LOCK_FILE, None)
    assert after == before


def test_a_resume_below_the_checkpoints_progress_is_refused(run_copy, capsys):
    """A total_env_steps under what the checkpoint trained (a typo) would end the run at
    once, marked completed, its config.yaml rewritten to the new total and its policy
    exported; refused, the run directory stays as it was."""
    before = snapshot(run_copy)
    assert cli.main(["train", "--resume", str(run_copy), "total_env_steps=100"]) == 2
    err = capsys.readouterr().err
    assert "total_env_steps=100 (2 epochs of 64 env steps) is below" in err, err
    assert "(epoch 4)" in err and "give at least 256" in err and "Traceback" not in err
    after = snapshot(run_copy)
    after.pop(LOCK_FILE, None), before.pop(LOCK_FILE, None)
    assert after == before
    assert cli.main(["train", "--resume", str(run_copy), "total_env_steps=256"]) == 0


def test_a_resume_that_trains_on_removes_the_policy_of_the_state_it_resumed_from(run_copy):
    class Boom(jre.HostHook):  # the resume fails after its first chunk (as an interrupt would)
        def after_chunk(self, run, state):
            raise RuntimeError("stopped")

    assert (run_copy / "policy" / "params.npz").is_file()  # the finished run's, epoch 4
    engine, state = jre.resume(run_copy, ["total_env_steps=384"], host_hooks=[Boom()])
    with pytest.raises(RuntimeError, match="stopped"):
        engine.run(state)
    # The epoch-4 policy is not the run's any more: none, as after an interrupted run.
    assert not any((run_copy / "policy").glob("*"))
