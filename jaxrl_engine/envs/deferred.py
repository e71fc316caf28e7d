"""Defer the plotting libraries that gymnax imports only to render.

`import gymnax` imports every gymnax environment, and five of them (Pong, Catch, Rooms,
PointRobot, MetaMaze) import `matplotlib.pyplot` and `seaborn` at module level for their
`render` methods alone: 2.1 s of a fresh process's start-up on a quiet 2-core VM
(benchmarks/RESULTS.md). While gymnax is imported, `deferred_imports` puts a stand-in
for each such module in `sys.modules`; the stand-in imports the real module the first time an
attribute of it is used (a `render` call), and is gone from `sys.modules` once gymnax is in, so
every other `import matplotlib.pyplot` gets the real module.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Iterator
from typing import Any


class DeferredModule(types.ModuleType):
    """A module that imports the real one on its first attribute use, then forwards to it."""

    def __init__(self, name: str):
        super().__init__(name)
        # The import system reads `__spec__` of a module it finds in sys.modules.
        self.__spec__ = importlib.machinery.ModuleSpec(name, None)

    def _real(self) -> types.ModuleType:
        name = self.__name__
        if sys.modules.get(name) is self:
            del sys.modules[name]
        return importlib.import_module(name)

    def __getattr__(self, attr: str) -> Any:  # only attributes this stand-in lacks
        return getattr(self._real(), attr)

    def __setattr__(self, attr: str, value: Any) -> None:
        if attr.startswith("__") and attr.endswith("__"):
            super().__setattr__(attr, value)
        else:
            setattr(self._real(), attr, value)


@contextlib.contextmanager
def deferred_imports(*names: str) -> Iterator[None]:
    """Within the block, `import NAME` of each installed, not yet imported module gives a
    `DeferredModule`; after it, sys.modules holds the real modules only."""
    placed: list[str] = []
    for name in names:
        if name in sys.modules or not _installed(name):
            continue  # already real, or not installed: the import fails as it would have
        sys.modules[name] = DeferredModule(name)
        placed.append(name)
    try:
        yield
    finally:
        for name in placed:
            if isinstance(sys.modules.get(name), DeferredModule):
                del sys.modules[name]


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None  # imports a dotted name's parents
    except ModuleNotFoundError:  # a parent package is missing
        return False
