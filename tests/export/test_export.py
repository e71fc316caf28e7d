"""Policy export: the artefact reproduces the engine's actions in a fresh process that imports
neither the engine nor the training code (JAX path), and as a torch module (torch path)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

import jaxrl_engine as jre
from jaxrl_engine import cli
from jaxrl_engine.export.policy import (
    POLICY_DIR,
    ExportError,
    export_torch,
    flatten_params,
    load_exported,
    load_params,
    torch_module,
)
from tests.conftest import small_config

ENVS = {"discrete": "CartPole-v1", "continuous": "Pendulum-v1"}
OBS_SCALE = {"CartPole-v1": [2.4, 3.0, 0.2, 3.0], "Pendulum-v1": [1.0, 1.0, 8.0]}


@pytest.fixture(scope="module", params=list(ENVS), ids=list(ENVS))
def trained(request, tmp_path_factory):
    """A short run (normalised observations, so the normaliser is part of the policy)."""
    env_id = ENVS[request.param]
    root = tmp_path_factory.mktemp(request.param)
    cfg = small_config(
        f"env.id={env_id}", "algo.normalize_obs=true", "total_env_steps=256", tmp_path=root
    )
    engine = jre.build(cfg)
    state, _ = engine.run(engine.init(jax.random.key(0)))
    rng = np.random.default_rng(0)
    obs = (rng.normal(size=(100, *engine.spec.obs_shape)) * OBS_SCALE[env_id]).astype(np.float32)
    action, _ = engine.algo.act(state.eval_params, obs, jax.random.key(1), True)
    expected = np.asarray(engine.spec.action.clip(action))
    return engine, state, root / cfg.name / POLICY_DIR, obs, expected


def run_fresh(code: str, cwd, *args: str) -> str:
    """`code` in a new interpreter in isolated mode (no cwd or PYTHONPATH on sys.path)."""
    proc = subprocess.run(
        [sys.executable, "-I", "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


JAX_USER = """
    import sys
    import numpy as np
    sys.path.insert(0, sys.argv[1])
    import policy

    act, params = policy.load()
    obs = np.load(sys.argv[2])
    np.save(sys.argv[3], np.asarray(act(params, obs)))
    assert act(params, obs[:0]).shape == (0, *act(params, obs[:1]).shape[1:])  # an empty batch
    try:  # one observation without its batch axis: named, with the fix
        act(params, obs[0])
        raise AssertionError("an unbatched observation was taken")
    except ValueError as e:
        assert "this policy takes [batch, " in str(e) and "obs[None]" in str(e), e
    training = ("jaxrl_engine", "flax", "optax", "gymnax")
    print(sorted(m for m in sys.modules if m.split(".")[0] in training))
"""

TORCH_USER = """
    import sys
    import numpy as np
    import torch
    sys.path.insert(0, sys.argv[1])
    import torch_policy

    policy = torch_policy.load()
    with torch.no_grad():
        obs = torch.from_numpy(np.load(sys.argv[2]))
        action = policy(obs)
        assert policy(obs[:0]).shape == (0, *action.shape[1:])  # an empty batch
        try:  # one observation without its batch axis: named, with the fix
            policy(obs[0])
            raise AssertionError("an unbatched observation was taken")
        except ValueError as e:
            assert "this policy takes [batch, " in str(e) and "obs[None]" in str(e), e
    np.save(sys.argv[3], action.numpy())
    print(sorted(m for m in sys.modules if m.split(".")[0] in ("jaxrl_engine", "jax", "flax")))
