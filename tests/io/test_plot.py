"""`jaxrl-engine plot`: learning curves with the expected series, as non-empty PNG/SVG files."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

import jaxrl_engine as jre
from jaxrl_engine import cli
from jaxrl_engine.io.config import dump_config
from jaxrl_engine.io.plot import group_runs, plot_runs, read_run
from tests.conftest import small_config

STEPS = [100, 200, 300]


def fake_run(root, name, returns, *overrides, wall=(1.0, 2.0, 3.0)):
    """A run directory as the driver writes it (config.yaml, metrics.jsonl), known values."""
    path = root / name
    path.mkdir()
    cfg = jre.load_config(None, [f"name={name}", *overrides])
    (path / "config.yaml").write_text(dump_config(cfg))
    lines = []
    for i, (step, ret) in enumerate(zip(STEPS, returns, strict=True)):
        record = {"epoch": i + 1, "env_steps": step, "wall_s": wall[i], "train/loss": 0.1}
        lines.append({**record, "evaluate/episode_return": ret})
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


@pytest.fixture
def runs(tmp_path):
    return [
        fake_run(tmp_path, "a_s0", [10, 20, 30], "seed=0"),
        fake_run(tmp_path, "a_s1", [30, 40, 50], "seed=1", wall=(3.0, 4.0, 5.0)),
        fake_run(tmp_path, "b_s0", [5, 6, 7], "seed=0", "algo.lr=0.001"),
    ]


def test_runs_differing_only_in_seed_are_one_group_labelled_by_what_differs(runs):
    groups = group_runs([read_run(p) for p in runs])
    assert [(label, [r.path.name for r in members]) for label, members in groups] == [
        ("algo.lr=0.0005", ["a_s0", "a_s1"]),
        ("algo.lr=0.001", ["b_s0"]),
    ]


def test_a_sweeps_seeds_are_labelled_by_the_sweep_and_same_named_runs_by_their_name(tmp_path):
    sweep = tmp_path / "ppo_minatar_asterix"
    sweep.mkdir()
    members = [fake_run(sweep, f"seed{s}", [1, 2, 3], f"seed={s}") for s in range(3)]
    ((label, grouped),) = group_runs([read_run(p) for p in members])
    assert label == "ppo_minatar_asterix" and len(grouped) == 3
    # Runs of one config trained one by one (each `name` the config's) keep that name.
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    runs = [
        fake_run(tmp_path / d, "ppo_x", [1, 2, 3], f"seed={s}") for d, s in (("a", 0), ("b", 1))
    ]
    assert [label for label, _ in group_runs([read_run(p) for p in runs])] == ["ppo_x"]


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_plot_writes_an_image_with_mean_and_spread_over_seeds(runs, tmp_path, suffix):
    out = tmp_path / f"curves{suffix}"
    fig = plot_runs(runs, out)
    assert out.stat().st_size > 5_000
    head = out.read_bytes()[:8]
    assert head == b"\x89PNG\r\n\x1a\n" if suffix == ".png" else b"<svg" in out.read_bytes()[:400]

    by_steps, by_time = fig.axes
    lines = {line.get_label(): line for line in by_steps.get_lines()}
    assert set(lines) == {"algo.lr=0.0005 (mean, min-max of 2 seeds)", "algo.lr=0.001"}
    seeds = lines["algo.lr=0.0005 (mean, min-max of 2 seeds)"]
    np.testing.assert_allclose(seeds.get_xdata(), STEPS)
    np.testing.assert_allclose(seeds.get_ydata(), [20, 30, 40])  # mean of the two seeds
    np.testing.assert_allclose(lines["algo.lr=0.001"].get_ydata(), [5, 6, 7])
    # The min-max band of the seeded group: from the lower seed to the upper one.
    (band,) = by_steps.collections
    ys = band.get_paths()[0].vertices[:, 1]
    assert ys.min() == pytest.approx(10) and ys.max() == pytest.approx(50)
    # Versus wall time: x is the mean wall time over seeds.
    time_lines = {line.get_label(): line for line in by_time.get_lines()}
    np.testing.assert_allclose(
        time_lines["algo.lr=0.0005 (mean, min-max of 2 seeds)"].get_xdata(), [2.0, 3.0, 4.0]
    )
    if suffix == ".svg":  # labels stay searchable text
        text = out.read_text()
        assert "algo.lr=0.001" in text and "env steps" in text


def test_cli_plot_of_a_real_run(tmp_path, capsys):
    cfg = small_config("total_env_steps=256", tmp_path=tmp_path)
    engine = jre.build(cfg)
    engine.run(engine.init(jax.random.key(0)))
    run_dir = tmp_path / cfg.name
    assert cli.main(["plot", str(run_dir)]) == 0
    out = run_dir / "curves.png"
    assert capsys.readouterr().out.strip() == str(out)
    assert out.stat().st_size > 5_000
    fig = plot_runs([run_dir])
    (line,) = fig.axes[0].get_lines()
    records = read_run(run_dir).records
    evals = [r for r in records if r.get("evaluate/episode_return") is not None]
    np.testing.assert_allclose(line.get_xdata(), [r["env_steps"] for r in evals])
    np.testing.assert_allclose(line.get_ydata(), [r["evaluate/episode_return"] for r in evals])


def test_cli_plot_of_several_runs_writes_into_the_first_not_the_cwd(tmp_path, capsys, monkeypatch):
    runs = []
    for lr in ("0.001", "0.002"):
        run = tmp_path / f"run{lr}"
        run.mkdir()
        (run / "config.yaml").write_text(f"name: run{lr}\nalgo:\n  lr: {lr}\n")
        lines = [{"epoch": e, "env_steps": 100 * e, "wall_s": e, "evaluate/episode_return": e}
                 for e in (1, 2)]  # fmt: skip
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
        runs.append(run)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    assert cli.main(["plot", *map(str, runs)]) == 0
    out = runs[0] / "curves_2_runs.png"
    assert capsys.readouterr().out.strip() == str(out) and out.is_file()
    assert list(cwd.iterdir()) == []


def fake_sweep(root, members, extra_rows=()):
    """A sweep's directory: sweep.json, sweep.csv naming `members`, and their run dirs."""
    root.mkdir()
    (root / "sweep.json").write_text("{}")
    for s, name in enumerate(members):
        fake_run(root, name, [s, s + 1, s + 2], f"seed={s}")
    rows = [*members, *extra_rows]
    (root / "sweep.csv").write_text("member,seed\n" + "".join(f"{m},0\n" for m in rows))
    return root


