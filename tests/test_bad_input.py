"""Bad input everywhere a user can give it, through `jaxrl-engine train`: one clear paragraph
on stderr, exit status 2, nothing on stdout, and nothing trained or compiled. One test per case,
then property tests: random overrides (fresh and --resume) load or fail cleanly, never crash."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from unittest import mock

import jax
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jaxrl_engine as jre
import jaxrl_engine.compose as build_module
import jaxrl_engine.core.engine as engine_module
from jaxrl_engine import cli
from jaxrl_engine.export.policy import ExportError
from tests.conftest import SMALL


class Reached(Exception):
    """Raised by the patched expensive step: the input got past every check."""


def assert_clean_refusal(
    status: int, out: str, err: str, *fragments: str, one_line: bool = True
) -> None:
    assert status == cli.EXIT_BAD_INPUT, err
    text = err.strip()
    assert text.startswith("jaxrl-engine: ") and text.count("jaxrl-engine: ") == 1, err
    assert "Traceback" not in text and ("\n" not in text or not one_line), err
    assert out == ""
    for fragment in fragments:
        assert fragment in text, (fragment, text)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A small finished PPO run (4 epochs, checkpoints after 2 and 4)."""
    root = tmp_path_factory.mktemp("runs")
    cfg = jre.load_config(None, [*SMALL, f"run_dir={root}", "name=done", "save_interval=2"])
    engine = jre.build(cfg)
    engine.run(engine.init(jax.random.key(0)))
    return root / "done"


@pytest.fixture
def run_copy(finished_run, tmp_path) -> Path:
    copy = tmp_path / "done"
    shutil.copytree(finished_run, copy)
    return copy


@pytest.fixture
def nothing_built(monkeypatch):
    """Building an engine raises `Reached`: a fresh run's bad input must be caught before."""
    monkeypatch.setattr(build_module, "build", mock.Mock(side_effect=Reached("build")))


@pytest.fixture
def nothing_run(monkeypatch):
    """Compiling or running the engine raises `Reached`: resume may build it (shapes are
    checked against the engine's state), but a refusal must come before any compile."""
    monkeypatch.setattr(engine_module.Engine, "run", mock.Mock(side_effect=Reached("run")))
    monkeypatch.setattr(engine_module.Engine, "warm_up", mock.Mock(side_effect=Reached("warm_up")))


def train(capsys, *argv: str) -> tuple[int, str, str]:
    status = cli.main(["train", *argv])
    out, err = capsys.readouterr()
    return status, out, err


# ------------------------------------------------------------------------- config of a fresh run
CONFIG_CASES = {
    "wrong type": ("env.num_envs=four", ["'env.num_envs'", "integer", "'four'"]),
    "out of range": ("algo.gamma=1.5", ["'algo.gamma'", "less than or equal to 1", "1.5"]),
    "negative save_interval": ("save_interval=-1", ["'save_interval'", "greater than or equal"]),
    "keep no checkpoint": ("keep_checkpoints=0", ["'keep_checkpoints'", "greater than 0"]),
    "unknown key": ("checkpoint_every=5", ["'checkpoint_every'", "valid keys", "save_interval"]),
    "conflicting options": ("algo.num_minibatches=3", ["num_minibatches=3", "must divide", "64"]),
    "unknown env id": ("env.id=CartPole-v9", ["'env.id'", "CartPole-v9", "CartPole-v1"]),
    "unknown env param": ("env.params={gravity_x: 1}", ["env.params", "gravity_x", "gravity"]),
    "not key=value": ("seed", ["'seed'", "key=value"]),
    # argparse's refusals come back from main as exit 2 (no SystemExit), naming --help
    "a dash argument": ("-:", ["unrecognized arguments: -:", "--help"]),
    "an unknown option": ("--lr=3", ["unrecognized arguments: --lr=3", "--help"]),
    # env.id left at its default (CartPole-v1) is what is wrong for another suite
    "a suite the default env is not of": (
        "env.suite=brax",
        ["'env.id'", "'CartPole-v1' is not a Brax env", "halfcheetah", "(its default)"],
    ),
}


@pytest.mark.parametrize("override, expected", CONFIG_CASES.values(), ids=CONFIG_CASES.keys())
def test_bad_config_is_refused_before_anything_is_built(
    override, expected, nothing_built, capsys, tmp_path
):
    status, out, err = train(capsys, *SMALL, f"run_dir={tmp_path}", "seed=1", override)
    assert_clean_refusal(status, out, err, *expected)
    assert not any(tmp_path.iterdir())


def test_a_config_file_that_is_not_yaml_is_refused(nothing_built, capsys, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("algo: {lr: [1e-3\n")
    # YAML's own pointer to the line and column is kept (a few lines, no traceback).
    status, out, err = train(capsys, str(path))
    assert_clean_refusal(status, out, err, str(path), "not valid YAML", "line 1", one_line=False)


@pytest.mark.skipif(
    not Path("/proc/self").is_dir(), reason="needs Linux's /proc, where no folder can be made"
)
def test_a_run_directory_that_cannot_be_created_is_bad_input(monkeypatch, capsys):
    # (a path the config check lets through: its parent is a directory; root may write
    # anywhere else). Refused before anything is compiled:
    monkeypatch.setattr(engine_module.Engine, "warm_up", mock.Mock(side_effect=Reached("warm_up")))
    status, out, err = train(capsys, *SMALL, "run_dir=/proc/jaxrl_engine_runs")
    assert_clean_refusal(status, out, err, "cannot create run directory", "/proc/jaxrl_engine")


# --------------------------------------------------------------------------------- resume input
def test_resume_of_a_directory_that_does_not_exist(nothing_run, capsys, tmp_path):
    missing = tmp_path / "runs" / "nope"
    assert_clean_refusal(*train(capsys, "--resume", str(missing)), str(missing), "does not exist")


def test_resume_with_the_other_verb_names_the_right_one(nothing_run, capsys, tmp_path):
    """`train --resume` of a sweep's directory and `sweep --resume` of a train run's say which
    verb continues it (before JAX is imported)."""
    (tmp_path / "a_sweep").mkdir()
    (tmp_path / "a_sweep" / "sweep.json").write_text("{}")
    status, out, err = train(capsys, "--resume", str(tmp_path / "a_sweep"))
    assert_clean_refusal(status, out, err, "sweep's directory", "jaxrl-engine sweep --resume")
    (tmp_path / "a_run").mkdir()
    (tmp_path / "a_run" / "metrics.jsonl").write_text("")
    assert cli.main(["sweep", "--resume", str(tmp_path / "a_run")]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "train run's directory" in err and "jaxrl-engine train --resume" in err, err
    assert cli.main(["sweep", "--resume", str(tmp_path / "none")]) == cli.EXIT_BAD_INPUT
    assert "sweep directory" in capsys.readouterr().err


def test_resume_of_a_directory_without_checkpoints(nothing_run, capsys, tmp_path):
    (tmp_path / "empty").mkdir()
    assert_clean_refusal(*train(capsys, "--resume", str(tmp_path / "empty")), "has no checkpoints/")


def test_resume_of_a_checkpoint_instead_of_its_run_directory(run_copy, nothing_run, capsys):
    status, out, err = train(capsys, "--resume", str(run_copy / "checkpoints" / "epoch_4"))
    assert_clean_refusal(status, out, err, "that is a checkpoint", str(run_copy))


def test_resume_with_a_config_file_is_refused(run_copy, nothing_run, capsys, tmp_path):
    status, out, err = train(capsys, "configs/ppo_cartpole.yaml", "--resume", str(run_copy))
    assert_clean_refusal(status, out, err, "--resume continues with the run's own config")


def test_resume_cannot_move_the_run(run_copy, nothing_run, capsys):
    status, out, err = train(capsys, "--resume", str(run_copy), "name=elsewhere")
    assert_clean_refusal(status, out, err, "'name=elsewhere'", "stays in its run directory")


def test_resume_cannot_change_the_seed(run_copy, nothing_run, capsys):
    """The checkpoint's random state continues: a new seed would change nothing but the
    config.yaml, which would then misdescribe the run."""
    status, out, err = train(capsys, "--resume", str(run_copy), "seed=5")
    assert_clean_refusal(status, out, err, "'seed=5'", "its seed cannot change")


def test_resume_of_a_sweep_member_names_the_sweep(nothing_run, capsys, tmp_path):
    member = tmp_path / "sw" / "seed0"
    member.mkdir(parents=True)
    (tmp_path / "sw" / "sweep.json").write_text("{}")
    (member / "metrics.jsonl").write_text("")
    status, out, err = train(capsys, "--resume", str(member))
    assert_clean_refusal(status, out, err, "member of the sweep", "sweep --resume")
    with pytest.raises(ExportError, match=r"a sweep member.*resume_sweep"):
        jre.make_policy(member, checkpoint=True)


def test_resume_with_a_config_that_changes_shapes(run_copy, nothing_run, capsys):
    status, out, err = train(capsys, "--resume", str(run_copy), "algo.hidden_sizes=[32,32]")
    assert_clean_refusal(
        status,
        out,
        err,
        "another state layout",
        "float32[4, 16] in the checkpoint and float32[4, 32]",
        "algo.hidden_sizes: [16, 16] -> [32, 32]",
    )


def test_resume_with_an_env_whose_observations_differ_from_the_network(
    run_copy, nothing_run, capsys
):
    status, out, err = train(capsys, "--resume", str(run_copy), "env.id=Acrobot-v1")
    assert_clean_refusal(
        status, out, err, ".env.obs is float32[4, 4] in the checkpoint and float32[4, 6]"
    )


def test_resume_with_a_bad_override(run_copy, nothing_run, capsys):
    status, out, err = train(capsys, "--resume", str(run_copy), "algo.lr=-1")
    assert_clean_refusal(status, out, err, "'algo.lr'", "greater than 0")


def test_an_edited_config_yaml_is_named_as_the_mistakes_place(run_copy, capsys):
    """`eval` and `make_policy` read the run's config.yaml: a value there that fails validation
    is its mistake, not the command line's, and the message says which file. (`export` reads
    the exported policy or the checkpoint's own config, not config.yaml.)"""
    config = run_copy / "config.yaml"
    config.write_text(config.read_text().replace("num_envs: 4", "num_envs: -1", 1))
    status = cli.main(["eval", str(run_copy)])
    out, err = capsys.readouterr()
    assert_clean_refusal(status, out, err, str(config), "'env.num_envs'", "refuses")
    with pytest.raises(jre.ConfigError, match=re.escape(str(config)) + ".*'env.num_envs'"):
        jre.make_policy(run_copy, deterministic=False)


def test_resume_of_a_corrupted_checkpoint_points_to_the_previous_one(run_copy, nothing_run, capsys):
    for meta in (run_copy / "checkpoints" / "epoch_4" / "meta").iterdir():
        meta.write_bytes(meta.read_bytes()[:50])
    status, out, err = train(capsys, "--resume", str(run_copy))
    assert_clean_refusal(
        status, out, err, "epoch_4", "corrupted", "resume from the previous checkpoint (epoch 2)"
    )


def test_resume_of_a_checkpoint_with_truncated_array_data(run_copy, nothing_run, capsys):
    for data in (run_copy / "checkpoints" / "epoch_4" / "state" / "d").iterdir():
        data.write_bytes(data.read_bytes()[:10])
    status, out, err = train(capsys, "--resume", str(run_copy))
    assert_clean_refusal(status, out, err, "epoch_4", "its arrays cannot be read")


def test_a_fresh_run_over_an_unfinished_run_is_refused_naming_resume(run_copy, capsys):
    # Make it unfinished: drop the last checkpoint, as if killed after epoch 3.
    shutil.rmtree(run_copy / "checkpoints" / "epoch_4")
    config = (run_copy / "config.yaml").read_text()
    argv = [*SMALL, f"run_dir={run_copy.parent}", "name=done", "save_interval=2", "seed=5"]
    with mock.patch.object(engine_module.Engine, "warm_up", side_effect=Reached("warm_up")):
        status, out, err = train(capsys, *argv)
    assert_clean_refusal(
        status, out, err, "unfinished run", f"jaxrl-engine train --resume {run_copy}"
    )
    assert (run_copy / "checkpoints" / "epoch_2").is_dir()
    assert (run_copy / "config.yaml").read_text() == config  # the refused run wrote nothing


# ------------------------------------------------------------------------------- property tests
VALUES = ["1", "0", "-3", "2.5", "1e-3", ".nan", "true", "abc", "[1,2]", "[]", "{a: 1}", "null"]
KEYS = [
    "seed",
    "total_env_steps",
    "save_interval",
    "keep_checkpoints",
    "env.num_envs",
    "env.id",
    "eval.interval",
    "algo.lr",
    "algo.num_steps",
    "algo.hidden_sizes",
    "algo.num_minibatches",
    "algo.activation",
    "algo.bogus",
    "bogus",
]
override = st.one_of(
    st.tuples(st.sampled_from(KEYS), st.sampled_from(VALUES)).map("=".join),
    st.text(alphabet="ab.=1[ ]", max_size=8),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(overrides=st.lists(override, max_size=3))
def test_random_overrides_through_the_cli_train_or_fail_cleanly(overrides, capsys):
    try:
        jre.load_config(None, [*SMALL, *overrides])
        valid = True
    except jre.ConfigError:
        valid = False
    with mock.patch.object(build_module, "build", side_effect=Reached("build")):
        try:
            status = cli.main(["train", *SMALL, *overrides])
        except Reached:
            assert valid
            return
    assert not valid
    assert_clean_refusal(status, *capsys.readouterr())


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(overrides=st.lists(override, max_size=2))
def test_random_overrides_on_resume_continue_or_fail_cleanly(overrides, finished_run, capsys):
    capsys.readouterr()  # drop what earlier examples printed
    before = (finished_run / "metrics.jsonl").read_text()
    with mock.patch.object(engine_module.Engine, "run", side_effect=Reached("run")):
        try:
            status = cli.main(["train", "--resume", str(finished_run), *overrides])
        except Reached:
            return  # a valid config with the checkpoint's shapes: training would start here
    out, err = capsys.readouterr()
    assert_clean_refusal(status, out, err)
    assert (finished_run / "metrics.jsonl").read_text() == before  # a refusal changes nothing
    assert (finished_run / "checkpoints" / "epoch_4").is_dir()


# ------------------------------------------- fuzzing the whole `train` command, training for real
FUZZ_KEYS = [
    *KEYS,
    "name",
    "run_dir",
    "offload",
    "nan_guard",
    "eval.num_envs",
    "eval.env_params",
    "env.params",
    "algo.name",
    "algo.gamma",
    "algo.update_epochs",
    "algo.torch_policy",
]
FUZZ_VALUES = [
    *VALUES,
    "2147483648",
    "-2147483649",
    "99999999999999999999",
    "1e39",
    "-1e-300",
    "../x",
    "a/b",
    "''",
    "'\\x00'",
    "{max_steps_in_episode: -1}",
    "{gravity: 1e40}",
    "dqn",
    "sac",
    "td3",
    "[64, -1]",
    "!!binary aGk=",
    "&a [*a]",
    "*undefined",
]
fuzz_override = st.one_of(
    st.tuples(st.sampled_from(FUZZ_KEYS), st.sampled_from(FUZZ_VALUES)).map("=".join),
    st.tuples(st.sampled_from(FUZZ_KEYS), st.text(max_size=6)).map("=".join),
    st.text(max_size=10),
)
scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
)
yaml_value = st.recursive(
    scalar,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
config_doc = st.dictionaries(
    st.sampled_from(
        ["seed", "total_env_steps", "env", "eval", "algo", "name", "bogus", "save_interval"]
    ),
    st.one_of(
        yaml_value,
        st.fixed_dictionaries(
            {},
            optional={
                "id": st.sampled_from(["CartPole-v1", "Pendulum-v1", "nope"]),
                "num_envs": st.integers(-2, 2**40),
                "name": st.sampled_from(["ppo", "dqn", "sac", "td3", "x"]),
                "lr": st.floats(allow_nan=True, allow_infinity=True),
                "params": yaml_value,
            },
        ),
    ),
    max_size=4,
)
raw_yaml = st.text(alphabet="ab01:-[]{}&*!|>#,.'\" \n\t", max_size=40)
# Applied last: whatever was asked, a valid config trains briefly and out of sight.
FORCED = [*SMALL, "loggers=[jsonl]", "compile_cache_dir=null"]


def _files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if not p.is_dir()}


def _train_in(directory: Path, argv: list[str], capsys) -> None:
    """`jaxrl-engine train ...` in process from `directory`: exit 0 or 2, never a traceback,
    and every file written lies inside the run directory of the config it resolved."""
    capsys.readouterr()
    before = _files_under(directory)
    cwd = os.getcwd()
    os.chdir(directory)
    try:
        status = cli.main(["train", *argv])
    finally:
        os.chdir(cwd)
    out, err = capsys.readouterr()
    assert status in (0, cli.EXIT_BAD_INPUT), (argv, err)
    assert "Traceback" not in err and len(err) < 4000, (argv, err)
    written = _files_under(directory) - before
    if status == cli.EXIT_BAD_INPUT:
        assert out == "" and err.startswith("jaxrl-engine: "), (argv, err)
        assert not written, (argv, written)
    else:
        summary = json.loads(out.strip().splitlines()[-1])
        run = (directory / summary["run_dir"]).resolve()
        assert run.is_relative_to(directory.resolve()), (argv, run)
        assert all(p.resolve().is_relative_to(run) for p in written), (argv, written)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(overrides=st.lists(fuzz_override, max_size=3))
def test_fuzzed_overrides_train_or_exit_2_and_write_only_their_run_directory(
    overrides, capsys, tmp_path_factory
):
    directory = tmp_path_factory.mktemp("fuzz")
    _train_in(directory, [*overrides, *FORCED], capsys)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(document=st.one_of(config_doc.map(lambda d: yaml.safe_dump(d)), raw_yaml))
def test_fuzzed_yaml_documents_train_or_exit_2_and_write_only_their_run_directory(
    document, capsys, tmp_path_factory
):
    directory = tmp_path_factory.mktemp("fuzz")
    (directory / "config.yaml").write_text(document)
    _train_in(directory, ["config.yaml", *FORCED], capsys)


# ------------------------------------------------------------------ sizes that cannot fit memory
def test_a_network_too_large_for_memory_is_refused_before_anything_is_compiled(
    nothing_run, capsys, tmp_path
):
    # 3 x 100,000 wide: ~80 GB of weights per network before Adam's moments. Without the check,
    # XLA's CPU client tried to allocate init's outputs and the process stalled (not even
    # SIGINT got through).
    from jaxrl_engine.core.memory import GiB, host_available_bytes

    if (host_available_bytes() or 0) > 4096 * GiB:
        pytest.skip("this host has more memory than the state needs (4 TiB)")
    status, out, err = train(
        capsys, *SMALL, f"run_dir={tmp_path}", "algo.hidden_sizes=[100000,100000,100000]"
    )
    assert_clean_refusal(
        status,
        out,
        err,
        "the engine state needs",
        "this host's available memory",
        "['Dense_1']['kernel'] [100000, 100000] float32: 37.25 GiB",
        "algo.hidden_sizes",
    )
    # The run directory holds no checkpoint: nothing to resume, nothing trained.
    assert not list(tmp_path.rglob("epoch_*"))


def test_a_replay_buffer_too_large_for_memory_is_refused(nothing_run, capsys, tmp_path):
    from jaxrl_engine.core.memory import GiB, host_available_bytes

    if (host_available_bytes() or 0) > 4096 * GiB:
        pytest.skip("this host has more memory than the state needs (4 TiB)")
    status, out, err = train(
        capsys,
        str(Path(__file__).resolve().parents[1] / "configs" / "dqn_cartpole.yaml"),
        f"run_dir={tmp_path}",
        "algo.buffer_size=2000000000",
        "progress=false",
    )
    assert_clean_refusal(status, out, err, "buffer", "algo.buffer_size", "GiB")


def test_a_sweep_axis_in_a_single_run_is_refused(nothing_run, capsys, tmp_path):
    """`mesh.sweep` shards a sweep's members; a train would ignore it without a word."""
    status, out, err = train(capsys, *SMALL, f"run_dir={tmp_path}", "mesh.sweep=2")
    assert_clean_refusal(status, out, err, "'mesh.sweep'", "mesh.sweep=null")


def test_a_sweep_is_checked_for_all_its_members_at_once(monkeypatch, tmp_path):
    # Each member's state fits; the members of one compiled group together do not.
    import jaxrl_engine.core.memory as memory

    cfg = jre.load_config(None, [*SMALL, f"run_dir={tmp_path}", "name=sw"])
    engine = jre.build(cfg)
    one = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(engine.state_shape))
    monkeypatch.setattr(memory, "host_available_bytes", lambda: int(2.5 * one))
    jre.build(cfg)  # one member: fits
    with pytest.raises(memory.StateTooLargeError, match=r"sweep's state \(4 members\)"):
        jre.sweep(cfg, seeds=[0, 1, 2, 3])
    assert not list(tmp_path.rglob("epoch_*"))
