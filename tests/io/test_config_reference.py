"""The README's config reference is what the live schema generates, and names every key."""

from __future__ import annotations

from pathlib import Path

from jaxrl_engine.io import config_reference
from tests.io.test_config import KEYS

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_config_reference_matches_the_schema():
    held = config_reference.section(README.read_text())
    assert held is not None, "README.md lost the config reference markers"
    assert held == config_reference.reference(), (
        "README.md's config reference is stale: run "
        "python -m jaxrl_engine.io.config_reference --write README.md"
    )


def test_reference_lists_every_key_with_its_default():
    text = config_reference.reference()
    for key in KEYS:
        assert f"| `{key}` |" in text, f"config key {key} missing from the reference"
    assert "| `algo.lr` | float | `0.0005` |" in text
    assert "| `env.num_envs` | int | `16` | parallel envs in rollout" in text


def test_update_rewrites_only_the_marked_section(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(
        f"# x\nbefore\n{config_reference.BEGIN}\nold\n{config_reference.END}\nafter\n"
    )
    assert config_reference.main(["--check", str(readme)]) == 1
    assert config_reference.main(["--write", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("# x\nbefore\n") and text.endswith(f"{config_reference.END}\nafter\n")
    assert config_reference.section(text) == config_reference.reference()
    assert config_reference.main(["--check", str(readme)]) == 0


def test_without_write_it_prints_and_changes_no_file(tmp_path, capsys, monkeypatch):
    readme = tmp_path / "README.md"
    readme.write_text(f"{config_reference.BEGIN}\nold\n{config_reference.END}\n")
    monkeypatch.chdir(tmp_path)
    assert config_reference.main([]) == 0
    assert capsys.readouterr().out == config_reference.reference()
    assert "old" in readme.read_text()
