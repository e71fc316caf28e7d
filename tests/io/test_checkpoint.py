"""Checkpoints: the whole state round-trips bitwise onto the engine's shardings (offload memory
kinds included), the newest N are kept, unfinished writes are ignored, corruption and checkpoints
of another config are refused with one message."""

from __future__ import annotations

import os
import re
import shutil
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import jax
import numpy as np
import pytest

import jaxrl_engine as jre
from jaxrl_engine.core.offload import OFFLOADED_BETWEEN_EPOCHS
from jaxrl_engine.core.state import get_path
from jaxrl_engine.io.checkpoint import TMP_SUFFIX, Checkpointer, CheckpointError
from tests.conftest import run_on_four_devices, small_config


def leaves_bytes(state) -> list[tuple[str, bytes]]:
    flat = jax.tree_util.tree_flatten_with_path(state.replace(rng=jax.random.key_data(state.rng)))[
        0
    ]
    return [
        (f"{jax.tree_util.keystr(p)}:{x.dtype}", np.asarray(jax.device_get(x)).tobytes())
        for p, x in flat
    ]


def save(checkpoints: Checkpointer, engine, state, log=None) -> Path:
    """Save and wait for the commit (orbax writes in the background)."""
    path = checkpoints.save(
        state,
        config=engine.driver.cfg.model_dump(mode="json"),
        metrics_log=log,
        num_epochs=engine.num_epochs,
    )
    checkpoints.wait()
    return path


def trained(engine, epochs: int, seed: int = 0):
    state = engine.init(jax.random.key(seed))
    for _ in range(epochs):
        state, _ = engine.epoch(state)
    return state


@pytest.fixture
def engine(small_cfg):
    return jre.build(small_cfg)


def test_round_trip_is_bitwise_with_the_engines_shardings_and_a_typed_key(engine, tmp_path):
    state = trained(engine, 2)
    checkpoints = Checkpointer(tmp_path / "checkpoints", keep=3)
    log = {"bytes": 26, "sha256": "ab" * 32, "records": 2}
    path = save(checkpoints, engine, state, log)
    assert path == tmp_path / "checkpoints" / "epoch_2" and path.is_dir()

    restored, info = checkpoints.restore(engine)
    assert leaves_bytes(restored) == leaves_bytes(state)
    assert jax.dtypes.issubdtype(restored.rng.dtype, jax.dtypes.prng_key)
    assert jax.random.key_impl(restored.rng) == jax.random.key_impl(state.rng)
    for x, sharding in zip(
        jax.tree.leaves(restored), jax.tree.leaves(engine.state_sharding), strict=True
    ):
        assert x.sharding.is_equivalent_to(sharding, x.ndim)
        assert x.sharding.memory_kind == sharding.memory_kind
    assert info.epoch == 2 and info.metrics_log == log and info.metrics_lines is None
    assert info.config == engine.driver.cfg.model_dump(mode="json")
    assert info.num_epochs == engine.num_epochs


def test_restored_state_continues_exactly_like_the_original(engine, tmp_path):
    state = trained(engine, 2)
    checkpoints = Checkpointer(tmp_path, keep=3)
    save(checkpoints, engine, state)
    restored, _ = checkpoints.restore(engine)
    engine.warm_up(restored, phases=["epoch"])
    went_on, _ = engine.call("epoch", restored)
    straight, _ = engine.epoch(state)
    assert leaves_bytes(went_on) == leaves_bytes(straight)


def test_offloaded_state_restores_to_pinned_host_and_the_compiled_epoch_takes_it(tmp_path):
    engine = jre.build(small_config("offload=true", tmp_path=tmp_path))
    state = trained(engine, 1)
    checkpoints = Checkpointer(tmp_path / "checkpoints")
    save(checkpoints, engine, state)
    restored, _ = checkpoints.restore(engine)
    for path in OFFLOADED_BETWEEN_EPOCHS:
        assert {x.sharding.memory_kind for x in jax.tree.leaves(get_path(restored, path))} == {
            "pinned_host"
        }
    assert restored.env.obs.sharding.memory_kind == "device"
    engine.warm_up(restored, phases=["epoch"])
    went_on, _ = engine.call("epoch", restored)  # the AOT executable rejects other placements
    straight, _ = engine.epoch(state)
    assert leaves_bytes(went_on) == leaves_bytes(straight)


def test_keeps_only_the_newest_checkpoints(engine, tmp_path):
    checkpoints = Checkpointer(tmp_path, keep=2)
    state = engine.init(jax.random.key(0))
    for _ in range(4):
        state, _ = engine.epoch(state)
        save(checkpoints, engine, state)
    assert checkpoints.epochs() == [3, 4]  # waits for the last save to commit
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch_3", "epoch_4"]