"""


def test_run_writes_the_policy_artefact(trained):
    engine, state, policy, _, _ = trained
    assert {p.name for p in policy.iterdir()} >= {
        "act.jaxexport",
        "params.npz",
        "policy.py",
        "meta.json",
    }
    meta = json.loads((policy / "meta.json").read_text())
    assert meta["env_id"] == engine.spec.env_id and meta["algorithm"] == "ppo"
    assert meta["params"] == {
        k: list(v.shape) for k, v in flatten_params(state.eval_params).items()
    }
    assert "import jaxrl_engine" not in (policy / "policy.py").read_text()


def test_jax_artefact_reproduces_actions_in_a_process_without_the_engine(trained, tmp_path):
    _, _, policy, obs, expected = trained
    np.save(tmp_path / "obs.npy", obs)
    imported = run_fresh(JAX_USER, tmp_path, str(policy), "obs.npy", "actions.npy")
    assert imported.strip() == "[]", f"the artefact imported training code: {imported}"
    actions = np.load(tmp_path / "actions.npy")
    assert actions.shape == expected.shape and actions.dtype == expected.dtype
    if expected.dtype.kind == "i":
        np.testing.assert_array_equal(actions, expected)
        assert len(np.unique(expected)) > 1  # else the check would be vacuous
    else:  # the same graph, compiled for another batch size: float32 rounding at most
        np.testing.assert_allclose(actions, expected, rtol=1e-5, atol=1e-7)
        assert np.ptp(expected) > 1e-3


def test_torch_module_reproduces_actions_in_a_process_without_jax(trained, tmp_path):
    pytest.importorskip("torch")
    _, _, policy, obs, expected = trained
    export_torch(policy)
    np.save(tmp_path / "obs.npy", obs)
    imported = run_fresh(TORCH_USER, tmp_path, str(policy), "obs.npy", "actions.npy")
    assert imported.strip() == "[]", f"the torch artefact imported JAX or the engine: {imported}"
    actions = np.load(tmp_path / "actions.npy")
    if expected.dtype.kind == "i":
        np.testing.assert_array_equal(actions, expected)
    else:
        assert actions.shape == expected.shape
        np.testing.assert_allclose(actions, expected, rtol=1e-5, atol=1e-5)


def test_in_process_torch_module_from_jax_params(trained):
    torch = pytest.importorskip("torch")
    _, state, policy, obs, expected = trained
    spec = json.loads((policy / "meta.json").read_text())["torch"]
    module = torch_module(spec, state.eval_params)
    with torch.no_grad():
        actions = module(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(actions, expected, rtol=1e-5, atol=1e-5)


def test_load_params_round_trips_and_rejects_another_shape(trained, tmp_path):
    engine, state, policy, _, _ = trained
    loaded = load_params(engine, policy)
    for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(state.eval_params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    other = jre.build(small_config(f"env.id={engine.spec.env_id}", "algo.hidden_sizes=[8]"))
    with pytest.raises(ExportError, match=r"missing|shape"):
        load_params(other, policy)
    with pytest.raises(ExportError, match="does not exist"):
        load_params(engine, tmp_path)


def test_damaged_policy_files_are_named_by_every_reader(trained, tmp_path):
    engine, _, policy, _, _ = trained
    copy = tmp_path / "run" / POLICY_DIR
    shutil.copytree(policy, copy)
    export_torch(copy)
    loader = importlib.util.spec_from_file_location("policy_copy", copy / "policy.py")
    jax_loader = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(jax_loader)
    torch_spec = importlib.util.spec_from_file_location("torch_copy", copy / "torch_policy.py")
    torch_loader = importlib.util.module_from_spec(torch_spec)
    torch_spec.loader.exec_module(torch_loader)
    for name, load in (
        ("meta.json", jax_loader.load),
        ("act.jaxexport", jax_loader.load),
        ("params.npz", jax_loader.load),
        ("torch_policy.pt", torch_loader.load),
    ):
        whole = (copy / name).read_bytes()
        (copy / name).write_bytes(whole[: len(whole) // 3])  # a truncated copy
        with pytest.raises(ValueError, match=rf"{copy / name} cannot be read as a policy file"):
            load(copy)
        (copy / name).write_bytes(whole)
    # A params file of another shape: named against the graph, not a bare shape error.
    flat = dict(np.load(copy / "params.npz"))
    first = sorted(flat)[0]
    np.savez(copy / "params.npz", **{**flat, first: np.zeros(3, np.float32)})
    with pytest.raises(ExportError, match=rf"params.npz does not fit .*saved param '{first}'"):
        load_exported(copy)  # (what `jaxrl-engine eval` plays)
    (copy / "params.npz").write_bytes(b"not a zip file")
    with pytest.raises(ExportError, match=r"params.npz is not a readable params file"):
        load_params(engine, copy)


def test_cli_export_adds_the_torch_files(trained, capsys):
    pytest.importorskip("torch")
    _, _, policy, _, _ = trained
    assert cli.main(["export", str(policy.parent)]) == 0
    assert {"torch_policy.py", "torch_policy.pt"} <= {p.name for p in policy.iterdir()}
    assert cli.main(["export", str(policy.parent / "nowhere")]) == cli.EXIT_BAD_INPUT
    assert "nowhere' does not exist" in capsys.readouterr().err
    # --factory builds modules for --checkpoint; alone it would be ignored: refused instead.
    assert cli.main(["export", str(policy.parent), "--factory", "m:f"]) == cli.EXIT_BAD_INPUT
    assert "--factory goes with --checkpoint" in capsys.readouterr().err


def test_cli_export_without_torch_names_the_extra(trained, capsys, monkeypatch):
    _, _, policy, _, _ = trained
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    assert cli.main(["export", str(policy.parent)]) == cli.EXIT_BAD_INPUT
    out, err = capsys.readouterr()
    assert out == "" and "pip install 'jaxrl-engine[torch]'" in err and "Traceback" not in err


OFF_POLICY = {
    "dqn": ["algo.name=dqn", "algo.buffer_size=256", "algo.batch_size=16"],
    "sac": ["algo.name=sac", "env.id=Pendulum-v1", "algo.buffer_size=256", "algo.batch_size=16"],
}


@pytest.mark.parametrize("overrides", OFF_POLICY.values(), ids=OFF_POLICY.keys())
def test_off_policy_artefacts_reproduce_actions_without_the_engine(overrides, tmp_path):
    from jaxrl_engine.export.policy import acting_function, export_policy

    small = ["env.num_envs=4", "eval.num_envs=4", "algo.num_steps=16", "progress=false"]
    cfg = jre.load_config(None, [*small, *overrides, "algo.hidden_sizes=[16,16]"])
    engine = jre.build(cfg)
    state = engine.init(jax.random.key(0))
    policy = export_policy(engine, state.eval_params, tmp_path / "policy")
    obs = (np.random.default_rng(1).normal(size=(100, *engine.spec.obs_shape)) * 2).astype(
        np.float32
    )
    expected = np.asarray(jax.jit(acting_function(engine))(state.eval_params, obs))
    np.save(tmp_path / "obs.npy", obs)
    imported = run_fresh(JAX_USER, tmp_path, str(policy), "obs.npy", "actions.npy")
    assert imported.strip() == "[]"
    np.testing.assert_allclose(np.load(tmp_path / "actions.npy"), expected, rtol=1e-5, atol=1e-7)
    assert len(np.unique(expected)) > 1


def test_a_policy_acting_through_a_host_callback_warns_and_finishes_the_run(tmp_path):
    pytest.importorskip("torch")
    cfg = small_config(
        "algo.torch_policy.path=universal",
        "total_env_steps=128",
        "eval.interval=1",
        tmp_path=tmp_path,
    )
    engine = jre.build(cfg)
    stale = tmp_path / cfg.name / POLICY_DIR
    stale.mkdir(parents=True)
    (stale / "act.jaxexport").write_bytes(b"an earlier run's policy")
    with pytest.warns(UserWarning, match=r"policy not exported: .*host callback"):
        _, history_summary = engine.run(engine.init(jax.random.key(0)))
        history = history_summary["records"]
    assert len(history) == 2 and (tmp_path / cfg.name / "summary.json").is_file()
    assert not (stale / "act.jaxexport").exists(), "eval would play an earlier run's policy"


def test_cli_export_from_the_latest_checkpoint(tmp_path, capsys):
    cfg = small_config("save_interval=2", tmp_path=tmp_path)  # 4 epochs: checkpoints 2 and 4
    engine = jre.build(cfg)
    state, _ = engine.run(engine.init(jax.random.key(0)))
    run_dir = tmp_path / cfg.name
    metrics = (run_dir / "metrics.jsonl").read_text()
    for path in (run_dir / POLICY_DIR).iterdir():
        path.unlink()
    assert cli.main(["export", str(run_dir)]) == cli.EXIT_BAD_INPUT
    assert "--checkpoint" in capsys.readouterr().err

    assert cli.main(["export", str(run_dir), "--checkpoint"]) == 0
    for a, b in zip(
        jax.tree.leaves(load_params(engine, run_dir / POLICY_DIR)),
        jax.tree.leaves(state.eval_params),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert (run_dir / "metrics.jsonl").read_text() == metrics  # the run is only read
    if importlib.util.find_spec("torch") is not None:
        assert (run_dir / POLICY_DIR / "torch_policy.pt").is_file()

    # policy/ cannot be written (a file in its place, as a read-only disk would): one message,
    # exit 74, the checkpoints untouched.
    shutil.rmtree(run_dir / POLICY_DIR)
    (run_dir / POLICY_DIR).write_text("not a folder")
    before = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert cli.main(["export", str(run_dir), "--checkpoint"]) == cli.EXIT_OS_ERROR
    err = capsys.readouterr().err
    assert "cannot write the exported policy" in err and "Traceback" not in err, err
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == before


FACTORY = "jaxrl_engine.interop.torch_nets:mlp"


def test_cli_export_of_a_policy_with_no_torch_form_exits_2(tmp_path, capsys):
    """A run whose network is the user's own torch module (algo.torch_policy): `export` adds
    no torch module, so it fails (exit 2, naming why) and the JAX artefact stays."""
    cfg = small_config(
        f"algo.torch_policy.factory={FACTORY}",
        "total_env_steps=128",
        tmp_path=tmp_path,
    )
    engine = jre.build(cfg)
    engine.run(engine.init(jax.random.key(0)))
    policy = tmp_path / cfg.name / POLICY_DIR
    capsys.readouterr()
    assert cli.main(["export", str(policy.parent)]) == cli.EXIT_BAD_INPUT
    out, err = capsys.readouterr()
    assert "no torch module for it; use the JAX artefact (policy.py)" in err and out == ""
    assert (policy / "policy.py").is_file() and not (policy / "torch_policy.pt").exists()
    # With --checkpoint the JAX artefact is rewritten: that part done, exit 0 with the notice.
    (policy / "act.jaxexport").unlink()
    argv = ["export", str(policy.parent), "--checkpoint", "--factory", FACTORY]
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert out.strip() == str(policy) and "no torch module for it" in err
    assert (policy / "act.jaxexport").is_file()
