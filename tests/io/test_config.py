"""Config: YAML files, the schema's defaults, dotted overrides, the resolved copy in a run dir."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

import jaxrl_engine as jre
from jaxrl_engine.algos import ALGORITHMS as ALGO_CONFIGS
from jaxrl_engine.algos.ppo import PPOConfig
from jaxrl_engine.io import config as config_module
from jaxrl_engine.run.run_dir import RunDir

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


def schema_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted key of the schema (sub-models expanded; `algo.*` of every algorithm)."""
    keys = []
    for name, field in model.model_fields.items():
        if name == "algo" and model is jre.Config:
            for algo in ALGO_CONFIGS.values():
                keys += schema_keys(algo, "algo.")
        elif isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            keys += schema_keys(field.annotation, f"{prefix}{name}.")
        else:
            keys.append(f"{prefix}{name}")
    return sorted(set(keys))


def write_config_yaml(path: Path, cfg: jre.Config) -> None:
    """The run directory's `config.yaml`, written as a run writes it (when its logs open)."""
    run = RunDir(path, cfg)
    run.open_logs(0)
    run.close()


KEYS = schema_keys(jre.Config)
ALGO_NAMES = sorted(ALGO_CONFIGS)


def test_cartpole_file_spells_out_exactly_the_schema_defaults():
    assert jre.load_config(ROOT / "configs" / "ppo_cartpole.yaml") == jre.Config()
    assert jre.load_config(None) == jre.Config()
    # Every key is written out in the file, with the default's value.
    raw = yaml.safe_load((ROOT / "configs" / "ppo_cartpole.yaml").read_text())
    assert raw == jre.Config().model_dump(mode="json")


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_shipped_config_loads(path):
    cfg = jre.load_config(path)
    assert cfg.name == path.stem


def test_dotted_overrides_set_nested_values():
    cfg = jre.load_config(
        ROOT / "configs" / "ppo_cartpole.yaml",
        [
            "algo.lr=1e-3",
            "algo.hidden_sizes=[32,32]",
            "env.num_envs=8",
            "seed=3",
            "eval.env_params={max_steps_in_episode: 5}",
            "algo.anneal_lr=false",
        ],
    )
    assert cfg.algo.lr == 0.001 and isinstance(cfg.algo.lr, float)
    assert cfg.algo.hidden_sizes == [32, 32]
    assert cfg.env.num_envs == 8
    assert cfg.seed == 3
    assert cfg.eval.env_params == {"max_steps_in_episode": 5}
    assert cfg.algo.anneal_lr is False
    assert cfg.algo.gamma == jre.Config().algo.gamma  # untouched keys keep the file's values


def test_later_override_wins():
    assert jre.load_config(None, ["algo.lr=1e-3", "algo.lr=2e-3"]).algo.lr == 0.002


@pytest.mark.parametrize(
    "override, key",
    [
        ("bogus=1", "'bogus'"),
        ("env.bogus=1", "'env.bogus'"),
        ("algo.bogus=1", "'algo.bogus'"),
        ("algo.ppo=1", "'algo.ppo'"),
    ],
)
def test_unknown_key_message_names_the_full_dotted_key(override, key):
    with pytest.raises(jre.ConfigError) as info:
        jre.load_config(None, [override])
    assert f"unknown config key {key}" in str(info.value)


def test_resolved_config_in_the_run_directory_loads_back_equal(tmp_path):
    cfg = jre.load_config(
        ROOT / "configs" / "ppo_pendulum.yaml",
        [
            "algo.lr=3e-4",
            "algo.hidden_sizes=[32,16]",
            "eval.env_params={max_steps_in_episode: 7}",
            "compile_cache_dir=/tmp/cache",
            f"run_dir={tmp_path}",
            "loggers=[jsonl]",
        ],
    )
    write_config_yaml(tmp_path / cfg.name, cfg)
    assert jre.load_config(tmp_path / cfg.name / "config.yaml") == cfg


# Any one folder name: no separator, control character, leading '-', '.' or '..'.
_name = st.text(
    st.characters(exclude_categories=("Cc", "Cs"), exclude_characters="/\\"),
    min_size=1,
    max_size=20,
).filter(lambda n: n not in (".", "..") and not n.startswith("-"))