def test_cli_plot_of_a_sweep_plots_its_members_and_eval_names_one(tmp_path, capsys):
    # Rows that are not plain folder names inside the sweep (a sweep.csv is data) are skipped.
    outside = fake_run(tmp_path, "outside", [9, 9, 9])
    sweep = fake_sweep(
        tmp_path / "lr", ["seed0", "seed1"], [f"../{outside.name}", "/etc", "..", "link"]
    )
    (sweep / "link").symlink_to(outside)  # a member folder that is a link elsewhere
    assert cli.main(["plot", str(sweep)]) == 0
    assert capsys.readouterr().out.strip() == str(sweep / "curves.png")
    fig = plot_runs([sweep])
    (line,) = fig.axes[0].get_lines()
    assert line.get_label() == "lr (mean, min-max of 2 seeds)"  # not the outside run
    np.testing.assert_allclose(line.get_ydata(), [0.5, 1.5, 2.5])
    for verb in ("eval", "export"):
        assert cli.main([verb, str(sweep)]) == cli.EXIT_BAD_INPUT
        err = capsys.readouterr().err
        assert "is a sweep's directory" in err and f"e.g. {sweep / 'seed0'}" in err, err


def test_cli_plot_rejects_a_directory_without_metrics(tmp_path, capsys):
    assert cli.main(["plot", str(tmp_path)]) == cli.EXIT_BAD_INPUT
    assert "no metrics.jsonl" in capsys.readouterr().err


