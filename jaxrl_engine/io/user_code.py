"""The user's own modules, named in a config: imported as `python -m` would find them.

The `jaxrl-engine` command does not put the current directory on `sys.path` (a console script
runs from its own folder), so `mynets:make` or `my_envs:Corridor-v0` next to the user would not
be found; these helpers try the installed module first, then the current directory. They are
for what the user names (overrides, their own config file); a run directory's config is data,
and `io.config.check_env_modules` refuses to import what it names on its word.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Iterator
from typing import Any


def import_from_here(module_name: str) -> Any:
    """`import module_name`, and when its top-level package is not found, again with the
    current directory first on the path."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        top = module_name.split(".")[0]
        here = os.getcwd()
        if e.name != top or here in sys.path:
            raise
    sys.path.insert(0, here)
    try:
        module = importlib.import_module(module_name)
    finally:
        sys.path.remove(here)
    _FOUND_IN[top] = here
    return module


# Top-level modules found in the current directory, and where (`import_from_here`).
_FOUND_IN: dict[str, str] = {}


@contextlib.contextmanager
def found_modules_on_path() -> Iterator[None]:
    """`sys.path` with the directories `import_from_here` found modules in, while worker
    processes start: a spawned process starts from a copy of this process's `sys.path` and
    imports the user's env module again (gymnasium's async vector env)."""
    extra = [d for d in dict.fromkeys(_FOUND_IN.values()) if d not in sys.path]
    sys.path[:0] = extra
    try:
        yield
    finally:
        for d in extra:
            sys.path.remove(d)


def import_env_module(env_id: str, key: str) -> str:
    """For gymnasium's `"module:EnvName-v0"` form, import `module` (which registers the env)
    and return `EnvName-v0`; an id without a module is returned as it is. ValueError naming
    config `key` when the module cannot be imported."""
    module, sep, name = env_id.rpartition(":")
    if not sep:
        return env_id
    if not module or not name:
        raise ValueError(f"{key}={env_id!r}: the form is 'module:EnvName-v0' (gymnasium's)")
    try:
        import_from_here(module)
    except ModuleNotFoundError as e:
        if e.name is not None and (module + ".").startswith(e.name + "."):
            raise ValueError(
                f"{key}={env_id!r}: no module named {e.name!r}, installed or in the current "
                f"directory ({os.getcwd()})"
            ) from None
        raise ValueError(f"{key}={env_id!r}: importing {module!r} raised {first_line(e)}") from None
    except Exception as e:  # the module's own code failed
        raise ValueError(f"{key}={env_id!r}: importing {module!r} raised {first_line(e)}") from None
    return name


def first_line(e: BaseException) -> str:
    """`Type: first line of the message` (at most 200 characters) for one-line reports."""
    text = str(e).strip()
    line = text.splitlines()[0] if text else ""
    line = line if len(line) <= 200 else line[:197] + "..."
    return f"{type(e).__name__}: {line}" if line else type(e).__name__
