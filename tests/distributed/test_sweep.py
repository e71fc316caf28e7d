"""Sweeps: seeds x a grid as vmapped members of one compiled program, each member equal to its
own normal run; per-member run directories, sweep.csv and the table; static keys; resume; the
CLI; the member axis sharded over the `sweep` mesh axis on 4 devices."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_engine as jre
from jaxrl_engine.distributed.mesh import sweep_devices, sweep_mesh, sweep_size, train_mesh
from jaxrl_engine.distributed.sweep import member_name, parse_seeds, plan_sweep, sweep_arguments
from jaxrl_engine.export.policy import load_params
from jaxrl_engine.io.config import MeshConfig
from jaxrl_engine.io.files import RunDirError
from jaxrl_engine.io.logging import window_record
from jaxrl_engine.run.sweep import iqm
from tests.conftest import SMALL, run_on_four_devices, small_config, subprocess_env

SEEDS = [0, 1, 2, 3]
GRID = {"algo.lr": [3e-4, 1e-3]}
# 4 epochs, evaluated every 2, checkpointed every 2 (so a resume from epoch 2 is possible).
SWEEP = ["save_interval=2", "loggers=[jsonl]"]


def members_of(root: Path) -> list[Path]:
    rows = list(csv.DictReader((root / "sweep.csv").open()))
    return [root / row["member"] for row in rows]


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def numbers(record: dict) -> np.ndarray:
    """A record's values (null: a NaN metric, as `metrics.jsonl` writes it)."""
    return np.array([np.nan if v is None else v for v in record.values()], float)


