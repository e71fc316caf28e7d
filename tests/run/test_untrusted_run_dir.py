"""A run directory is data, never code: a torch factory it names (in a checkpoint or in its
config.yaml) is imported only when the user names the same one; a compile cache it names is
not used on its word."""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import jaxrl_engine as jre
from jaxrl_engine import cli
from jaxrl_engine.export.jax_loader import load as load_policy
from tests.conftest import SMALL

pytest.importorskip("torch", reason="the torch extra builds torch policies")

PLANTED = """
from pathlib import Path

Path(__file__).with_name("IMPORTED").write_text("planted code ran")

from jaxrl_engine.interop.torch_nets import mlp as make
"""
FACTORY = "algo.torch_policy.factory=planted_factory:make"


@pytest.fixture(scope="module")
def planted_run(tmp_path_factory) -> Path:
    """A finished run trained with a factory module that now lies in its run directory (as
    an attacker would plant it) and writes IMPORTED next to itself when imported."""
    root = tmp_path_factory.mktemp("untrusted")
    run = root / "t"
    run.mkdir()
    (run / "planted_factory.py").write_text(PLANTED)
    sys.path.insert(0, str(run))  # trusted by the user who trained it
    try:
        cfg = jre.load_config(
            None, [*SMALL, f"run_dir={root}", "name=t", FACTORY, "save_interval=2"]
        )
        engine = jre.build(cfg)
        engine.run(engine.init(jax.random.key(0)))
    finally:
        sys.path.remove(str(run))
        sys.modules.pop("planted_factory", None)
    (run / "IMPORTED").unlink()
    return run


@pytest.fixture
def attacker_path(planted_run, monkeypatch):
    """The run directory is importable (e.g. the user runs from inside it)."""
    monkeypatch.syspath_prepend(str(planted_run))
    yield planted_run
    sys.modules.pop("planted_factory", None)
    (planted_run / "IMPORTED").unlink(missing_ok=True)


def assert_not_imported(run: Path) -> None:
    assert "planted_factory" not in sys.modules
    assert not (run / "IMPORTED").exists()


def test_resume_export_eval_and_make_policy_never_import_a_factory_the_run_names(
    attacker_path, capsys
):
    run = attacker_path
    assert cli.main(["train", "--resume", str(run)]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "names the torch factory 'planted_factory:make'" in err and "never code" in err
    assert f"{FACTORY} on the command line" in err
    assert_not_imported(run)

    assert cli.main(["export", str(run), "--checkpoint"]) == cli.EXIT_BAD_INPUT
    assert "--factory planted_factory:make" in capsys.readouterr().err
    assert_not_imported(run)

    assert cli.main(["eval", str(run), "--episodes", "2"]) == 0  # the exported artefact only
    assert_not_imported(run)

    # The exported artefact acts without the factory: the greedy action eval plays.
    policy = jre.make_policy(run)
    obs = np.linspace(-0.1, 0.1, 12, dtype=np.float32).reshape(3, 4)
    act, params = load_policy(run / "policy")
    np.testing.assert_array_equal(np.asarray(policy(obs)), np.asarray(act(params, obs)))
    assert np.asarray(policy(obs)).shape == (3,)
    assert_not_imported(run)
    # Sampling, or the checkpoint's params, need the network itself: refused unnamed.
    for kwargs in ({"checkpoint": True}, {"deterministic": False}):
        with pytest.raises(jre.ConfigError, match="never code"):
            jre.make_policy(run, **kwargs)
    assert_not_imported(run)


def test_a_factory_named_by_the_user_must_match_the_stored_one(attacker_path, capsys):
    run = attacker_path
    other = "algo.torch_policy.factory=jaxrl_engine.interop.torch_nets:mlp"
    assert cli.main(["train", "--resume", str(run), other]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "is not the factory 'planted_factory:make'" in err and "Traceback" not in err
    assert_not_imported(run)


def test_the_factory_named_by_the_user_is_used(attacker_path, capsys):
    run = attacker_path
    assert cli.main(["train", "--resume", str(run), FACTORY]) == 0  # finished: summary
    assert "is finished" in capsys.readouterr().err
    assert (run / "IMPORTED").exists()  # the user's own choice
    policy = jre.make_policy(run, factory="planted_factory:make")
    assert policy(jax.numpy.zeros((3, 4))).shape == (3,)


def test_a_stored_compile_cache_is_not_used_unless_given_again(tmp_path, capsys, monkeypatch):
    import jaxrl_engine.compose as compose

    enabled: list[str | None] = []  # (the real one sets JAX's process-wide cache directory)
    monkeypatch.setattr(compose, "configure_compile_cache", enabled.append)
    cache = tmp_path / "cache_from_elsewhere"
    cfg = jre.load_config(
        None, [*SMALL, f"run_dir={tmp_path}", "name=c", f"compile_cache_dir={cache}"]
    )
    engine = jre.build(cfg)
    engine.run(engine.init(jax.random.key(0)), num_epochs=2)
    capsys.readouterr()
    assert enabled == [str(cache)]
    engine, _ = jre.resume(tmp_path / "c")  # the stored folder: the user's own cache instead
    assert engine.driver.cfg.compile_cache_dir == "auto" and enabled == [str(cache), "auto"]
    assert f"not using the compile cache {str(cache)!r}" in capsys.readouterr().err
    engine, _ = jre.resume(tmp_path / "c", [f"compile_cache_dir={cache}"])
    assert engine.driver.cfg.compile_cache_dir == str(cache)
    assert enabled == [str(cache), "auto", str(cache)]


def test_a_stored_auto_compile_cache_is_kept(tmp_path, capsys, monkeypatch):
    """`auto` names no folder of the run directory's choosing (the user's own cache folder)."""
    import jaxrl_engine.compose as compose

    enabled: list[str | None] = []
    monkeypatch.setattr(compose, "configure_compile_cache", enabled.append)
    cfg = jre.load_config(None, [*SMALL, f"run_dir={tmp_path}", "name=c"])
    assert cfg.compile_cache_dir == "auto"  # the default
    engine = jre.build(cfg)
    engine.run(engine.init(jax.random.key(0)), num_epochs=2)
    engine, _ = jre.resume(tmp_path / "c")
    assert engine.driver.cfg.compile_cache_dir == "auto" and enabled == ["auto", "auto"]
    assert "not using the compile cache" not in capsys.readouterr().err


def test_a_factory_named_for_a_run_trained_without_one_is_refused_before_importing_it():
    """`export --checkpoint --factory M:F` (or a resume naming one) of a flax run: the
    factory is never imported or called; the message says the run has none."""
    from jaxrl_engine.compose import config_from_run

    stored = jre.load_config(None, [*SMALL, "name=plain"]).model_dump(mode="json")
    with pytest.raises(jre.ConfigError, match="was not trained with a torch factory"):
        config_from_run(stored, [FACTORY], source="run 'plain'", how="{factory}")
    assert "planted_factory" not in sys.modules
