"""`offload: true`: RLightning's placement, checked by memory kind and byte accounting."""

from __future__ import annotations

import gc

import jax
import numpy as np
import optax
import pytest

import jaxrl_engine as jre
from jaxrl_engine.core.offload import OFFLOAD_PLACEMENT, OFFLOADED_BETWEEN_EPOCHS
from jaxrl_engine.core.state import get_path
from tests.conftest import small_config

PATHS = ("eval_params", "train.params", "train.opt_state")


def kinds(state) -> dict[str, set[str]]:
    return {p: {x.sharding.memory_kind for x in jax.tree.leaves(get_path(state, p))} for p in PATHS}


def live_bytes_by_kind(exclude: set[int]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for x in jax.live_arrays():
        if id(x) not in exclude and not x.is_deleted():
            kind = x.sharding.memory_kind
            totals[kind] = totals.get(kind, 0) + x.nbytes
    return totals


def state_bytes_by_kind(state) -> dict[str, int]:
    totals: dict[str, int] = {}
    for x in jax.tree.leaves(state.replace(rng=jax.random.key_data(state.rng))):
        totals[x.sharding.memory_kind] = totals.get(x.sharding.memory_kind, 0) + x.nbytes
    return totals


def test_memory_kind_of_offloaded_leaves_at_each_phase_boundary(tmp_path):
    engine = jre.build(small_config("offload=true", tmp_path=tmp_path))
    state = engine.init(jax.random.key(0))
    assert kinds(state) == {p: {"pinned_host"} for p in PATHS}  # between epochs

    expected_on_device_after = {
        "rollout": set(),  # eval params reloaded for acting, offloaded again after
        "update_dataset": set(),
        "train": {"train.params"},  # reloaded for training; optimizer state offloaded after
        "sync_weights": set(),  # params (and the fresh acting copy) offloaded after sync
    }
    for name, on_device in expected_on_device_after.items():
        state, _ = getattr(engine, name)(state)
        want = {p: {"device"} if p in on_device else {"pinned_host"} for p in PATHS}
        assert kinds(state) == want, name
    state, _ = engine.evaluate(state)
    assert kinds(state) == {p: {"pinned_host"} for p in PATHS}
    assert set(OFFLOAD_PLACEMENT) == {
        "rollout",
        "evaluate",
        "update_dataset",
        "train",
        "sync_weights",
    }
    assert set(OFFLOADED_BETWEEN_EPOCHS) == set(PATHS)


def test_offloaded_sources_are_freed_byte_accounting(tmp_path):
    gc.collect()
    before = {id(x) for x in jax.live_arrays()}
    engine = jre.build(small_config("offload=true", tmp_path=tmp_path))
    state = engine.init(jax.random.key(0))
    for _ in range(2):
        state, metrics = engine.epoch(state)
    del metrics
    gc.collect()
    live = live_bytes_by_kind(before)
    held = state_bytes_by_kind(state)
    # Exactly one copy of everything: no device-side leftovers of the offloaded leaves.
    assert live == held
    offloaded = sum(x.nbytes for p in PATHS for x in jax.tree.leaves(get_path(state, p)))
    assert held["pinned_host"] == offloaded > 0


def test_training_results_equal_with_and_without_offload(tmp_path):
    results = []
    for flag in ("false", "true"):
        engine = jre.build(small_config(f"offload={flag}", tmp_path=tmp_path))
        state = engine.init(jax.random.key(1))
        for _ in range(3):
            state, metrics = engine.epoch(state)
        results.append((jax.device_get(state.train.params), jax.device_get(metrics)))
    (p0, m0), (p1, m1) = results
    for a, b in zip(jax.tree.leaves(p0), jax.tree.leaves(p1), strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(m0["train/loss"], m1["train/loss"])


def test_make_train_with_offload_equals_without(tmp_path):
    losses = []
    for flag in ("false", "true"):
        train = jre.make_train(small_config(f"offload={flag}", tmp_path=tmp_path))
        _, metrics = jax.jit(train)(jax.random.key(2))
        losses.append(np.asarray(metrics["train/loss"]))
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-6)


def test_the_users_own_offload_hooks_set_the_placement_between_epochs(tmp_path):
    # offload_after / reload_before composed by hand (no `offload: true`): the optimizer state
    # stays in host memory between epochs, `epochs` compiles (its loop carries it there) and
    # the run trains as without the hooks.
    cfg = small_config(tmp_path=tmp_path)
    plain = jre.build(cfg)
    mesh = plain.mesh
    hooks = {
        "train": [jre.offload_after(["train.opt_state"], mesh)],
        "rollout": [jre.reload_before(["train.opt_state"], mesh)],
    }
    hooked = jre.build(cfg, hooks=hooks)
    state = hooked.init(jax.random.key(1))
    assert kinds(state)["train.opt_state"] == {"pinned_host"}
    assert kinds(state)["train.params"] == {"device"}
    state, _ = hooked.epoch(state)
    assert kinds(state)["train.opt_state"] == {"pinned_host"}  # not moved back by the jit
    state, _, _ = hooked.epochs(state, 2)
    assert kinds(state)["train.opt_state"] == {"pinned_host"}
    reference = plain.init(jax.random.key(1))
    reference, _ = plain.epoch(reference)
    reference, _, _ = plain.epochs(reference, 2)
    for a, b in zip(
        jax.tree.leaves(jax.device_get(state.train)),
        jax.tree.leaves(jax.device_get(reference.train)),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)
    _, summary = hooked.run(hooked.init(jax.random.key(1)), run_dir=tmp_path / "hooked")
    assert summary["status"] == "completed"


def test_params_left_in_host_memory_for_a_phase_that_reads_them_are_named(tmp_path):
    # The user offloads the params after `train` and never reloads them: the next epoch's
    # rollout computes with host-memory params, which XLA refuses. The error names where
    # they are, the phase that reads them and the hook that fixes it, before any training.
    cfg = small_config(tmp_path=tmp_path)
    mesh = jre.build(cfg).mesh
    hooks = {
        "train": [jre.offload_after(["train.params"], mesh)],
        "evaluate": [jre.reload_before(["train.params", "eval_params"], mesh)],
    }
    engine = jre.build(cfg, hooks=hooks)
    with pytest.raises(jre.ShapeMismatchError) as error:
        engine.warm_up(engine.init(jax.random.key(0)))
    message = str(error.value)
    assert "memory_space" in message
    assert "train.params" in message
    assert "add jre.reload_before(" in message and "to the hooks of phase 'rollout'" in message


def test_offload_true_with_an_update_dataset_that_reads_the_params_names_the_fix(tmp_path):
    # The placement gives update_dataset no params (the built-in algorithms' read none); one
    # of the user's that does is told which hook to add, and runs with it (README, "Add an
    # algorithm").
    cfg = small_config("offload=true", tmp_path=tmp_path)
    engine = jre.build(cfg)
    builtin = engine.builder.update_dataset

    def reads_params(state):
        state, metrics = builtin(state)
        return state, {**metrics, "update_dataset/norm": optax.tree.norm(state.train.params)}

    own = jre.build(cfg, phases={"update_dataset": reads_params})
    with pytest.raises(jre.ShapeMismatchError, match=r"to the hooks of phase 'update_dataset'"):
        own.warm_up(own.init(jax.random.key(0)), phases=["update_dataset"])
    hooks = {"update_dataset": [jre.reload_before(["train.params"], engine.mesh)]}
    fixed = jre.build(cfg, phases={"update_dataset": reads_params}, hooks=hooks)
    _, metrics = fixed.epoch(fixed.init(jax.random.key(0)))
    assert np.isfinite(float(metrics["update_dataset/norm"]))
