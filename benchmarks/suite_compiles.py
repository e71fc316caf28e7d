"""Where the test suite's time goes: per test, what JAX traced, lowered and compiled.

A pytest plugin (load it with `-p suite_compiles`, `benchmarks/` on PYTHONPATH) that records,
for every test run in the pytest process and its xdist workers, JAX's monitoring events:
tracing, lowering, and each backend compile, marked as a persistent-cache hit or a miss. Each
process writes one JSON-lines file into `$SUITE_COMPILES_OUT` (default
/tmp/suite_compiles). Subprocesses a test starts are not seen (their time is only in the test's
wall time). Then `python benchmarks/suite_compiles.py [DIR]` prints the totals, the files and
tests by wall time, and the programs whose misses cost most:

    PYTHONPATH=benchmarks .venv/bin/python -m pytest -p suite_compiles -n 2 --dist loadfile
    .venv/bin/python benchmarks/suite_compiles.py
"""

from __future__ import annotations

import collections
import glob
import json
import os
import sys
import time
from typing import Any

import pytest

OUT = os.environ.get("SUITE_COMPILES_OUT", "/tmp/suite_compiles")
_rows: list[dict[str, Any]] = []
_now: dict[str, Any] = {"test": None, "hit": False}


def _duration(event: str, seconds: float, **kwargs: Any) -> None:
    kind = {
        "/jax/core/compile/backend_compile_duration": "compile",
        "/jax/core/compile/jaxpr_trace_duration": "trace",
        "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
    }.get(event)
    if kind is None:
        return
    row = {"test": _now["test"], "kind": kind, "fn": kwargs.get("fun_name"), "s": seconds}
    if kind == "compile":  # a hit is recorded just before its compile's duration
        row["hit"], _now["hit"] = _now["hit"], False
    _rows.append(row)


def _event(event: str, **kwargs: Any) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        _now["hit"] = True


def pytest_configure(config: Any) -> None:
    import jax.monitoring

    jax.monitoring.register_event_duration_secs_listener(_duration)
    jax.monitoring.register_event_listener(_event)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: Any, nextitem: Any) -> Any:
    _now["test"] = item.nodeid
    start = time.perf_counter()
    yield
    _rows.append({"test": item.nodeid, "kind": "wall", "s": time.perf_counter() - start})
    _now["test"] = None


def pytest_unconfigure(config: Any) -> None:
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, f"{os.getpid()}.jsonl"), "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in _rows)


def report(folder: str, top: int = 40) -> None:
    rows = []
    for path in glob.glob(f"{folder}/*.jsonl"):
        with open(path) as f:
            rows += [json.loads(line) for line in f]
    tests: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    miss_s: collections.Counter = collections.Counter()
    miss_n: collections.Counter = collections.Counter()
    for row in rows:
        c = tests[row["test"] or "<outside tests>"]
        if row["kind"] == "compile":
            which = "hit" if row["hit"] else "miss"
            c[f"{which}_s"] += row["s"]
            c[f"{which}es" if which == "miss" else "hits"] += 1
            if not row["hit"]:
                miss_s[row["fn"]] += row["s"]
                miss_n[row["fn"]] += 1
        else:
            c[row["kind"]] += row["s"]
    total: collections.Counter = collections.Counter()
    for c in tests.values():
        total.update(c)
    print("totals:", {k: round(v, 1) for k, v in sorted(total.items())})
    header = f"{'wall s':>8} {'miss s':>7} {'trace s':>7} {'lower s':>7} {'misses':>6} {'hits':>5}"

    def line(c: collections.Counter, name: str) -> str:
        return (
            f"{c['wall']:8.1f} {c['miss_s']:7.1f} {c['trace']:7.1f} {c['lower']:7.1f} "
            f"{c['misses']:6d} {c['hits']:5d}  {name}"
        )

    files: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for name, c in tests.items():
        files[name.split("::")[0]].update(c)
    print(f"\nfiles by wall time\n{header}")
    for name, c in sorted(files.items(), key=lambda x: -x[1]["wall"])[:top]:
        print(line(c, name))
    print(f"\ntests by wall time\n{header}")
    for name, c in sorted(tests.items(), key=lambda x: -x[1]["wall"])[:top]:
        print(line(c, name))
    print("\nprograms by compile seconds on a cache miss")
    for fn, seconds in miss_s.most_common(15):
        print(f"{seconds:8.1f} s {miss_n[fn]:5d} misses  {fn}")


if __name__ == "__main__":
    report(sys.argv[1] if len(sys.argv) > 1 else OUT)
