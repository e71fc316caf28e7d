"""`jaxrl-engine train`: bad input exits 2 with one clear paragraph before any compile; a good
run ends its stdout with the JSON summary."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from unittest import mock

import jax
import pytest

import jaxrl_engine.compose as build_module
import jaxrl_engine.core.engine as engine_module
from jaxrl_engine import cli
from tests.conftest import SMALL

ROOT = Path(__file__).resolve().parents[1]
CARTPOLE = str(ROOT / "configs" / "ppo_cartpole.yaml")
EXECUTABLE = Path(sys.executable).parent / "jaxrl-engine"
SUMMARY_KEYS = {"final_eval_return", "env_steps", "wall_s", "steps_per_second", "compile_s"}


class CompiledTooEarly(RuntimeError):
    """Raised by the patched engine/jit: bad input got past validation."""


@pytest.fixture
def no_compile(monkeypatch):
    """Building an engine or jitting anything fails loudly; the mocks record any call."""
    mocks = {
        "Engine.__init__": mock.Mock(side_effect=CompiledTooEarly("Engine built")),
        "build": mock.Mock(side_effect=CompiledTooEarly("build called")),
        "jax.jit": mock.Mock(side_effect=CompiledTooEarly("jax.jit called")),
    }
    monkeypatch.setattr(engine_module.Engine, "__init__", mocks["Engine.__init__"])
    monkeypatch.setattr(build_module, "build", mocks["build"])
    monkeypatch.setattr(jax, "jit", mocks["jax.jit"])
    return mocks


@pytest.fixture
def no_run(monkeypatch):
    """The engine may be built (validation) but nothing compiled or run: `warm_up` and `run`
    fail loudly; the mocks record any call."""
    mocks = {
        "Engine.warm_up": mock.Mock(side_effect=CompiledTooEarly("warm_up called")),
        "Engine.run": mock.Mock(side_effect=CompiledTooEarly("run called")),
    }
    monkeypatch.setattr(engine_module.Engine, "warm_up", mocks["Engine.warm_up"])
    monkeypatch.setattr(engine_module.Engine, "run", mocks["Engine.run"])
    return mocks


def assert_one_paragraph(err: str) -> None:
    text = err.strip()
    assert text.startswith("jaxrl-engine: "), err
    assert "\n\n" not in text, err
    assert "Traceback" not in text, err


BAD_INPUT = {
    "unknown top-level key": (
        "bogus_key=1",
        ["'bogus_key'", "valid keys", "total_env_steps", "env"],
    ),
    "unknown nested key": ("algo.bogus=1", ["'algo.bogus'", "valid keys", "lr", "num_steps"]),
    "wrong type": ("env.num_envs=four", ["'env.num_envs'", "integer", "'four'"]),
    "wrong choice": (
        "algo.activation=sigmoid",
        ["'algo.activation'", "'tanh'", "'relu'", "'silu'"],
    ),
    "negative size": ("env.num_envs=-4", ["'env.num_envs'", "greater than 0", "-4"]),
    "unknown env id": (
        "env.id=CartPole-v9",
        ["'env.id'", "CartPole-v9", "CartPole-v1", "Pendulum-v1"],
    ),
}


@pytest.mark.parametrize("with_file", [False, True], ids=["no-file", "config-file"])
@pytest.mark.parametrize("override, expected", BAD_INPUT.values(), ids=BAD_INPUT.keys())
def test_bad_input_exits_2_naming_key_and_choices_before_any_compile(
    override, expected, with_file, no_compile, capsys
):
    argv = ["train", *([CARTPOLE] if with_file else []), "seed=1", override]
    assert cli.main(argv) == cli.EXIT_BAD_INPUT
    out, err = capsys.readouterr()
    assert_one_paragraph(err)
    for fragment in expected:
        assert fragment in err
    assert out == ""
    for name, m in no_compile.items():
        assert not m.called, f"{name} was called before the bad input was reported"


@pytest.mark.parametrize(
    "argv, option",
    [
        (["train", "--resume", "runs/a", "--resume", "runs/b"], "--resume"),
        (["eval", "runs/a", "--episodes", "3", "--episodes", "4"], "--episodes"),
        (["plot", "runs/a", "--out", "a.png", "--out", "b.png"], "--out"),
    ],
)
def test_an_option_given_twice_is_refused_not_the_last_one_taken(argv, option, no_compile, capsys):
    assert cli.main(argv) == cli.EXIT_BAD_INPUT
    _, err = capsys.readouterr()
    assert_one_paragraph(err)
    assert f"argument {option}: given twice" in err
    assert not any(m.called for m in no_compile.values())


def test_missing_config_file_exits_2_naming_the_path(tmp_path, no_compile, capsys):
    path = tmp_path / "nowhere" / "ppo.yaml"
    assert cli.main(["train", str(path), "seed=1"]) == cli.EXIT_BAD_INPUT
    _, err = capsys.readouterr()
    assert_one_paragraph(err)
    assert str(path) in err
    assert not any(m.called for m in no_compile.values())


def test_installed_executable_rejects_an_unknown_key_with_exit_2(tmp_path):
    assert EXECUTABLE.is_file(), f"{EXECUTABLE} missing: pip install -e . in the venv"
    proc = subprocess.run(
        [str(EXECUTABLE), "train", CARTPOLE, "algo.lrr=1e-3", f"run_dir={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    assert_one_paragraph(proc.stderr)
    assert "'algo.lrr'" in proc.stderr and "lr" in proc.stderr
    assert proc.stdout == ""
    assert not any(tmp_path.iterdir()), "a rejected run must not create a run directory"


# Runs `jaxrl_engine.cli.main(argv)` in a fresh interpreter, then prints its exit status and
# which of the heavy packages it imported.
MAIN_THEN_MODULES = """
import sys
from jaxrl_engine import cli
status = cli.main(sys.argv[1:])
print(status, sorted(m for m in ("jax", "flax", "optax", "gymnax", "orbax") if m in sys.modules))
"""

CONFIG_ERRORS = {
    "unknown key": ("algo.lrr=1", "unknown config key 'algo.lrr'"),
    "out of range": ("algo.lr=-1", "config key 'algo.lr': Input should be greater than 0"),
    "conflict": ("algo.num_minibatches=3", "algo.num_minibatches=3 must divide"),
    "unknown gymnax id": ("env.id=CartPole-v9", "unknown env id 'CartPole-v9'; valid choices"),
    "async gymnax": ("env.vectorization=async", "'env.vectorization': async steps gymnasium"),
    "unknown algorithm": ("algo.name=foo", "'algo.name': Input tag 'foo' does not match"),
}


@pytest.mark.parametrize("override, message", CONFIG_ERRORS.values(), ids=CONFIG_ERRORS.keys())
def test_config_errors_answer_before_jax_is_imported(override, message, tmp_path):
    """Structural config errors exit 2 without importing jax, flax, optax, gymnax or orbax
    (well under a second; JAX alone takes longer to import)."""
    proc = subprocess.run(
        [sys.executable, "-c", MAIN_THEN_MODULES, "train", override, f"run_dir={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,  # (`python -c` puts the working directory first: this checkout's package)
    )
    assert proc.stdout.strip() == "2 []", (proc.stdout, proc.stderr)
    assert_one_paragraph(proc.stderr)
    assert message in proc.stderr
    assert not any(tmp_path.iterdir())


def test_successful_run_prints_the_summary_as_the_last_stdout_line(tmp_path, capsys):
    # 300 steps with 4 envs x 16 steps = 64 per epoch: rounded up to 5 epochs = 320 steps.
    argv = ["train", *SMALL, "total_env_steps=300", "name=tiny", f"run_dir={tmp_path}"]
    assert cli.main(argv) == 0
    out, _ = capsys.readouterr()
    summary = json.loads(out.strip().splitlines()[-1])
    assert isinstance(summary, dict)
    assert set(summary) >= SUMMARY_KEYS
    assert summary["env_steps"] == math.ceil(300 / (4 * 16)) * 4 * 16 == 320
    assert summary["env_steps"] >= 300
    assert math.isfinite(summary["final_eval_return"])
    assert summary["wall_s"] > 0 and summary["steps_per_second"] > 0 and summary["compile_s"] > 0
    assert json.loads((tmp_path / "tiny" / "summary.json").read_text()) == summary
    # From the CLI's start: its imports, config and build come before `run` (startup_s).
    parts = [summary[k] for k in ("startup_s", "setup_s", "compile_s", "train_s", "end_s")]
    assert min(parts) >= 0 and summary["startup_s"] > 0
    assert summary["wall_s"] == pytest.approx(sum(parts), abs=1e-3)


def test_print_config_prints_the_resolved_config_that_loads_back_the_same(
    tmp_path, no_run, capsys, monkeypatch
):
    from jaxrl_engine.io.config import dump_config, load_config

    monkeypatch.chdir(tmp_path)
    argv = [str(ROOT / "configs" / "sac_pendulum.yaml"), "algo.actor_lr=1e-3", "seed=7"]
    assert cli.main(["train", *argv, "--print-config"]) == 0
    out, _ = capsys.readouterr()
    printed = tmp_path / "printed.yaml"
    printed.write_text(out)
    cfg = load_config(printed)
    assert cfg.algo.actor_lr == 1e-3 and cfg.seed == 7 and cfg.algo.name == "sac"
    assert dump_config(cfg) == dump_config(load_config(argv[0], argv[1:]))
    assert [p.name for p in tmp_path.iterdir()] == ["printed.yaml"]  # nothing else written
    assert not any(m.called for m in no_run.values())


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["algo.lr=-1"], "'algo.lr'"),
        (["--resume", "runs/x"], "a run's own is runs/x/config.yaml"),
        (
            [str(ROOT / "configs" / "ppo_torch_policy.yaml"), "algo.torch_policy.factory=os:nope"],
            "algo.torch_policy.factory 'os:nope': module os has no 'nope'",
        ),
    ],
    ids=["bad override", "with --resume", "a factory that does not exist"],
)
def test_print_config_refuses_what_a_run_would(argv, fragment, tmp_path, no_run, capsys):
    assert cli.main(["train", "--print-config", *argv]) == cli.EXIT_BAD_INPUT
    out, err = capsys.readouterr()
    assert out == "" and fragment in err


def test_the_engines_own_warnings_read_as_its_messages_on_the_command_line(monkeypatch, capsys):
    """`jaxrl-engine: warning: ...` for a warning raised in the package (e.g. a policy that
    cannot be exported); another package's warnings keep Python's form."""
    import warnings

    import jaxrl_engine.run.host_hooks as where

    others = []
    monkeypatch.setattr(warnings, "showwarning", lambda *a, **k: others.append(a))
    cli._plain_warnings()
    warnings.showwarning(UserWarning("policy not exported: x"), UserWarning, where.__file__, 9)
    warnings.showwarning(UserWarning("elsewhere"), UserWarning, "/site-packages/gym/core.py", 3)
    assert capsys.readouterr().err == "jaxrl-engine: warning: policy not exported: x\n"
    assert [str(a[0]) for a in others] == ["elsewhere"]


def test_the_resume_hint_of_a_sweep_looks_in_its_groups_checkpoints(tmp_path):
    sweep = tmp_path / "sw"
    (sweep / "checkpoints" / "group0").mkdir(parents=True)
    (sweep / "sweep.json").write_text("{}")
    assert cli._resume_hint(sweep) == "no checkpoint was written, so there is nothing to resume"
    (sweep / "checkpoints" / "group0" / "epoch_4").mkdir()
    assert cli._resume_hint(sweep) == f"continue with: jaxrl-engine sweep --resume {sweep}"


def test_the_resume_hint_of_a_run_with_a_users_factory_names_it(tmp_path):
    """`train --resume` of such a run must name the factory (a run directory's word imports
    no code): the hint printed on SIGINT is the command that works."""
    run = tmp_path / "r"
    (run / "checkpoints" / "epoch_2").mkdir(parents=True)
    (run / "config.yaml").write_text("algo:\n  torch_policy:\n    factory: mynets:make\n")
    assert cli._resume_hint(run) == (
        f"continue with: jaxrl-engine train --resume {run} algo.torch_policy.factory=mynets:make"
    )
    (run / "config.yaml").write_text("algo:\n  name: ppo\n")
    assert cli._resume_hint(run) == f"continue with: jaxrl-engine train --resume {run}"