def test_an_unfinished_write_is_not_a_checkpoint_and_is_cleared_by_the_next_writer(
    engine, tmp_path
):
    checkpoints = Checkpointer(tmp_path, keep=3)
    save(checkpoints, engine, trained(engine, 1))
    stale = tmp_path / f"epoch_2{TMP_SUFFIX}"
    (stale / "state").mkdir(parents=True)
    (stale / "state" / "partial").write_bytes(b"\0" * 10)
    assert Checkpointer(tmp_path, read_only=True).epochs() == [1]
    assert stale.exists()  # a reader leaves it alone
    Checkpointer(tmp_path, keep=3)
    assert not stale.exists()


def test_an_old_checkpoint_left_half_deleted_is_cleared_by_the_next_writer(engine, tmp_path, capfd):
    """A writer killed while deleting its oldest checkpoint (keep) leaves part of it: the next
    writer removes it; a reader, or a writer that keeps every checkpoint, leaves it."""
    checkpoints = Checkpointer(tmp_path, keep=2)
    state = engine.init(jax.random.key(0))
    for _ in range(3):
        state, _ = engine.epoch(state)
        save(checkpoints, engine, state)
    half = tmp_path / "epoch_1"  # as deleting it left it: its state item only
    shutil.copytree(tmp_path / "epoch_2" / "state", half / "state")
    Checkpointer(tmp_path, read_only=True).epochs()
    Checkpointer(tmp_path, keep=None)
    assert half.exists()
    reopened = Checkpointer(tmp_path, keep=2)
    assert not half.exists()
    capfd.readouterr()
    assert reopened.epochs() == [2, 3]
    state, _ = engine.epoch(state)
    save(reopened, engine, state)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch_3", "epoch_4"]
    assert "Metadata file does not exist" not in capfd.readouterr().err
    # The newest checkpoints are never removed for a missing file.
    (tmp_path / "epoch_3" / "_CHECKPOINT_METADATA").unlink()
    Checkpointer(tmp_path, keep=2)
    assert (tmp_path / "epoch_3").exists()


def flip_byte(path: Path, where: float) -> None:
    raw = bytearray(path.read_bytes())
    raw[int(len(raw) * where)] ^= 0xFF
    path.write_bytes(bytes(raw))


def test_no_flipped_byte_in_any_file_loads_a_wrong_state(tmp_path):
    """Every file of the state item, one flipped byte at a time (at a quarter and at half its
    length): the restore either refuses with one message or gives back exactly the saved state
    (files orbax no longer reads). 64-wide layers, so that arrays get data chunks of their own."""
    engine = jre.build(small_config("algo.hidden_sizes=[64,64]", tmp_path=tmp_path))
    state = trained(engine, 1)
    original = tmp_path / "original"
    checkpoints = Checkpointer(original)
    save(checkpoints, engine, state)
    checkpoints.close()
    files = sorted(
        p.relative_to(original)
        for p in (original / "epoch_1" / "state").rglob("*")
        if p.is_file() and p.name != "commit_success.txt"
    )
    outcomes = {}
    for i, (relative, where) in enumerate((f, w) for f in files for w in (0.25, 0.5)):
        copy = tmp_path / f"copy{i}"
        shutil.copytree(original, copy)
        flip_byte(copy / relative, where)
        try:
            restored, _ = Checkpointer(copy, read_only=True).restore(engine)
        except CheckpointError as e:
            assert "\n" not in str(e) and "epoch_1" in str(e)
            outcomes[f"{relative}@{where}"] = "crc" if "CRC-32" in str(e) else "unreadable"
        else:
            assert leaves_bytes(restored) == leaves_bytes(state), f"{relative} loaded wrong"
            outcomes[f"{relative}@{where}"] = "same"
    assert "crc" in outcomes.values(), outcomes  # orbax alone would have loaded these wrong
    assert "unreadable" in outcomes.values(), outcomes