@pytest.mark.parametrize("config", ["garbage: [", "- a list\n", "\xff\xfe"])
def test_cli_plot_rejects_a_run_whose_config_is_not_a_config(tmp_path, capsys, config):
    """A run directory is data: a broken config.yaml is exit 2 naming it, not a traceback."""
    (tmp_path / "metrics.jsonl").write_text('{"epoch": 1, "env_steps": 8, "wall_s": 1.0}\n')
    (tmp_path / "config.yaml").write_bytes(config.encode("latin-1"))
    assert cli.main(["plot", str(tmp_path)]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "config.yaml" in err and "Traceback" not in err


def test_cli_plot_of_a_metric_no_run_logged_lists_the_ones_it_did(tmp_path, capsys):
    record = {"epoch": 1, "env_steps": 8, "wall_s": 1.0, "evaluate/episode_return": 9.0}
    (tmp_path / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    assert cli.main(["plot", str(tmp_path), "--metric", "nope/metric"]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "has no values of 'nope/metric'" in err and "evaluate/episode_return" in err, err


def write_reference(path, points, label="Brax ppo.train"):
    path.write_text(json.dumps({"label": label, "curve": points}))
    return path


def test_reference_curve_is_drawn_dashed_beside_the_runs_in_both_panels(runs, tmp_path):
    ref = write_reference(
        tmp_path / "ref.json",
        [
            {"env_steps": s, "return": r, "wall_s": w}
            for s, r, w in zip(STEPS, [1, 2, 4], [5, 6, 7], strict=True)
        ],
    )
    by_steps, by_time = plot_runs(runs, references=[ref]).axes
    line = next(x for x in by_steps.get_lines() if x.get_label() == "Brax ppo.train")
    assert line.get_linestyle() == "--"
    np.testing.assert_allclose(line.get_xdata(), STEPS)
    np.testing.assert_allclose(line.get_ydata(), [1, 2, 4])
    (time_line,) = [x for x in by_time.get_lines() if x.get_linestyle() == "--"]
    np.testing.assert_allclose(time_line.get_xdata(), [5, 6, 7])
    # Without wall times the reference is on the env-steps panel only.
    bare = write_reference(tmp_path / "bare.json", [{"env_steps": 1, "return": 2}], label="")
    by_steps, by_time = plot_runs(runs[:1], references=[bare]).axes
    assert "bare" in [x.get_label() for x in by_steps.get_lines()]  # the file's stem
    assert all(x.get_linestyle() != "--" for x in by_time.get_lines())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "not readable as JSON"),
        ('{"curve": []}', "non-empty list 'curve'"),
        ("[1, 2]", "non-empty list 'curve'"),
        ('{"curve": [{"env_steps": 1, "return": 2}, {"env_steps": 2}]}', "point 1"),
        ('{"curve": [{"env_steps": "x", "return": 2}]}', "point 0"),
    ],
)
def test_cli_plot_rejects_a_bad_reference_file_naming_it(runs, tmp_path, capsys, text, message):
    ref = tmp_path / "ref.json"
    ref.write_text(text)
    out = tmp_path / "c.png"
    assert cli.main(["plot", str(runs[0]), "--reference", str(ref), "--out", str(out)]) == (
        cli.EXIT_BAD_INPUT
    )
    err = capsys.readouterr().err
    assert message in err and "ref.json" in err
    assert not out.exists()


def test_a_run_given_twice_counts_once_and_same_seed_runs_are_not_called_seeds(runs, tmp_path):
    fig = plot_runs([runs[0], runs[1], runs[0], tmp_path / "." / "a_s1"])
    (label,) = [t.get_text() for t in fig.legends[0].get_texts()]
    assert label.endswith("(mean, min-max of 2 seeds)"), label
    again = fake_run(tmp_path, "a_s0_again", [10, 20, 30], "seed=0")  # another run, same seed
    fig = plot_runs([runs[0], runs[1], again])
    (label,) = [t.get_text() for t in fig.legends[0].get_texts()]
    assert label.endswith("(mean, min-max of 3 runs, 2 seeds)"), label


def test_cli_plot_refuses_references_on_another_metric_and_names_an_unwritable_out(
    runs, tmp_path, capsys
):
    ref = write_reference(tmp_path / "ref.json", [{"env_steps": 100, "return": 1.0}])
    argv = ["plot", str(runs[0]), "--reference", str(ref), "--metric", "train/loss"]
    assert cli.main(argv) == cli.EXIT_BAD_INPUT
    assert "reference curves are returns" in capsys.readouterr().err
    assert cli.main(["plot", str(runs[0]), "--reference", str(tmp_path / "nope.json")]) == 2
    assert "nope.json': no such file" in capsys.readouterr().err
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where a folder is needed")
    out = blocked / "sub" / "c.png"
    status = cli.main(["plot", str(runs[0]), "--out", str(out)])
    err = capsys.readouterr().err
    assert status in (cli.EXIT_BAD_INPUT, cli.EXIT_OS_ERROR) and "Traceback" not in err, err
    assert str(out.parent) in err or str(out) in err, err


