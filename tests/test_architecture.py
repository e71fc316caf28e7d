"""Architecture tests: the package's import graph, read with `ast` (nothing is imported).

The intended layering, front to back (a layer imports only layers to its right):

    cli, policy -> compose -> run, export -> algos, envs, interop, io -> core (+ buffers)

What is enforced today (extend ALLOWED_IMPORTS / FORBIDDEN_IMPORTS to enforce more):
- no import cycle between any two modules of `jaxrl_engine`, but the deliberate one of
  `algos.configs` (below, LAZY_EDGES);
- `core` imports only `core` and the fixed-shape `buffers`;
- `algos` knows neither torch (`interop`), the driver (`run`, `compose`), nor files and the front
  ends (`export`, `cli`, `policy`).

Every import statement counts, wherever it sits (inside functions, under `if TYPE_CHECKING:`):
a hidden import is still a dependency. `from pkg import name` depends on `pkg/__init__.py`, or on
the submodule `pkg.name` where one exists. No implicit edge is added for the parent packages that
Python also executes on `import a.b.c`.
"""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

PACKAGE = "jaxrl_engine"
PACKAGE_DIR = Path(__file__).resolve().parents[1] / PACKAGE

# Every module of the package: dotted name -> source file (a package is its `__init__.py`).
MODULES: dict[str, Path] = {
    ".".join(p.relative_to(PACKAGE_DIR.parent).with_suffix("").parts).removesuffix(".__init__"): p
    for p in sorted(PACKAGE_DIR.rglob("*.py"))
}

# Rule: modules under the key may import, within the package, only modules under these prefixes.
ALLOWED_IMPORTS: dict[str, tuple[str, ...]] = {
    "jaxrl_engine.core": ("jaxrl_engine.core", "jaxrl_engine.buffers"),
}
# Rule: modules under the key may not import any module under these prefixes.
FORBIDDEN_IMPORTS: dict[str, tuple[str, ...]] = {
    "jaxrl_engine.algos": tuple(
        f"jaxrl_engine.{m}" for m in ("interop", "run", "compose", "export", "cli", "policy")
    ),
}

# The one deliberate cycle: `algos.configs` holds the config classes without JAX and imports
# each algorithm's module only inside the methods that build it (`hparams`, `build`, `replay`),
# while the algorithm modules import (and re-export) their config classes from it. These edges
# are left out of the cycle check; test_configs_import_algorithms_only_when_building checks that
# they stay inside functions, so that importing `algos.configs` never imports them.
CONFIGS = "jaxrl_engine.algos.configs"
LAZY_EDGES = {
    (CONFIGS, f"jaxrl_engine.algos.{m}") for m in ("ppo", "off_policy", "dqn", "sac", "td3")
}


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _known(name: str, modules) -> str | None:
    """The longest prefix of dotted `name` that is a module of the package, else None."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in modules:
            return ".".join(parts[:i])
    return None


def imports_of(module: str, source: str, modules, is_package: bool) -> set[str]:
    """The package modules that `module` imports anywhere in `source`."""
    found: set[str | None] = set()  # None: not a module of the package
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(filter(None, (_known(a.name, modules) for a in node.names)))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".") if is_package else module.split(".")[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else _known(base, modules))
    return {m for m in found if m is not None and m != module}


def build_graph() -> dict[str, set[str]]:
    return {
        name: imports_of(name, path.read_text(), MODULES, path.name == "__init__.py")
        for name, path in MODULES.items()
    }


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One shortest cycle (a chain `a, b, ..., a`) per strongly connected component (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    sccs: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = {stack.pop()}
            while v not in scc:
                scc.add(stack.pop())
            sccs.append(scc)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    cycles = []
    for scc in sccs:
        start = min(scc)
        if len(scc) == 1 and start not in graph.get(start, ()):
            continue
        parent: dict[str, str] = {}
        queue = deque([start])
        while queue:  # breadth-first from `start` back to itself, inside the component
            v = queue.popleft()
            if start in graph[v]:
                chain = [v]
                while chain[-1] != start:
                    chain.append(parent[chain[-1]])
                cycles.append([*reversed(chain), start])
                break
            for w in sorted(graph[v] & scc):
                if w not in parent and w != start:
                    parent[w] = v
                    queue.append(w)
    return sorted(cycles)


def _violations(graph, rule: dict[str, tuple[str, ...]], allowed: bool) -> list[str]:
    return sorted(
        f"{src} -> {dst}"
        for layer, prefixes in rule.items()
        for src, deps in graph.items()
        if _under(src, layer)
        for dst in deps
        if any(_under(dst, p) for p in prefixes) != allowed
    )


def test_no_import_cycles():
    graph = build_graph()
    for src, dst in LAZY_EDGES:
        graph[src].discard(dst)
    cycles = find_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_core_imports_only_core_and_buffers():
    bad = _violations(build_graph(), ALLOWED_IMPORTS, allowed=True)
    assert not bad, "core imports outside core/buffers:\n" + "\n".join(bad)


def test_algos_do_not_import_driver_torch_or_files():
    bad = _violations(build_graph(), FORBIDDEN_IMPORTS, allowed=False)
    assert not bad, "forbidden imports from algos:\n" + "\n".join(bad)


def test_graph_builder_is_not_vacuous():
    graph = build_graph()
    assert len(graph) >= 30, sorted(graph)
    assert "jaxrl_engine.core.phases" in graph["jaxrl_engine.core.engine"]
    mods = {"p", "p.a", "p.a.b", "p.c"}
    src = "from . import b\nfrom .. import c\ndef f():\n    from p.a import X\n    import p.a.b"
    assert imports_of("p.a", src, mods, is_package=True) == {"p.a.b", "p.c"}
    assert imports_of("p.a.b", "from . import Y\nfrom ..c import Z", mods, False) == {"p.a", "p.c"}


def test_cycle_finder_on_a_hand_made_graph():
    graph = {"a": {"b"}, "b": {"c", "d"}, "c": {"a"}, "d": set(), "e": {"e"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"], ["e", "e"]]
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def _module_level_imports(source: str) -> set[str]:
    """Modules of the package a source imports when it is executed: imports at module or class
    level, not those inside functions or under `if TYPE_CHECKING:`."""

    def statements(body):
        for node in body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                yield node
            elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                yield from statements(node.orelse)
            elif isinstance(node, ast.If | ast.Try | ast.ClassDef | ast.With):
                for block in ("body", "orelse", "finalbody"):
                    yield from statements(getattr(node, block, []))
                for handler in getattr(node, "handlers", []):
                    yield from statements(handler.body)

    tree = ast.Module(body=list(statements(ast.parse(source).body)), type_ignores=[])
    return imports_of(CONFIGS, ast.unparse(tree), MODULES, is_package=False)


def test_configs_import_algorithms_only_when_building():
    graph = build_graph()
    assert {dst for src, dst in LAZY_EDGES} <= graph[CONFIGS]  # the exemption is not stale
    eager = _module_level_imports(MODULES[CONFIGS].read_text())
    assert eager == {"jaxrl_engine.algos.torso", "jaxrl_engine.io.schema"}, sorted(eager)
    source = (
        "import jaxrl_engine.io.schema\nif TYPE_CHECKING:\n    import jaxrl_engine.algos.ppo\n"
        "class C:\n    import jaxrl_engine.io.files\n    def f(self):\n"
        "        import jaxrl_engine.algos.dqn"
    )
    assert _module_level_imports(source) == {"jaxrl_engine.io.schema", "jaxrl_engine.io.files"}