def corrupt(tmp_path: Path, how: str) -> None:
    step = tmp_path / "epoch_1"
    if how == "truncated data file":
        for data in (step / "state" / "d").iterdir():
            data.write_bytes(data.read_bytes()[: data.stat().st_size // 3])
    elif how == "garbled metadata":
        for meta in (step / "meta").iterdir():
            meta.write_text("{not json")
    elif how == "missing metadata":
        for meta in (step / "meta").iterdir():
            meta.unlink()
    elif how == "missing data":
        shutil.rmtree(step / "state" / "d")


@pytest.mark.parametrize(
    "how, expected",
    [
        ("truncated data file", "its arrays cannot be read"),
        ("garbled metadata", "its metadata cannot be read"),
        ("missing metadata", "its metadata cannot be read"),
        ("missing data", "its arrays cannot be read"),
    ],
)
def test_a_corrupted_checkpoint_is_refused_with_one_message(engine, tmp_path, capfd, how, expected):
    checkpoints = Checkpointer(tmp_path)
    save(checkpoints, engine, trained(engine, 1))
    capfd.readouterr()
    corrupt(tmp_path, how)
    with pytest.raises(CheckpointError) as info:
        Checkpointer(tmp_path, read_only=True).restore(engine)
    message = str(info.value)
    assert "epoch_1" in message and expected in message and "\n" not in message
    assert "only checkpoint" in message
    assert "bound method" not in message  # (TensorStore's repr of its details, cut)
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err  # orbax/tensorstore noise is silenced


def _coroutine_from(filename: str):
    namespace: dict = {}
    exec(compile("async def read():\n    pass\n", filename, "exec"), namespace)
    return namespace["read"]()


def test_after_a_failed_read_orbaxs_leftover_coroutines_stay_silent(engine, tmp_path, monkeypatch):
    """Reads still in flight when a corrupted checkpoint's read failed are collected later
    (on a loaded machine, after the restore returned; at the latest at exit): each would print
    "Exception ignored in: <coroutine ...>" with a tensorstore spec, thousands of lines under
    the one-line refusal. Other code's unraisable reports still print."""
    printed: list = []
    monkeypatch.setattr(sys, "unraisablehook", printed.append)
    checkpoints = Checkpointer(tmp_path)
    save(checkpoints, engine, trained(engine, 1))
    corrupt(tmp_path, "truncated data file")
    with pytest.raises(CheckpointError, match="its arrays cannot be read"):
        Checkpointer(tmp_path, read_only=True).restore(engine)
    sep = os.sep
    orbax = _coroutine_from(f"{sep}site-packages{sep}orbax{sep}serialization.py")
    mine = _coroutine_from(f"{sep}home{sep}me{sep}train.py")
    for coroutine in (orbax, mine):
        sys.unraisablehook(SimpleNamespace(object=coroutine))
        coroutine.close()
    assert [u.object for u in printed] == [mine]


def test_corruption_message_points_to_the_previous_checkpoint(engine, tmp_path):
    checkpoints = Checkpointer(tmp_path)
    state = trained(engine, 1)
    save(checkpoints, engine, state)
    state, _ = engine.epoch(state)
    save(checkpoints, engine, state)
    data = next(p for p in (tmp_path / "epoch_2" / "meta").iterdir())
    data.write_text("[]")
    with pytest.raises(CheckpointError, match=r"epoch_2.*resume from the previous .*epoch 1"):
        checkpoints.restore(engine)
    with pytest.raises(CheckpointError) as info:
        checkpoints.info()
    assert str(info.value).endswith(
        f"jaxrl-engine train --resume {tmp_path.parent} --from-checkpoint 1"
    )
    restored, info = checkpoints.restore(engine, 1)
    assert info.epoch == 1 and int(restored.counters.epoch) == 1


def test_a_checkpoint_of_another_config_is_refused_naming_leaf_shapes_and_config_key(
    engine, tmp_path
):
    checkpoints = Checkpointer(tmp_path)
    save(checkpoints, engine, trained(engine, 1))
    wider = jre.build(small_config("algo.hidden_sizes=[32,16]", tmp_path=tmp_path))
    with pytest.raises(CheckpointError) as info:
        checkpoints.restore(wider)
    message = str(info.value)
    assert "another state layout" in message
    assert "float32[4, 16] in the checkpoint and float32[4, 32] for this config" in message
    assert "algo.hidden_sizes: [16, 16] -> [32, 16]" in message


def test_a_checkpoint_of_another_env_is_refused(engine, tmp_path):
    checkpoints = Checkpointer(tmp_path)
    save(checkpoints, engine, trained(engine, 1))
    acrobot = jre.build(small_config("env.id=Acrobot-v1", tmp_path=tmp_path))
    with pytest.raises(CheckpointError, match=r"env\.id: 'CartPole-v1' -> 'Acrobot-v1'"):
        checkpoints.restore(acrobot)


@pytest.mark.parametrize(
    "override, change",
    [
        ("algo.activation=relu", "algo.activation: 'tanh' -> 'relu'"),
        ("algo.normalize_obs=true", "algo.normalize_obs: False -> True"),
    ],
)
def test_params_trained_with_other_settings_of_the_same_shapes_are_refused(
    engine, tmp_path, override, change
):
    """A setting that changes what the params compute but not their shapes passes the layout
    check; restoring into such an engine (the library's `Checkpointer.restore`, as `jre.resume`
    already refuses the override) would evaluate or train another function."""
    checkpoints = Checkpointer(tmp_path)
    save(checkpoints, engine, trained(engine, 1))
    other = jre.build(small_config(override, tmp_path=tmp_path))
    with pytest.raises(CheckpointError, match=re.escape(change) + ".*compute something else"):
        checkpoints.restore(other)


def test_missing_directory_and_empty_directory_and_unknown_epoch(engine, tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        Checkpointer(tmp_path / "nowhere", read_only=True)
    with pytest.raises(CheckpointError, match="no checkpoints in"):
        Checkpointer(tmp_path).restore(engine)
    checkpoints = Checkpointer(tmp_path)
    save(checkpoints, engine, trained(engine, 1))
    with pytest.raises(CheckpointError, match=r"no checkpoint of epoch 7.*\[1\]"):
        checkpoints.restore(engine, 7)


SHARDED = textwrap.dedent(
    """
    import json, sys, jax, numpy as np
    import jaxrl_engine as jre
    from jaxrl_engine.io.checkpoint import Checkpointer
    assert len(jax.devices()) == 4
    cfg = jre.load_config(None, ["env.num_envs=8", "eval.num_envs=8", "algo.num_steps=16",
        "algo.num_minibatches=2", "algo.update_epochs=2", "algo.hidden_sizes=[16,16]",
        "progress=false", "offload=" + sys.argv[2]])
    engine = jre.build(cfg)
    state = engine.init(jax.random.key(0))
    for _ in range(2):
        state, _ = engine.epoch(state)
    checkpoints = Checkpointer(sys.argv[1])
    checkpoints.save(state, config=cfg.model_dump(mode="json"),
                     num_epochs=engine.num_epochs)
    restored, _ = checkpoints.restore(engine)
    def raw(s):
        return [np.asarray(x).tobytes() for x in
                jax.tree.leaves(s.replace(rng=jax.random.key_data(s.rng)))]
    placed = all(
        x.sharding == s or x.sharding.is_equivalent_to(s, x.ndim)
        for x, s in zip(jax.tree.leaves(restored), jax.tree.leaves(engine.state_sharding)))
    kinds = all(x.sharding.memory_kind == s.memory_kind
        for x, s in zip(jax.tree.leaves(restored), jax.tree.leaves(engine.state_sharding)))
    out = dict(
        equal=raw(restored) == raw(state), placed=placed, kinds=kinds,
        obs_devices=len(restored.env.obs.sharding.device_set),
        obs_spec=str(restored.env.obs.sharding.spec),
        buffer_spec=str(restored.buffer.obs.sharding.spec))
    engine.warm_up(restored, phases=["epoch"])
    a, _ = engine.call("epoch", restored)  # donates `restored`
    b, _ = engine.epoch(state)
    print(json.dumps({**out, "continued_equal": raw(a) == raw(b)}))
    """
)


@pytest.mark.multidevice
@pytest.mark.parametrize("offload", ["false", "true"])
def test_sharded_state_on_four_devices_restores_onto_the_same_shardings(tmp_path, offload):
    out = run_on_four_devices(SHARDED, str(tmp_path / "checkpoints"), offload)
    assert out == {
        "equal": True,
        "placed": True,
        "kinds": True,
        "obs_devices": 4,
        "obs_spec": "P('data',)",
        "buffer_spec": "P(None, 'data')",
        "continued_equal": True,
    }


def test_a_folder_without_a_checkpoint_in_it_is_named_once_without_orbax_warnings(
    engine, tmp_path, capfd
):
    checkpoints = Checkpointer(tmp_path)
    save(checkpoints, engine, trained(engine, 1))
    (tmp_path / "epoch_999").mkdir()  # e.g. made by hand
    capfd.readouterr()
    with pytest.raises(CheckpointError, match=r"epoch_999.*resume from the previous .*epoch 1"):
        Checkpointer(tmp_path, read_only=True).info()
    out, err = capfd.readouterr()
    assert "WARNING:absl" not in out + err  # (orbax warned once per listing)


def test_a_checkpoint_written_before_a_hyperparameter_existed_resumes_with_the_configs(tmp_path):
    """DQN's `priority_beta_end` came after checkpoints that lack it: they still resume (the
    new hyperparameter the config's, with a warning) and export, as a sweep's would."""
    from typing import NamedTuple

    from tests.algos.test_off_policy import config

    cfg = config("dqn", "algo.priority_beta_end=0.9", tmp_path=tmp_path)
    engine = jre.build(cfg)
    state = trained(engine, 2)
    fields = [f for f in type(state.hparams).__dataclass_fields__ if f != "priority_beta_end"]
    Old = NamedTuple("Old", [(f, jax.Array) for f in fields])  # the layout without it
    old = state.replace(hparams=Old(*(getattr(state.hparams, f) for f in fields)))
    run = tmp_path / cfg.name
    save(Checkpointer(run / "checkpoints"), engine, old)
    with pytest.warns(UserWarning, match="predates the hyperparameters priority_beta_end"):
        _, restored = jre.resume(run)
    assert float(restored.hparams.priority_beta_end) == pytest.approx(0.9)
    assert leaves_bytes(restored.replace(hparams=state.hparams)) == leaves_bytes(state)