def test_runs_of_two_algorithms_are_labelled_by_a_few_keys_algo_name_first(tmp_path):
    """SAC and TD3 runs differ in every algo key of each: the label names the algorithm and
    two more keys, not all of them (a legend wider than the figure squeezed the axes)."""
    env = "env.id=Pendulum-v1"
    sac = fake_run(tmp_path, "sac", [1, 2, 3], env, "algo.name=sac")
    td3 = fake_run(tmp_path, "td3", [1, 2, 4], env, "algo.name=td3")
    labels = [label for label, _ in group_runs([read_run(p) for p in (sac, td3)])]
    assert [label.split(",")[0] for label in labels] == ["algo.name=sac", "algo.name=td3"]
    assert all(label.count("=") == 3 and label.endswith(" more)") for label in labels), labels
    fig = plot_runs([sac, td3])
    assert [t.get_text() for t in fig.legends[0].get_texts()] == labels
    # Groups that only a later key tells apart keep every key.
    a = fake_run(tmp_path, "a", [1, 2, 3], env, "algo.name=sac", "algo.gamma=0.9")
    b = fake_run(tmp_path, "b", [1, 2, 3], env, "algo.name=td3", "algo.gamma=0.9")
    c = fake_run(tmp_path, "c", [1, 2, 3], env, "algo.name=td3", "algo.tau=0.01")
    labels = [label for label, _ in group_runs([read_run(p) for p in (a, b, c)])]
    assert len(set(labels)) == 3 and not any(label.endswith(" more)") for label in labels), labels


def test_a_run_of_a_users_algorithm_is_its_own_group(tmp_path):
    # Its config.yaml says algo.name=ppo (a config cannot name an algorithm given to
    # jre.build); its summary names the algorithm that trained it
    mine = fake_run(tmp_path, "mine", [1, 2, 3])
    ppo = fake_run(tmp_path, "ppo", [1, 2, 4])
    (mine / "summary.json").write_text(json.dumps({"algorithm": "a2c"}))
    (ppo / "summary.json").write_text(json.dumps({"algorithm": "ppo"}))
    groups = group_runs([read_run(p) for p in (mine, ppo)])
    assert [label for label, _ in groups] == ["algo.name=a2c", "algo.name=ppo"]
    (mine / "summary.json").write_text("[not a summary")  # (read as data: ignored)
    assert len(group_runs([read_run(p) for p in (mine, ppo)])) == 1


def test_a_killed_run_of_a_users_algorithm_is_grouped_by_its_checkpoints_algorithm(tmp_path):
    """A run killed before its summary (none written) is named by its newest checkpoint's
    metadata, read as data: not by config.yaml's algo.name (ppo)."""
    cfg = small_config("save_interval=1", tmp_path=tmp_path)
    sizes = jre.build(cfg)
    mine = jre.build(cfg, algorithm=sizes.algo._replace(name="mine"))
    mine.run(mine.init(jax.random.key(0)), num_epochs=2)
    run = tmp_path / cfg.name
    (run / "summary.json").unlink()  # (killed: the summary is the end's)
    ppo = fake_run(tmp_path, "ppo", [1, 2, 4])
    assert read_run(run).config["algo.name"] == "mine"
    assert len(group_runs([read_run(p) for p in (run, ppo)])) == 2
    for meta in (run / "checkpoints").glob("epoch_*/meta/metadata"):
        meta.write_text("[not metadata")  # (unreadable: config.yaml's name stands)
    assert read_run(run).config["algo.name"] == "ppo"


def test_a_seed_that_ends_early_stops_its_groups_curve_with_a_warning(tmp_path):
    """The curve is the mean over every run at each step, so it stops where the shortest run
    does; the points it leaves out are said, not silently dropped."""
    full = fake_run(tmp_path, "a_s0", [10, 20, 30], "seed=0")
    short = fake_run(tmp_path, "a_s1", [30, 40, 50], "seed=1")
    lines = (short / "metrics.jsonl").read_text().splitlines()
    (short / "metrics.jsonl").write_text(lines[0] + "\n")  # (a run not finished)
    with pytest.warns(UserWarning, match=r"a_s1' ends at 100 env steps.*2 later points"):
        fig = plot_runs([full, short], tmp_path / "c.png")
    (line,) = fig.axes[0].get_lines()
    np.testing.assert_allclose(line.get_xdata(), [100])
