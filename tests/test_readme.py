"""README sections that must stay true: the hook catalogue and the benchmark figures."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from jaxrl_engine.core import hooks

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
        for name, fn in inspect.getmembers(hooks, inspect.isfunction)
        if fn.__module__ == hooks.__name__
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