@settings(max_examples=50, deadline=None)
@given(
    name=_name,
    lr=st.floats(min_value=1e-12, max_value=1e3),
    gamma=st.floats(min_value=1e-6, max_value=1.0),
    hidden=st.lists(st.integers(1, 4096), min_size=1, max_size=4),
)
def test_any_valid_config_round_trips_through_the_run_directory(
    tmp_path_factory, name, lr, gamma, hidden
):
    algo = PPOConfig(lr=lr, gamma=gamma, hidden_sizes=hidden)
    cfg = jre.Config(name=name, algo=algo, loggers=["jsonl"])
    path = tmp_path_factory.mktemp("run")
    write_config_yaml(path, cfg)
    assert jre.load_config(path / "config.yaml") == cfg


@pytest.mark.parametrize("name", ["0E0", "1e-3", "+2E5", "1.5e3", "null", "true", "0x10", "7"])
def test_a_name_that_reads_as_a_number_round_trips(tmp_path, name):
    """The loader reads `1e-3` as a float (YAML 1.2); the writer quotes such strings."""
    cfg = jre.Config(name=name, loggers=["jsonl"])
    write_config_yaml(tmp_path, cfg)
    assert jre.load_config(tmp_path / "config.yaml").name == name


VALUES = [
    "null",
    "{a: 1}",
    "{max_steps_in_episode: 3}",
    "[",
    "{",
    "tanh",
    "CartPole-v1",
    "Pendulum-v1",
    "1e-3",
    ".inf",
    "-.inf",
    ".nan",
    "-0",
    "0.5",
    *ALGO_NAMES,
]
_value = st.one_of(
    st.integers(-(10**12), 10**12).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.booleans().map(lambda b: "true" if b else "false"),
    st.text(max_size=15),
    st.lists(st.integers(-5, 300), max_size=4).map(lambda xs: f"[{','.join(map(str, xs))}]"),
    st.sampled_from(VALUES),
)
_junk_key = st.text(alphabet="abcxyz_.0123 ", max_size=12)
_key = st.one_of(
    st.sampled_from(KEYS),
    _junk_key,
    st.tuples(st.sampled_from(KEYS), _junk_key).map(".".join),
    st.sampled_from(
        ["algo", "algo.ppo", "env.params.gravity", "env.params.bogus", "eval.env_params.tau"]
    ),
)
_override = st.one_of(
    st.tuples(_key, _value).map("=".join),
    st.sampled_from(ALGO_NAMES).map("algo.name={}".format),  # reach every algorithm's checks
    st.text(max_size=20),
)


@settings(max_examples=300, deadline=None)
@given(overrides=st.lists(_override, max_size=4))
@example(overrides=["seed=1e400"])
@example(overrides=["algo.name=dqn", "algo.train_ratio=.inf"])
@example(overrides=["algo.name=sac", "algo.buffer_size=.inf"])
def test_random_overrides_load_or_raise_config_error(overrides):
    try:
        cfg = jre.load_config(None, overrides)
    except jre.ConfigError as e:
        assert str(e)
    else:
        assert isinstance(cfg, jre.Config)


HEAVY = ("jax", "flax", "optax", "gymnax", "orbax")


@pytest.mark.parametrize(
    "module", ["jaxrl_engine.io.config", "jaxrl_engine.algos", "jaxrl_engine.algos.configs"]
)
def test_the_config_schema_imports_without_jax(module):
    """The schema (and the algorithms' config classes) import without JAX and the packages
    built on it, so that a config error is answered before JAX starts."""
    code = f"import sys, {module}; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert proc.stdout.strip() == "[]", (proc.stdout, proc.stderr)


def test_the_jax_free_gymnax_ids_are_gymnax_s_own():
    """`GYMNAX_ENV_IDS` (known without importing gymnax) is what the adapter accepts, in
    gymnax's order: gymnax's registered ids less the ones it refuses."""
    import gymnax

    from jaxrl_engine.envs.gymnax_env import _EXCLUDED, available_env_ids

    assert list(config_module.GYMNAX_ENV_IDS) == available_env_ids()
    assert set(config_module.GYMNAX_ENV_IDS) | set(_EXCLUDED) == set(gymnax.registered_envs)