def without_wall(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """The 4 seeds x 2 learning rates sweep, run once for the module."""
    tmp = tmp_path_factory.mktemp("sweep")
    cfg = small_config(*SWEEP, "name=grid", tmp_path=tmp)
    summary = jre.sweep(cfg, seeds=SEEDS, grid=GRID)
    return summary, tmp / "grid"


def assert_member_equals_its_run(member: Path, engine, state) -> None:
    """The member's exported policy params, eval returns and records equal a normal run's."""
    params = load_params(engine, member / "policy")
    for a, b in zip(jax.tree.leaves(state.eval_params), jax.tree.leaves(params), strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-6)


def test_members_equal_their_separate_runs(swept, tmp_path):
    """Each of the 8 members equals the normal driver run (engine.run) of its own config.yaml:
    its seed, its lr. The engine is built once from a member's config.yaml (the members share
    every static key, so their engines are the same program) and runs each member's seed and
    hyperparameters."""
    summary, root = swept
    members = members_of(root)
    assert len(members) == 8 and summary["programs"] == 1
    first = jre.load_config(members[0] / "config.yaml", [f"run_dir={tmp_path}"])
    engine = jre.build(first)
    finals = set()
    for i, member in enumerate(members):
        own = jre.load_config(member / "config.yaml", [f"run_dir={tmp_path}"])
        assert own.name == member.name and own.run_dir == str(tmp_path)
        state = engine.init(jax.random.key(own.seed), jre.hparams(own))
        state, run = engine.run(state, run_dir=tmp_path / f"run{i}")
        assert_member_equals_its_run(member, engine, state)
        got = json.loads((member / "summary.json").read_text())
        assert got["status"] == "completed" and got["epochs"] == 4
        assert got["final_eval_return"] == pytest.approx(run["final_eval_return"], rel=1e-5)
        ours, theirs = without_wall(records(member)), without_wall(run["records"])
        assert [r["epoch"] for r in ours] == [1, 2, 3, 4]
        for a, b in zip(ours, theirs, strict=True):
            assert a.keys() == b.keys()
            np.testing.assert_allclose(numbers(a), numbers(b), rtol=1e-4, atol=1e-5)
        finals.add(tuple(np.asarray(jax.tree.leaves(state.eval_params)[0]).ravel()[:4]))
    assert len(finals) == 8  # every member trained something different


def test_sweep_csv_table_and_summary(swept):
    summary, root = swept
    rows = list(csv.DictReader((root / "sweep.csv").open()))
    assert len(rows) == 8
    assert list(rows[0]) == [
        "member",
        "seed",
        "algo.lr",
        "status",
        "final_eval_return",
        "epochs",
        "env_steps",
        "program",
    ]
    assert (
        rows[0]["member"] == "seed0_algo.lr=0.0003" and rows[4]["member"] == "seed0_algo.lr=0.001"
    )
    assert [int(r["seed"]) for r in rows] == SEEDS * 2
    assert {r["status"] for r in rows} == {"completed"} and {r["env_steps"] for r in rows} == {
        "256"
    }
    by_lr = {}
    for row in rows:
        by_lr.setdefault(row["algo.lr"], []).append(float(row["final_eval_return"]))
    assert [s["setting"] for s in summary["settings"]] == ["algo.lr=0.0003", "algo.lr=0.001"]
    for setting, lr in zip(summary["settings"], ("0.0003", "0.001"), strict=True):
        returns = by_lr[lr]
        assert setting["seeds"] == 4
        assert setting["mean"] == pytest.approx(np.mean(returns))
        assert setting["std"] == pytest.approx(np.std(returns, ddof=1))
        assert setting["iqm"] == pytest.approx(np.mean(sorted(returns)[1:3]))
    table = summary["table"].splitlines()
    assert table[0].split() == ["setting", "seeds", "mean", "std", "IQM"]
    assert table[1].split()[:2] == ["algo.lr=0.0003", "4"]
    assert "8 members in 1 compiled program(s)" in table[-1] and "env steps/s" in table[-1]
    stored = json.loads((root / "summary.json").read_text())
    assert stored["status"] == "completed" and stored["members"] == 8
    assert stored["env_steps"] == 8 * 256 and stored["steps_per_second"] > 0
    member_cfg = jre.load_config(root / rows[5]["member"] / "config.yaml")
    assert (member_cfg.seed, member_cfg.algo.lr, member_cfg.name) == (1, 1e-3, rows[5]["member"])
    # A member's summary reports its final evaluation as a train's does.
    member = root / rows[5]["member"]
    last = [r for r in records(member) if "evaluate/episode_return" in r][-1]
    own = json.loads((member / "summary.json").read_text())
    for key in ("", "_std", "_iqm"):
        assert own[f"final_eval_return{key}"] == last[f"evaluate/episode_return{key}"]
    assert own["final_eval_epoch"] == last["epoch"] == own["epochs"]
    assert own["eval_episodes"] == (member_cfg.eval.episodes or member_cfg.eval.num_envs)
    assert own["eval_policy"] == "deterministic"


def test_training_a_members_config_yaml_does_not_write_into_the_sweep(swept):
    _, root = swept
    member = root / "seed2_algo.lr=0.001"
    before = {p: p.read_bytes() for p in member.rglob("*") if p.is_file()}
    cfg = jre.load_config(member / "config.yaml")  # (its run_dir and name: the sweep's member)
    engine = jre.build(cfg)
    with pytest.raises(RunDirError, match=r"is inside the sweep .* train this config else"):
        engine.run(engine.init(jax.random.key(cfg.seed)))
    assert {p: p.read_bytes() for p in member.rglob("*") if p.is_file()} == before
    with pytest.raises(RunDirError, match=r"is inside the sweep"):  # a new name there too
        engine.run(engine.init(jax.random.key(cfg.seed)), run_dir=root / "mine")
    assert not (root / "mine").exists()


def test_a_members_policy_loads_and_acts(swept):
    _, root = swept
    member = root / "seed2_algo.lr=0.001"
    policy = jre.make_policy(member)
    action = policy(jnp.zeros((3, 4)))
    assert action.shape == (3,) and set(np.asarray(action).tolist()) <= {0, 1}
    assert jax.jit(policy)(jnp.ones((1, 4))).shape == (1,)


def test_resume_equals_the_uninterrupted_sweep(swept, tmp_path):
    """Stopped after its epoch-2 checkpoint, then resumed: every member as in one go."""
    _, root = swept
    part = small_config(*SWEEP, "name=grid", tmp_path=tmp_path)
    first = jre.sweep(part, seeds=SEEDS, grid=GRID, num_epochs=2)
    assert first["env_steps"] == 8 * 128
    with pytest.raises(jre.CheckpointError, match="unfinished sweep"):
        jre.sweep(part, seeds=SEEDS, grid=GRID)
    resumed = jre.resume_sweep(tmp_path / "grid")
    assert resumed["status"] == "completed" and resumed["env_steps"] == 8 * 256
    engine = jre.build(part)
    for ours, theirs in zip(members_of(tmp_path / "grid"), members_of(root), strict=True):
        assert ours.name == theirs.name
        a, b = load_params(engine, ours / "policy"), load_params(engine, theirs / "policy")
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        assert without_wall(records(ours)) == without_wall(records(theirs))
        walls = [r["wall_s"] for r in records(ours)]
        assert walls == sorted(walls)  # (a resumed member's time counts on)
    assert (tmp_path / "grid" / "sweep.csv").read_text() == (root / "sweep.csv").read_text()
    # Resuming the finished sweep again returns its summary and rewrites nothing.
    stored = (tmp_path / "grid" / "summary.json").read_text()
    again = jre.resume_sweep(tmp_path / "grid")
    assert (tmp_path / "grid" / "summary.json").read_text() == stored
    assert {k: v for k, v in again.items() if k != "table"} == json.loads(stored)


def test_a_resume_refuses_a_member_whose_records_are_gone_and_a_new_grid_clears_the_old(
    tmp_path,
):
    cfg = small_config(*SWEEP, "name=lost", tmp_path=tmp_path)
    root = tmp_path / "lost"
    jre.sweep(cfg, seeds=[0, 1], grid={"algo.lr": [3e-4]}, num_epochs=2)
    gone, kept = members_of(root)
    before = (kept / "metrics.jsonl").read_text()
    (gone / "metrics.jsonl").unlink()  # (its directory deleted or cut short)
    with pytest.raises(
        RunDirError,
        match=rf"member {gone.name}'s metrics.jsonl has its records "
        "to epoch 0, not to its group's checkpoint of epoch 2",
    ):
        jre.resume_sweep(root)
    assert (kept / "metrics.jsonl").read_text() == before  # nothing written
    # Another grid over the finished sweep: the old members and their group go, not only
    # the members of the new plan.
    (gone / "metrics.jsonl").write_text("")
    # (Two members in every sweep here, and these two programs only: each compiles once.)
    finished = small_config(*SWEEP, "name=done", tmp_path=tmp_path)
    jre.sweep(finished, seeds=[0, 1], grid={"algo.num_steps": [16, 32]}, split_static=True)
    jre.sweep(finished, seeds=[0, 1], grid={"algo.lr": [1e-3]})
    done = tmp_path / "done"
    assert sorted(p.name for p in done.iterdir() if p.is_dir()) == [
        "checkpoints",
        "seed0_algo.lr=0.001",
        "seed1_algo.lr=0.001",
    ]
    assert [p.name for p in (done / "checkpoints").iterdir()] == ["group0"]
    # ... but an unfinished group of the old sweep is refused, before anything goes.
    paused = small_config(*SWEEP, "name=paused", tmp_path=tmp_path)
    grid = {"algo.num_steps": [16, 32]}
    jre.sweep(paused, seeds=[0, 1], grid=grid, split_static=True, num_epochs=1)
    shutil.rmtree(tmp_path / "paused" / "checkpoints" / "group0")  # (only group1 unfinished)
    with pytest.raises(jre.CheckpointError, match=r"unfinished sweep \(group1: checkpoint of"):
        jre.sweep(paused, seeds=[0, 1], grid={"algo.lr": [1e-3]})
    assert (tmp_path / "paused" / "checkpoints" / "group1").is_dir()


def test_a_static_key_in_the_grid_is_refused_naming_it(tmp_path):
    cfg = small_config(tmp_path=tmp_path)
    with pytest.raises(jre.ConfigError, match=r"'algo\.num_steps': static") as e:
        plan_sweep(cfg, [0], {"algo.lr": [1e-3, 3e-4], "algo.num_steps": [16, 32]})
    assert "--split-static" in str(e.value) and "algo.lr" in str(e.value)
    for key, fragment in [
        ("seed", "seeds=..."),
        ("name", "one value"),
        ("mesh.sweep", "one value"),
        ("algo.nonsense", "unknown config key 'algo.nonsense'"),
    ]:
        with pytest.raises(jre.ConfigError, match=fragment.replace(".", r"\.")):
            plan_sweep(cfg, [0], {key: [1, 2]})
    with pytest.raises(jre.ConfigError, match="repeats a value"):
        plan_sweep(cfg, [0], {"algo.lr": [1e-3, 1e-3]})
    with pytest.raises(jre.ConfigError, match=r"algo\.gamma: 1 and 1\.0 are one value"):
        plan_sweep(cfg, [0], {"algo.gamma": [1, 1.0]})  # (one member trained twice)
    with pytest.raises(jre.ConfigError, match=r"'env\.suite'.*host"):
        plan_sweep(small_config("env.suite=gymnasium", "env.id=CartPole-v1"), [0])
    with pytest.raises(jre.ConfigError, match="'offload'"):
        plan_sweep(small_config("offload=true"), [0])


def test_split_static_runs_one_program_per_setting_each_equal_to_its_run(tmp_path):
    cfg = small_config("loggers=[jsonl]", "name=split", "save_interval=0", tmp_path=tmp_path)
    grid = {"algo.num_steps": [16, 32]}
    plan = plan_sweep(cfg, [5], grid, split_static=True)
    assert [[m.name for m in g] for g in plan.groups] == [
        ["seed5_algo.num_steps=16"],
        ["seed5_algo.num_steps=32"],
    ]
    summary = jre.sweep(cfg, seeds=[5], grid=grid, split_static=True)
    assert summary["programs"] == 2
    for member in members_of(tmp_path / "split"):
        own = jre.load_config(member / "config.yaml", [f"run_dir={tmp_path}/own"])
        engine = jre.build(own)
        state, run = engine.run(engine.init(jax.random.key(5)))
        assert_member_equals_its_run(member, engine, state)
        got = json.loads((member / "summary.json").read_text())
        assert got["final_eval_return"] == pytest.approx(run["final_eval_return"], rel=1e-5)


def test_seeds_names_and_cli_items():
    assert parse_seeds("0..3") == [0, 1, 2, 3] and parse_seeds("[0,3,5]") == [0, 3, 5]
    assert parse_seeds(7) == [7]
    assert parse_seeds(np.arange(3)) == [0, 1, 2] and parse_seeds(np.int64(4)) == [4]
    assert parse_seeds(jnp.arange(2)) == [0, 1] and type(parse_seeds(np.arange(1))[0]) is int
    for bad in ("3..1", "[1,1]", "x", [-1], 1.5, np.array([[0, 1]])):
        with pytest.raises(jre.ConfigError, match="seeds"):
            parse_seeds(bad)
    assert member_name(0, {"algo.lr": 3e-4}, 0, set()) == "seed0_algo.lr=0.0003"
    assert member_name(1, {"env.id": "a/b c"}, 3, set()) == "seed1_env.id=a_b_c"
    assert member_name(1, {"k": "x" * 300}, 3, set()) == "member3_seed1"
    base = small_config()
    seeds, grid, overrides = sweep_arguments(
        ["seeds=0..2", "algo.lr=[1e-4,3e-4]", "algo.hidden_sizes=[8,8]", "algo.gamma=0.9"], base
    )
    assert seeds == "0..2" and grid == {"algo.lr": [1e-4, 3e-4]}
    assert overrides == ["algo.hidden_sizes=[8,8]", "algo.gamma=0.9"]
    _, grid, _ = sweep_arguments(["algo.hidden_sizes=[[8],[16,16]]"], base)
    assert grid == {"algo.hidden_sizes": [[8], [16, 16]]}
    _, grid, overrides = sweep_arguments(["algo.lr=0.1", "algo.lr=[1,2]", "algo.gamma=[1]"], base)
    assert grid == {"algo.lr": [1, 2], "algo.gamma": [1]} and overrides == []
    _, grid, overrides = sweep_arguments(["algo.lr=[1,2]", "algo.lr=0.1"], base)
    assert grid == {} and overrides == ["algo.lr=0.1"]
    assert iqm([1, 2, 3, 100]) == 2.5 and iqm([4.0]) == 4.0


def test_traced_keys_are_the_hparams_leaves():
    """What a sweep may trace is exactly what the algorithm carries in its HParams pytree."""
    from jaxrl_engine import algos

    for name, config_class in algos.ALGORITHMS.items():
        fields = set(getattr(algos, f"{name.upper()}HParams").__dataclass_fields__)
        assert set(config_class.traced_keys) == fields, name
        assert fields <= set(config_class.model_fields), name


def test_mesh_sizes_are_checked_naming_the_keys():
    four = [SimpleNamespace(process_index=0)] * 4  # every error is raised before a Mesh
    with pytest.raises(jre.ConfigError, match=r"mesh.sweep=3 x mesh.data=2 needs 6 devices, 4"):
        sweep_mesh(MeshConfig(sweep=3, data=2), 6, four)
    with pytest.raises(jre.ConfigError, match=r"mesh.sweep=3 must divide the 8 members"):
        sweep_mesh(MeshConfig(sweep=3), 8, four)
    with pytest.raises(jre.ConfigError, match=r"mesh.data=8 needs 8 devices, 4 are visible"):
        train_mesh(MeshConfig(data=8), four)
    assert [sweep_size(m, 4) for m in (8, 6, 5, 1)] == [4, 3, 1, 1]
    assert sweep_mesh(MeshConfig(), 8).shape == {"sweep": 1, "data": 1}
    # Two processes of two devices: 5 members fit one device only (of process 0), and the
    # process left without a member failed its first collective, then the job hung.
    two_by_two = [SimpleNamespace(process_index=i // 2, id=i) for i in range(4)]
    with pytest.raises(jre.ConfigError, match=r"5 members cannot be spread evenly over the job"):
        sweep_mesh(MeshConfig(), 5, two_by_two)
    # 2 members: one device of each process (the first two devices are both process 0's).
    chosen, sweep, data = sweep_devices(MeshConfig(), 2, two_by_two)
    assert [d.id for d in chosen] == [0, 2] and (sweep, data) == (2, 1)
    chosen, sweep, data = sweep_devices(MeshConfig(), 8, two_by_two)
    assert [d.id for d in chosen] == [0, 1, 2, 3] and sweep == 4
    chosen, _, _ = sweep_devices(MeshConfig(data=2), 2, two_by_two)  # data within a process
    assert [d.id for d in chosen] == [0, 1, 2, 3]


def test_cli_sweep_end_to_end(tmp_path):
    """`jaxrl-engine sweep` in a subprocess: the table, the JSON last line, exit 0; a static key
    in the grid exits 2 naming it."""
    cli = [sys.executable, "-m", "jaxrl_engine.cli", "sweep", *SMALL, f"run_dir={tmp_path}"]
    root = Path(__file__).resolve().parents[2]
    env = subprocess_env()  # one device
    bad = subprocess.run(
        [*cli, "algo.num_steps=[16,32]"], capture_output=True, text=True, cwd=root, env=env
    )
    assert bad.returncode == 2 and "'algo.num_steps': static" in bad.stderr, bad.stderr
    proc = subprocess.run(
        [*cli, "name=cli", "seeds=0..1", "algo.lr=[1e-3,3e-4]", "algo.gamma=0.98", "progress=true"],
        capture_output=True,
        text=True,
        cwd=root,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    summary = json.loads(lines[-1])
    assert summary["status"] == "completed" and summary["members"] == 4
    assert lines[0].split() == ["setting", "seeds", "mean", "std", "IQM"]
    assert lines[1].split()[:2] == ["algo.lr=0.001", "2"] and lines[2].startswith("algo.lr=0.0003")
    member = jre.load_config(tmp_path / "cli" / "seed1_algo.lr=0.0003" / "config.yaml")
    assert (member.seed, member.algo.lr, member.algo.gamma) == (1, 3e-4, 0.98)
    assert "4 members: epoch 4/4" in proc.stderr  # plain progress lines (not a terminal)


FOUR_DEVICES = textwrap.dedent(
    """
    import json, sys, jax, numpy as np
    import jaxrl_engine as jre
    from jaxrl_engine.distributed.mesh import sweep_mesh
    from jaxrl_engine.distributed.sweep import SweepPrograms, plan_sweep
    from jaxrl_engine.export.policy import load_params
    from jaxrl_engine.core.sharding import data_mesh
    from tests.conftest import small_config
    tmp = sys.argv[1]
    assert len(jax.devices()) == 4
    grid = {"algo.lr": [3e-4, 1e-3]}
    base = ["loggers=[jsonl]", "save_interval=0", "env.num_envs=8", "eval.num_envs=8",
            f"run_dir={tmp}"]
    cfg = small_config(*base, "name=four")
    members = plan_sweep(cfg, [0, 1], grid).members
    mesh = sweep_mesh(cfg.mesh, len(members))
    engine = jre.build(members[0].cfg, mesh=data_mesh(list(mesh.devices[0])))
    programs = SweepPrograms(engine, mesh, len(members))
    state = programs.init([m.seed for m in members],
                          [m.cfg.algo.hparams(engine.spec) for m in members])
    kernel = jax.tree.leaves(state.train.params)[0]
    out = dict(mesh=dict(mesh.shape), params_spec=str(kernel.sharding.spec),
               obs_spec=str(state.env.obs.sharding.spec),
               devices=len(kernel.sharding.device_set),
               per_device=[s.data.shape[0] for s in kernel.addressable_shards])
    runs = {}
    for name, mesh_items in (("four", []), ("one", ["mesh.sweep=1"]),
                             ("two_by_two", ["mesh.sweep=2", "mesh.data=2"])):
        c = small_config(*base, f"name={name}", *mesh_items)
        runs[name] = jre.sweep(c, seeds=[0, 1], grid=grid)
    params = {}
    for name in runs:
        params[name] = [
            np.concatenate([np.ravel(x) for x in jax.tree.leaves(
                load_params(engine, f"{tmp}/{name}/{m.name}/policy"))]).tolist()
            for m in members
        ]
    out["params"] = params
    out["finals"] = {n: [json.load(open(f"{tmp}/{n}/{m.name}/summary.json"))["final_eval_return"]
                         for m in members] for n in runs}
    errors = []
    for items in (["mesh.sweep=3", "mesh.data=2"], ["mesh.sweep=3"], ["mesh.data=8"]):
        try:
            jre.sweep(small_config(*base, "name=bad", *items), seeds=[0, 1], grid=grid)
        except jre.ConfigError as e:
            errors.append(str(e))
    try:
        jre.build(small_config(*base, "mesh.data=8"))
    except jre.ConfigError as e:
        errors.append(str(e))
    out["errors"] = errors
    print(json.dumps(out))
    """
)


@pytest.mark.multidevice
def test_members_are_sharded_over_the_sweep_axis_with_one_devices_results(tmp_path):
    out = run_on_four_devices(FOUR_DEVICES, str(tmp_path))
    assert out["mesh"] == {"sweep": 4, "data": 1}
    assert out["params_spec"] == "P('sweep',)" and out["obs_spec"] == "P('sweep', 'data')"
    assert out["devices"] == 4 and out["per_device"] == [1, 1, 1, 1]
    for name in ("four", "two_by_two"):
        for a, b in zip(out["params"]["one"], out["params"][name], strict=True):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-5)
        assert out["finals"][name] == pytest.approx(out["finals"]["one"], rel=1e-4)
    assert len({tuple(p[:8]) for p in out["params"]["one"]}) == 4
    assert out["errors"] == [
        "mesh.sweep=3 x mesh.data=2 needs 6 devices, 4 are visible",
        "mesh.sweep=3 must divide the 4 members of each compiled program (members are sharded "
        "evenly, not padded): choose a divisor, or leave mesh.sweep null to pick the largest "
        "that fits the devices",
        "mesh.data=8 needs 8 devices, 4 are visible",
        "mesh.data=8 needs 8 devices, 4 are visible (leave mesh.data null to use them all)",
    ]


def test_log_interval_thins_each_members_records_and_a_resume_keeps_them(tmp_path):
    """Members log one record per window (`log_interval=4`), closed by the sweep's checkpoint
    (6) and the pause (7) too; stopped at 7 and resumed, each record is the window's
    `window_record` over the same sweep's records logged every epoch."""
    common = ["total_env_steps=768", "eval.interval=10", "save_interval=6", "loggers=[jsonl]"]
    every = small_config(*common, "name=every", tmp_path=tmp_path)
    jre.sweep(every, seeds=[0, 1])
    thin = small_config(*common, "log_interval=4", "name=thin", tmp_path=tmp_path)
    jre.sweep(thin, seeds=[0, 1], num_epochs=7)
    assert jre.resume_sweep(tmp_path / "thin")["status"] == "completed"
    windows = [(1, 4), (5, 6), (7, 7), (8, 8), (9, 10), (11, 12)]
    for ours, theirs in zip(
        members_of(tmp_path / "thin"), members_of(tmp_path / "every"), strict=True
    ):
        full = {  # (null in metrics.jsonl: a NaN metric, as the run logged it)
            r["epoch"]: {k: np.nan if v is None else v for k, v in r.items()}
            for r in records(theirs)
        }
        assert sorted(full) == list(range(1, 13))
        written = records(ours)
        assert [r["epoch"] for r in written] == [hi for _, hi in windows]
        for record, (lo, hi) in zip(written, windows, strict=True):
            want = window_record([full[e] for e in range(lo, hi + 1)])
            want = {k: v for k, v in want.items() if k != "wall_s"}
            got = {k: record[k] for k in want}
            extra = {k for k in record if k not in want and k != "wall_s"}
            # (the paused call evaluated after its last epoch, 7; the other sweep did not)
            assert all(k.startswith("evaluate/") for k in extra) and bool(extra) == (hi == 7)
            np.testing.assert_allclose(numbers(got), numbers(want), rtol=1e-6)
