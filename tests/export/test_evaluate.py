"""`jaxrl-engine eval`: the exported policy's episodes are the trained policy's episodes."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

import jaxrl_engine as jre
from jaxrl_engine import cli
from jaxrl_engine.core.phases import evaluate_episodes
from jaxrl_engine.envs.gymnax_env import GymnaxEnv
from jaxrl_engine.export.evaluate import evaluate_run
from jaxrl_engine.export.policy import ExportError, acting_function
from tests.conftest import small_config


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval")
    cfg = small_config("total_env_steps=256", "eval.env_params={gravity: 12.0}", tmp_path=root)
    engine = jre.build(cfg)
    state, _ = engine.run(engine.init(jax.random.key(0)))
    return engine, state, root / cfg.name


def test_saved_policy_plays_the_same_episodes_as_the_trained_one(run):
    engine, state, run_dir = run
    stats = evaluate_run(run_dir, episodes=12, seed=5)
    # The same episodes with the in-memory policy and the training code's act, on the
    # evaluation env params (gravity 12, not the default 9.8).
    env_params = GymnaxEnv.with_params(engine.env_params, {"gravity": 12.0})
    act = acting_function(engine)
    returns, lengths = jax.jit(
        lambda p, k: evaluate_episodes(engine.env, env_params, lambda o, _: act(p, o), 12, k)
    )(state.eval_params, jax.random.key(5))
    assert stats["episodes"] == 12 and stats["env_id"] == "CartPole-v1"
    assert stats["return_mean"] == pytest.approx(float(returns.mean()))
    assert stats["return_min"] == pytest.approx(float(returns.min()))
    assert stats["return_max"] == pytest.approx(float(returns.max()))
    assert stats["length_mean"] == pytest.approx(float(lengths.mean()))
    # CartPole pays 1 per step: the returns are the episode lengths.
    np.testing.assert_allclose(returns, lengths)


def test_cli_eval_prints_statistics_as_last_line(run, capsys):
    _, _, run_dir = run
    assert cli.main(["eval", str(run_dir), "--episodes", "8"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    stats = json.loads(out[-1])
    assert stats["episodes"] == 8
    assert stats["return_min"] <= stats["return_mean"] <= stats["return_max"]
    assert "8 episodes" in out[0]


def test_eval_without_a_policy_exits_2(tmp_path, capsys):
    (tmp_path / "config.yaml").write_text("name: x\n")
    with pytest.raises(ExportError, match="no exported policy"):
        evaluate_run(tmp_path)
    assert cli.main(["eval", str(tmp_path)]) == cli.EXIT_BAD_INPUT
    assert "no exported policy" in capsys.readouterr().err
    # A universal-path torch policy is never exported: said so, with what to use instead.
    (tmp_path / "config.yaml").write_text(
        "algo:\n  name: ppo\n  torch_policy:\n    factory: mynets:make\n    path: universal\n"
    )
    with pytest.raises(ExportError, match=r"path=universal.*make_policy"):
        evaluate_run(tmp_path)
    assert cli.main(["export", str(tmp_path)]) == cli.EXIT_BAD_INPUT  # (not: try --checkpoint)
    err = capsys.readouterr().err
    assert "path=universal" in err and "make_policy" in err and "--checkpoint exports" not in err
    # A path that does not exist is named as such, before JAX is imported.
    assert cli.main(["eval", str(tmp_path / "nowhere")]) == cli.EXIT_BAD_INPUT
    assert "nowhere' does not exist" in capsys.readouterr().err


def test_many_episodes_run_in_rounds_of_bounded_size(run, monkeypatch):
    """More episodes than `EVAL_BATCH` run in rounds (memory stays bounded): with rounds of
    4, 10 episodes are the first 10 of rounds of fresh episodes, and `run_dir` is absolute."""
    import jaxrl_engine.export.evaluate as evaluate_module

    engine, state, run_dir = run
    monkeypatch.setattr(evaluate_module, "EVAL_BATCH", 4)
    stats = evaluate_run(run_dir, episodes=10, seed=5)
    env_params = GymnaxEnv.with_params(engine.env_params, {"gravity": 12.0})
    act = acting_function(engine)
    returns, _ = jax.jit(
        lambda p, k: evaluate_episodes(engine.env, env_params, lambda o, _: act(p, o), 4, k, 10)
    )(state.eval_params, jax.random.key(5))
    assert stats["episodes"] == 10 and returns.shape == (10,)
    assert stats["return_mean"] == pytest.approx(float(returns.mean()))
    assert stats["run_dir"] == str(run_dir.absolute())


def test_a_truncated_exported_policy_exits_2_naming_it(run, tmp_path, capsys):
    import shutil

    _, _, run_dir = run
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    exported = copy / "policy" / "act.jaxexport"
    exported.write_bytes(exported.read_bytes()[:100])
    with pytest.raises(ExportError, match="does not hold a readable exported policy"):
        evaluate_run(copy)
    assert cli.main(["eval", str(copy)]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"jaxrl-engine export {copy} --checkpoint" in err


def test_an_env_id_edited_in_config_yaml_is_named_as_the_cause(run, tmp_path, capsys):
    import shutil

    _, _, run_dir = run
    copy = tmp_path / "edited"
    shutil.copytree(run_dir, copy)
    config = copy / "config.yaml"
    edited = config.read_text().replace("id: CartPole-v1", "id: Acrobot-v1")
    config.write_text(edited.replace("gravity: 12.0", "max_steps_in_episode: 500"))
    assert cli.main(["eval", str(copy)]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert f"{config} names env 'Acrobot-v1', the policy was exported for 'CartPole-v1'" in err
    assert "the config was edited" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--episodes", "99999999999999"], "give 1 to 10,000,000"),
        (["--episodes", "0"], "give 1 to 10,000,000"),
        (["--seed", "-1"], "seed=-1: a seed is an int from 0 to 4294967295"),
        (["--seed", "1180591620717411303424"], "a seed is an int from 0 to 4294967295"),
    ],
)
def test_eval_refuses_what_it_cannot_run(run, capsys, argv, message):
    _, _, run_dir = run
    assert cli.main(["eval", str(run_dir), *argv]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_eval_of_a_stopped_run_names_export_from_its_checkpoint(run, tmp_path, capsys):
    import shutil

    _, _, run_dir = run
    copy = tmp_path / "stopped"
    shutil.copytree(run_dir, copy)
    shutil.rmtree(copy / "policy")  # as a run stopped by a signal leaves it
    assert cli.main(["eval", str(copy)]) == cli.EXIT_BAD_INPUT
    assert f"`jaxrl-engine export {copy} --checkpoint`" in capsys.readouterr().err


def test_sigterm_ends_a_long_eval_at_once(run):
    """A Python handler would run only after the XLA call returns (minutes for many
    episodes); eval has nothing to save, so the signal's default action ends it."""
    import signal
    import subprocess
    import sys
    import time

    _, _, run_dir = run
    proc = subprocess.Popen(
        [sys.executable, "-m", "jaxrl_engine.cli", "eval", str(run_dir), "--episodes", "9000000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    time.sleep(8)  # imports done, the episodes running
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGTERM
