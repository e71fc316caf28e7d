"""Config values that used to pass validation and fail later (a traceback, an MLIR dump, a huge
message): each is refused by `jaxrl-engine train` with exit status 2 and one short message
naming the key, before anything is built."""

from __future__ import annotations

import os
import time
from pathlib import Path
from unittest import mock

import pytest

import jaxrl_engine as jre
import jaxrl_engine.compose as build_module
import jaxrl_engine.io.config as config_module
from jaxrl_engine import cli


class Reached(Exception):
    """Raised by the patched `build`: the input got past every check."""


@pytest.fixture(autouse=True)
def nothing_built(monkeypatch):
    monkeypatch.setattr(build_module, "build", mock.Mock(side_effect=Reached("build")))


def refusal(capsys, *argv: str) -> str:
    """stderr of `jaxrl-engine train argv`, checked to be one clean refusal (exit 2)."""
    status = cli.main(["train", *argv])
    out, err = capsys.readouterr()
    assert status == cli.EXIT_BAD_INPUT, err
    assert out == "" and "Traceback" not in err, err
    assert err.startswith("jaxrl-engine: ") and err.count("jaxrl-engine: ") == 1, err
    return err.strip()


def refused(capsys, tmp_path, overrides: list[str], *fragments: str) -> str:
    err = refusal(capsys, f"run_dir={tmp_path / 'runs'}", "progress=false", *overrides)
    assert "\n" not in err, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    assert not (tmp_path / "runs").exists()
    return err


# ------------------------------------------------------------------------ numbers and counts
RANGE_CASES = {
    "seed beyond uint32": (["seed=1099511627776"], ["'seed'", "uint32", "4294967295"]),
    "num_envs beyond int32": (["env.num_envs=1099511627776"], ["'env.num_envs'", "int32"]),
    "total_env_steps beyond int32": (
        ["total_env_steps=1000000000000000"],
        ["'total_env_steps'", "int32"],
    ),
    "a list element beyond int32": (
        ["algo.hidden_sizes=[16, 3000000000]"],
        ["'algo.hidden_sizes'", "3000000000", "int32"],
    ),
    "an env param beyond int32": (
        ["eval.env_params={max_steps_in_episode: 3000000000}"],
        ["'eval.env_params'", "3000000000", "int32"],
    ),
    "lr beyond float32": (["algo.lr=1e39"], ["'algo.lr'", "1e+39", "float32"]),
    "lr that becomes 0 in float32": (["algo.lr=1e-50"], ["'algo.lr'", "1e-50", "becomes 0"]),
    "a float env param beyond float32": (
        ["env.params={gravity: -1e39}"],
        ["'env.params'", "float32"],
    ),
    "env steps rounded up to whole epochs beyond int32": (
        ["total_env_steps=2147483647"],
        ["total_env_steps=2147483647", "rounded up", "2147483648", "int32"],
    ),
    "ppo gradient steps beyond int32": (
        ["algo.update_epochs=100000", "total_env_steps=100000000"],
        ["gradient steps", "algo.update_epochs", "algo.num_minibatches", "int32"],
    ),
    "dqn gradient steps beyond int32": (
        ["algo.name=dqn", "algo.train_ratio=1000", "total_env_steps=100000000"],
        ["gradient steps", "algo.train_ratio", "int32"],
    ),
    "a rollout buffer far beyond memory": (
        [
            "env.id=Breakout-MinAtar",
            "env.num_envs=1000000",
            "algo.num_steps=1000",
            "total_env_steps=1000000000",
        ],
        ["rollout buffer", "GiB", "env.num_envs"],
    ),
}


@pytest.mark.parametrize("overrides, expected", RANGE_CASES.values(), ids=RANGE_CASES.keys())
def test_numbers_beyond_their_device_dtype_are_refused(overrides, expected, capsys, tmp_path):
    refused(capsys, tmp_path, overrides, *expected)


def test_the_largest_values_that_fit_are_accepted():
    cfg = jre.load_config(None, ["seed=4294967295", "algo.lr=3e38", "total_env_steps=2147481600"])
    assert cfg.seed == 2**32 - 1


# -------------------------------------------------------------------------------- env params
ENV_PARAM_CASES = {
    "negative episode length": (
        "env.params={max_steps_in_episode: -1}",
        ["env.params.max_steps_in_episode=-1", "positive", "500"],
    ),
    "zero episode length": (
        "eval.env_params={max_steps_in_episode: 0}",
        ["eval.env_params.max_steps_in_episode=0", "positive"],
    ),
    "float for an int param": (
        "env.params={max_steps_in_episode: 5.5}",
        ["max_steps_in_episode=5.5", "must be an integer"],
    ),
    "bool for a float param": ("env.params={gravity: true}", ["gravity=True", "a number"]),
}


@pytest.mark.parametrize("override, expected", ENV_PARAM_CASES.values(), ids=ENV_PARAM_CASES.keys())
def test_env_params_keep_the_type_and_sign_of_their_default(override, expected, capsys, tmp_path):
    refused(capsys, tmp_path, [override], *expected)


# ----------------------------------------------------------------- algorithm vs action space
ACTION_SPACE_CASES = {
    "sac on CartPole": (
        ["algo.name=sac"],
        "algo.name=sac needs a continuous action space; env.id=CartPole-v1 has 2 discrete "
        "actions (use ppo or dqn; for your own env given to jre.build(cfg, env=...), set env.id "
        "to a gymnax id with continuous actions, e.g. Pendulum-v1",
    ),
    "td3 on Acrobot": (["algo.name=td3", "env.id=Acrobot-v1"], "has 3 discrete actions"),
    "dqn on Pendulum": (
        ["algo.name=dqn", "env.id=Pendulum-v1"],
        "algo.name=dqn needs a discrete action space; env.id=Pendulum-v1 has a continuous "
        "action space of shape (1,) (use ppo, sac or td3;",
    ),
}


@pytest.mark.parametrize(
    "overrides, expected", ACTION_SPACE_CASES.values(), ids=ACTION_SPACE_CASES.keys()
)
def test_an_algorithm_must_fit_the_env_action_space(overrides, expected, capsys, tmp_path):
    refused(capsys, tmp_path, overrides, expected)


# ------------------------------------------------------------------------------ name and paths
@pytest.mark.parametrize(
    "name", ["../../x", "a/b", "..", ".", "''", "-rf", '"a\\0b"', '"a\\tb"', "a\\\\b", "x" * 256]
)
def test_name_must_be_one_folder_name(name, capsys, tmp_path):
    refused(capsys, tmp_path, [f"name={name}"], "'name'", "one folder name inside run_dir")


@pytest.mark.parametrize("key", ["run_dir", "compile_cache_dir"])
def test_a_directory_key_naming_a_file_is_refused(key, capsys, tmp_path):
    file = tmp_path / "file"
    file.write_text("")
    refused(capsys, tmp_path, [f"{key}={file}"], f"'{key}'", "is a file, not a directory")
    refused(capsys, tmp_path, [f"{key}={file}/sub"], f"'{key}'", f"inside {str(file)!r}")
    refused(capsys, tmp_path, [f'{key}="a\\0b"'], f"'{key}'", "NUL")
    refused(capsys, tmp_path, [f"{key}=''"], f"'{key}'", "must name a folder")
    assert file.read_text() == ""


# -------------------------------------------------------------------------------- config files
def test_a_config_file_that_is_not_utf8(capsys, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_bytes(b"seed: 1\nname: \xff\xfe\n")
    err = refusal(capsys, str(path))
    assert str(path) in err and "not UTF-8" in err and "offset 14" in err, err


def test_a_config_path_that_is_a_directory(capsys, tmp_path):
    err = refusal(capsys, str(tmp_path))
    assert str(tmp_path) in err and "is a directory" in err, err


def test_an_unreadable_config_file(monkeypatch, capsys, tmp_path):
    path = tmp_path / "secret.yaml"
    path.write_text("seed: 1\n")
    path.chmod(0)
    if os.access(path, os.R_OK):  # root reads anything: make open() refuse instead
        monkeypatch.setattr(
            config_module,
            "open",
            mock.Mock(side_effect=PermissionError(13, "Permission denied")),
            raising=False,
        )
    err = refusal(capsys, str(path))
    assert str(path) in err and "cannot be read" in err and "Permission denied" in err, err


def test_a_config_file_larger_than_1_mib(capsys, tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("seed: 1\n" + "# padding\n" * 120_000)
    err = refusal(capsys, str(path))
    assert "larger than 1 MiB" in err, err


# Nine levels of nine aliases: 9**9 strings when expanded.
BILLION_LAUGHS = ["a: &a [lol,lol,lol,lol,lol,lol,lol,lol,lol]"] + [
    f"{b}: &{b} [{', '.join(['*' + a] * 9)}]" for a, b in zip("abcdefgh", "bcdefghi", strict=True)
]


def test_a_billion_laughs_config_file_is_refused_quickly(capsys, tmp_path):
    path = tmp_path / "laughs.yaml"
    path.write_text("eval:\n  env_params:\n" + "".join(f"    {line}\n" for line in BILLION_LAUGHS))
    start = time.perf_counter()
    err = refusal(capsys, str(path))
    assert time.perf_counter() - start < 2
    assert len(err) < 3000 and "anchors and aliases" in err, err


def test_a_billion_laughs_override_value_is_refused_quickly(capsys, tmp_path):
    value = "{" + ", ".join(BILLION_LAUGHS) + "}"
    start = time.perf_counter()
    err = refused(capsys, tmp_path, [f"env.params={value}"], "'env.params'", "aliases")
    assert time.perf_counter() - start < 2 and len(err) < 3000


def test_a_recursive_alias_is_refused(capsys, tmp_path):
    path = tmp_path / "loop.yaml"
    path.write_text("env: &e {params: *e}\n")
    err = refusal(capsys, str(path))
    assert "refers to the node that holds it" in err, err


# ---------------------------------------------------------------------------- message lengths
def test_a_huge_value_is_quoted_short(capsys, tmp_path):
    err = refused(capsys, tmp_path, ["env.num_envs=" + "x" * 100_000], "'env.num_envs'")
    assert len(err) < 500, err


def test_a_message_of_many_errors_is_cut(capsys, tmp_path):
    overrides = [f"{'k' * 150}{i}=1" for i in range(30)]
    err = refused(capsys, tmp_path, overrides, "unknown config key", "more characters)")
    assert len(err) < 2100, len(err)


# ----------------------------------------------------------- booleans, sizes, paths, keys
BOOLEAN_CASES = {
    "a top-level int": (["seed=true"], ["config key 'seed'", "boolean true"]),
    "a nested int": (["env.num_envs=true"], ["config key 'env.num_envs'", "boolean true"]),
    "an algorithm float": (["algo.lr=false"], ["config key 'algo.lr'", "boolean false"]),
}


@pytest.mark.parametrize("overrides, expected", BOOLEAN_CASES.values(), ids=BOOLEAN_CASES.keys())
def test_a_boolean_is_not_taken_for_a_number(overrides, expected, capsys, tmp_path):
    """pydantic's lax mode would read `seed=true` as seed 1 and `env.num_envs=true` as 1 env."""
    refused(capsys, tmp_path, overrides, *expected)


def test_yes_no_on_off_are_words_for_a_name_and_booleans_for_a_flag():
    """YAML 1.1 reads `off` as false: `name=off` is the name "off", `eval.deterministic=off`
    still false."""
    cfg = jre.load_config(None, ["name=off", "eval.deterministic=off", "progress=yes"])
    assert cfg.name == "off" and cfg.eval.deterministic is False and cfg.progress is True


def test_a_text_key_keeps_what_was_written_where_yaml_reads_a_number_or_null():
    """`name=2024` is the run named "2024" (YAML reads an int); a key that may be null still
    takes `null`, and a number key still takes a number."""
    cfg = jre.load_config(
        None, ["name=2024", "run_dir=1e3", "algo.torch_policy.factory=nan", "seed=7"]
    )
    assert (cfg.name, cfg.run_dir, cfg.seed) == ("2024", "1e3", 7)
    assert cfg.algo.torch_policy.factory == "nan"
    assert jre.load_config(None, ["name=null"]).name == "null"  # (a name cannot be null)
    for quoted in ('name="2024"', "name='2024'", "name=2024  # the year"):
        assert jre.load_config(None, [quoted]).name == "2024", quoted
    cfg = jre.load_config(None, ["eval.env_id=null", "compile_cache_dir=null"])
    assert cfg.eval.env_id is None and cfg.compile_cache_dir is None
    with pytest.raises(jre.ConfigError, match=r"'env\.id': unknown env id '2048'"):
        jre.load_config(None, ["env.id=2048"])  # the id as written, not "a valid string"


OFF_POLICY = ["algo.name=dqn", "algo.buffer_size=1024", "total_env_steps=20480"]
OFF_POLICY_CASES = {
    "a batch larger than the buffer": (
        ["algo.batch_size=4096"],
        ["algo.batch_size=4096", "algo.buffer_size=1024"],
    ),
    "learning never starts": (
        ["algo.learning_starts=100000"],
        ["algo.learning_starts=100000", "never train"],
    ),
}


@pytest.mark.parametrize(
    "overrides, expected", OFF_POLICY_CASES.values(), ids=OFF_POLICY_CASES.keys()
)
def test_off_policy_sizes_that_cannot_train(overrides, expected, capsys, tmp_path):
    refused(capsys, tmp_path, [*OFF_POLICY, *overrides], *expected)


def test_a_config_path_with_an_equals_sign_is_a_config(capsys, tmp_path):
    """A sweep member's directory has `=` in its name (`seed1_algo.lr=0.001`): its
    config.yaml, given first, is read as the config file, not as an override."""
    member = tmp_path / "sweep" / "seed1_algo.lr=0.001"
    member.mkdir(parents=True)
    (member / "config.yaml").write_text("seed: 7\nalgo:\n  name: ppo\n  lr: 0.001\n")
    with pytest.raises(Reached):
        cli.main(["train", str(member / "config.yaml"), f"run_dir={tmp_path / 'runs'}"])
    cfg = build_module.build.call_args.args[0]
    assert cfg.seed == 7 and cfg.algo.lr == 0.001


def test_overrides_after_an_option_are_overrides(capsys, tmp_path):
    """`sweep ... --split-static name=x` (the README's own command) and `train ... --resume DIR
    key=value`: the items after the option are overrides like those before it."""
    status = cli.main(
        ["train", "total_env_steps=2048", "--resume", str(tmp_path / "none"), "algo.lrr=1"]
    )
    err = capsys.readouterr().err
    assert status == cli.EXIT_BAD_INPUT and "unrecognized arguments" not in err, err
    status = cli.main(["sweep", "seeds=0..1", "--split-static", "algo.lrr=[1,2]"])
    err = capsys.readouterr().err
    assert status == cli.EXIT_BAD_INPUT and "'algo.lrr'" in err, err


def test_a_key_given_twice_in_a_config_file_is_refused(capsys, tmp_path):
    """PyYAML keeps the last of two equal keys silently; a config file with one is refused
    naming the key and its line (a YAML merge `<<:` then a key of its own is not a repeat)."""
    path = tmp_path / "twice.yaml"
    path.write_text("seed: 1\nalgo:\n  name: ppo\n  lr: 0.1\n  lr: 0.2\n")
    err = refusal(capsys, str(path))
    assert "the key 'lr' is given twice" in err and "line 5" in err, err
    merged = tmp_path / "merged.yaml"
    merged.write_text("env: &e {id: CartPole-v1, num_envs: 4}\neval:\n  <<: {num_envs: 8}\n")
    with pytest.raises(Reached):
        cli.main(["train", str(merged), f"run_dir={tmp_path / 'runs'}"])


def test_another_algorithms_keys_are_one_line_listing_the_valid_ones_once(capsys, tmp_path):
    """`algo.name=sac` over a PPO config: its PPO keys are one message naming them all and
    SAC's valid keys once, not one message per key each with the whole list."""
    config = Path(__file__).resolve().parents[1] / "configs" / "ppo_cartpole.yaml"
    err = refusal(capsys, str(config), f"run_dir={tmp_path / 'runs'}", "algo.name=sac")
    assert "unknown config keys 'algo.update_epochs', 'algo.num_minibatches'" in err, err
    assert "(algo.name=sac); valid keys here: activation, actor_lr" in err, err
    assert err.count("valid keys here") == 1 and "more errors" not in err, err
    assert err.rstrip().endswith("train_ratio; they are keys of algo.name=ppo"), err