def test_structure_errors_come_first_and_env_errors_still_come():
    """load_config's first pass (no env) reports structural errors; the second still checks
    what needs the env, with the same messages, and a Config built directly runs both."""
    with pytest.raises(jre.ConfigError) as e:
        jre.load_config(None, ["env.params.bogus=1", "algo.lrr=1"])
    assert "'algo.lrr'" in str(e.value) and "bogus" not in str(e.value)
    with pytest.raises(jre.ConfigError) as e:  # gymnax's ids are known without gymnax
        jre.load_config(None, ["env.id=CartPole-v9", "algo.lrr=1"])
    assert "'algo.lrr'" in str(e.value) and "unknown env id 'CartPole-v9'" in str(e.value)
    for overrides, fragment in [
        (["env.id=CartPole-v9"], "unknown env id 'CartPole-v9'; valid choices: CartPole-v1"),
        (["env.id=MNISTBandit-bsuite"], "unknown env id 'MNISTBandit-bsuite'"),
        (["env.params.bogus=1"], "unknown env param(s) ['bogus']"),
        (["algo.name=sac"], "algo.name=sac needs a continuous action space"),
        (["algo.torso=cnn"], "algo.torso=cnn needs image observations"),
    ]:
        with pytest.raises(jre.ConfigError, match=re.escape(fragment)):
            jre.load_config(None, overrides)
    with pytest.raises(ValidationError, match="unknown env param"):
        jre.Config.model_validate({"env": {"params": {"bogus": 1}}})
    cfg = jre.load_config(None, ["env.id=Pendulum-v1", "algo.name=sac"])
    with pytest.raises(ValidationError, match="needs a discrete action space"):
        cfg.algo = ALGO_CONFIGS["dqn"]()  # (assignments are validated whole, env included)


@pytest.mark.parametrize(
    "override, said",
    [
        ("algo.lrr=1e-3", "; did you mean 'lr'?"),
        ("algo.Lr=1e-3", "; did you mean 'lr'?"),
        ("eval.intervall=3", "; did you mean 'interval'?"),
        ("algo.tau=0.1", "; it is a key of algo.name=dqn/sac/td3"),
        # Other libraries' names (SB3, CleanRL) for the same settings:
        ("algo.learning_rate=1e-3", "; did you mean 'lr'?"),
        ("algo.n_epochs=3", "; did you mean 'update_epochs'?"),
        ("algo.clip_range=0.1", "; did you mean 'clip_eps'?"),
        ("n_envs=8", "; did you mean 'env.num_envs'?"),
        ("total_timesteps=8", "; did you mean 'total_env_steps'?"),
        ("algo.batch_size=64", "did you mean 'num_minibatches' (PPO's minibatch is env.num_envs"),
    ],
)
def test_an_unknown_key_names_the_key_meant(override, said):
    with pytest.raises(jre.ConfigError) as e:
        jre.load_config(None, [override])
    assert said in str(e.value)


@pytest.mark.parametrize(
    "override, said",
    [
        ("algo.learning_rate=1e-3", "; did you mean 'actor_lr' or 'critic_lr'?"),
        ("algo.batchsize=64", "; did you mean 'batch_size'?"),
        ("algo.train_freq=4", "; did you mean 'train_ratio' (gradient steps per env step)?"),
    ],
)
def test_an_unknown_key_under_sac_names_sacs_key(override, said):
    with pytest.raises(jre.ConfigError) as e:
        jre.load_config(None, ["env.id=Pendulum-v1", "algo.name=sac", override])
    assert said in str(e.value)


def test_override_spellings_users_type():
    cfg = jre.load_config(None, ["algo.lr = 3e-4", "compile_cache_dir=None", "name=None"])
    assert cfg.algo.lr == pytest.approx(3e-4)  # spaces around '=' in one argument
    assert cfg.compile_cache_dir is None  # Python's None is null
    assert cfg.name == "None"  # (a text-only key keeps the text)
    assert jre.load_config(None, ['compile_cache_dir="None"']).compile_cache_dir == "None"
    with pytest.raises(jre.ConfigError, match="a config file comes first"):
        jre.load_config(None, ["run_dir=x", "configs/ppo_cartpole.yaml"])
