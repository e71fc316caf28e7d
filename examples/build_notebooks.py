"""Write each notebook `examples/<name>.ipynb` from its plain-script twin `examples/<name>.py`.

The scripts are the source (reviewed, linted, runnable with `python examples/<name>.py`); their
cells are marked `# %%` (code) and `# %% [markdown]` (markdown: comment lines, `# ` stripped),
the percent format that VS Code, Spyder and jupytext read. Notebooks are written without outputs;
tests/examples/test_notebooks.py checks that each one matches its script and executes it.

    .venv/bin/python examples/build_notebooks.py          # rewrite every notebook
    .venv/bin/python examples/build_notebooks.py --check  # exit 1 if one is out of date
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

EXAMPLES = Path(__file__).resolve().parent
MARKER = "# %%"


def notebook_scripts() -> list[Path]:
    """The scripts that have a notebook twin: those written in cells (first line `# %%...`)."""
    return sorted(p for p in EXAMPLES.glob("*.py") if p.read_text().startswith(MARKER))


def cells(script: str) -> list[tuple[str, str]]:
    """[(kind, source)] of a percent-format script; kind is "code" or "markdown"."""
    found: list[tuple[str, list[str]]] = []
    for line in script.splitlines():
        if line.startswith(MARKER):
            found.append(("markdown" if "[markdown]" in line else "code", []))
        elif found:
            found[-1][1].append(line)
    out = []
    for kind, lines in found:
        if kind == "markdown":
            lines = [line.removeprefix("#").removeprefix(" ") for line in lines]
        text = "\n".join(lines).strip("\n")
        if text:
            out.append((kind, text))
    return out


def notebook(script: Path) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    nb.cells = [
        nbformat.v4.new_markdown_cell(src) if kind == "markdown" else nbformat.v4.new_code_cell(src)
        for kind, src in cells(script.read_text())
    ]
    for i, cell in enumerate(nb.cells):  # stable ids: rebuilding gives the same file
        cell.id = f"{script.stem}-{i}"
    return nb


def render(script: Path) -> str:
    return nbformat.writes(notebook(script)) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check, write nothing")
    args = parser.parse_args(argv)
    stale = []
    for script in notebook_scripts():
        target = script.with_suffix(".ipynb")
        text = render(script)
        if not target.is_file() or target.read_text() != text:
            stale.append(target.name)
            if not args.check:
                target.write_text(text)
    if stale:
        print(("out of date: " if args.check else "wrote: ") + ", ".join(stale))
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
