"""README sections that must stay true: the hook catalogue, the benchmark figures and the
add-an-env guide, whose code is run as it stands."""

from __future__ import annotations

import inspect
import re
import shutil
import sys
import types
from pathlib import Path

import pytest

from jaxrl_engine.core import hooks, nan_guard, offload, timing

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _section(title: str) -> str:
    start = README.index(title)
    end = README.find("\n## ", start + len(title))
    return README[start : end if end != -1 else None]


def test_hook_catalogue_lists_every_hook_factory():
    catalogue = _section("### Hook catalogue")
    factories = [
        name
        for module in (hooks, nan_guard, offload, timing)
        for name, fn in inspect.getmembers(module, inspect.isfunction)
        if fn.__module__ == module.__name__
        and not name.startswith("_")
        and inspect.signature(fn).return_annotation in ("Hook", hooks.Hook)
    ]
    assert {"chain", "every", "nan_guard", "offload_after", "reload_before", "timed"} <= set(
        factories
    )
    for name in factories:
        assert f"| `{name}(" in catalogue, f"hook {name} missing from the README's catalogue"


def test_benchmark_figures_are_the_ones_in_results_md():
    results = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    table = _section("## Benchmarks")
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert rows
    for row in rows:
        command = re.search(r"`(\.venv/bin/python benchmarks/[^`]+)`", row)
        if command:
            assert command.group(1) in results
        for figure in re.findall(r"\d[\d,]*\.\d+|\d{1,3}(?:,\d{3})+", row):
            assert figure in results, f"README figure {figure} is not in benchmarks/RESULTS.md"


def test_the_comparison_quotes_figures_from_results_md():
    """The section "Why this engine" cites measured figures: each is in RESULTS.md, and so is each
    benchmark script it names."""
    results = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    section = _section("## Why this engine")
    figures = re.findall(r"\d[\d,]*\.\d+x?|\d{1,3}(?:,\d{3})+", section)
    assert len(figures) >= 8, figures
    for figure in figures:
        assert figure in results, f"README figure {figure} is not in benchmarks/RESULTS.md"
    for script in re.findall(r"`(benchmarks/\w+\.(?:py|sh))`", section):
        assert (ROOT / script).is_file() and script in results, script


def _subsection(title: str) -> str:
    """From `title` to the next heading of level 2 or 3."""
    start = README.index(title)
    following = re.compile(r"^#{2,3} ", re.MULTILINE).search(README, start + len(title))
    return README[start : following.start() if following else None]


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", text, flags=re.DOTALL | re.MULTILINE)


@pytest.mark.slow
def test_the_library_and_sweep_snippets_run_in_order_after_the_train_command(tmp_path, monkeypatch):
    """A fresh directory holding what a clone holds (`configs/`): the README's first command,
    then its "Use it as a library" and "Sweeps" Python blocks in order, in one namespace, as
    written but for a shorter budget (`total_env_steps` added to each config they load)."""
    from jaxrl_engine import cli

    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    monkeypatch.chdir(tmp_path)
    budget = ["total_env_steps=2048", "progress=false"]  # 2 epochs of 16 envs x 128 steps
    assert cli.main(["train", *budget]) == 0  # the README's first command (runs/ppo_cartpole)
    blocks = _python_blocks(_section("## Use it as a library")) + _python_blocks(
        _section("## Sweeps: seeds x hyperparameters")
    )
    assert len(blocks) == 2
    source = "\n".join(blocks)
    shortened = source.replace("overrides=[", f"overrides=[{', '.join(map(repr, budget))}, ")
    assert shortened.count("total_env_steps=2048") == source.count("overrides=[") == 2
    namespace: dict = {"__name__": "readme_library"}
    exec(compile(shortened, "README.md (library, sweeps)", "exec"), namespace)
    assert namespace["summary"]["members"] == 48
    assert (tmp_path / "runs" / "lib_demo" / "summary.json").is_file()
    assert (tmp_path / "runs" / "ppo_cartpole" / "summary.json").is_file()  # left as it was


def test_add_an_env_guide_trains_its_env_to_the_optimum(tmp_path, monkeypatch):
    blocks = _python_blocks(_subsection("### Add an env"))
    assert blocks, "no python block under '### Add an env'"
    monkeypatch.chdir(tmp_path)  # the guide's run directory (runs/corridor) lands here
    # A fresh module to run in: dataclasses look their class's module up in sys.modules.
    guide = types.ModuleType("readme_add_an_env")
    monkeypatch.setitem(sys.modules, guide.__name__, guide)
    exec(compile("\n".join(blocks), "README.md (Add an env)", "exec"), guide.__dict__)

    summary = guide.summary
    params = guide.Corridor.params
    assert summary["status"] == "completed"
    # The only reward is 1 for reaching the last cell, so 1.0 is the optimum: every (greedy)
    # evaluation episode gets there, and in the fewest steps, length - 1 moves to the right.
    assert summary["final_eval_return"] == 1.0
    assert summary["records"][-1]["evaluate/episode_length"] == params.length - 1
    assert summary["env_steps"] >= 20000
    assert (tmp_path / "runs" / "corridor" / "policy" / "params.npz").is_file()
    assert summary["wall_s"] < 60, f"the guide's run took {summary['wall_s']:.0f} s"


def test_own_network_guide_trains_its_network_in_its_wrapped_env(tmp_path, monkeypatch):
    blocks = _python_blocks(_subsection("### Your own network, or a gymnax env wrapped"))
    assert len(blocks) == 1
    monkeypatch.chdir(tmp_path)
    guide = types.ModuleType("readme_own_network")
    monkeypatch.setitem(sys.modules, guide.__name__, guide)
    exec(compile(blocks[0], "README.md (own network)", "exec"), guide.__dict__)

    summary, state = guide.summary, guide.state
    assert summary["status"] == "completed"
    # The user's network was trained (its own layer names), and the wrapper's scale applies:
    # a return is 0.1 per step survived, and the policy learned to survive.
    assert set(state.train.params["params"]) == {"Dense_0", "Dense_1", "Dense_2", "Dense_3"}
    length = summary["records"][-1]["evaluate/episode_length"]
    assert summary["final_eval_return"] == pytest.approx(0.1 * length, rel=1e-4)
    assert length > 50
