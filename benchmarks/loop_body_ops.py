"""Operations per loop iteration: the engine's compiled PPO epoch against the hand-fused one.

On XLA's CPU runtime every operation of a loop body (fusion, copy, dot, custom call, nested
loop) is dispatched once per iteration, so for graphs as small as CartPole PPO the number of
operations in the rollout and minibatch loop bodies is what the time goes with. This compiles
10 epochs of each (configs/ppo_cartpole.yaml, nan_guard off, the engine as `lax.scan` over
`engine.pure_epoch`; the fused PPO from benchmarks/ppo_throughput.py) and prints, for every
`while` loop (the PRNG's internal loops, inside threefry, uniform, shuffle and the like, left out), its trip
count and the operations in its body (parameters, tuples, get-tuple-element, constants and bitcasts are
free and not counted).

    .venv/bin/python benchmarks/loop_body_ops.py
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

import jax

import jaxrl_engine as jre

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ppo_throughput import CONFIG, make_fused_train

FREE = {"parameter", "get-tuple-element", "tuple", "constant", "bitcast"}
PRNG_LOOPS = re.compile(r"jit\(_(threefry_\w+|uniform|gumbel|shuffle|normal\w*|randint)\)")
EPOCHS = 10


def computations(hlo: str) -> dict[str, list[tuple[str, str]]]:
    """Computation name -> [(opcode, line)] of the compiled module's text."""
    out: dict[str, list[tuple[str, str]]] = {}
    current = None
    for line in hlo.splitlines():
        head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) ", line)
        if head and line.rstrip().endswith("{"):
            current = head.group(1)
            out[current] = []
        elif current and " = " in line:
            op = re.search(r"\s([a-z][a-z0-9\-]*)\((?:%|\))", line)
            if op:
                out[current].append((op.group(1), line))
    return out


def loop_bodies(hlo: str) -> list[tuple[int, int]]:
    """(trip count, operations in the body) of every loop but the PRNG's own."""
    comps = computations(hlo)
    rows = []
    for instructions in comps.values():
        for op, line in instructions:
            trip = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
            name = re.search(r'op_name="([^"]*)"', line)
            if op != "while" or not trip or (name and PRNG_LOOPS.search(name.group(1))):
                continue
            body = re.search(r"body=%?([\w.\-]+)", line)
            ops = Counter(o for o, _ in comps[body.group(1)] if o not in FREE)  # type: ignore[union-attr]
            rows.append((int(trip.group(1)), sum(ops.values())))
    return sorted(rows, reverse=True)


def main() -> int:
    steps = EPOCHS * 16 * 128
    cfg = jre.load_config(
        CONFIG,
        [f"total_env_steps={steps}", "nan_guard=false", "progress=false", "compile_cache_dir=null"],
    )
    engine = jre.build(cfg)
    state = engine.init(jax.random.key(0))

    def engine_epochs(state):
        return jax.lax.scan(lambda s, _: engine.pure_epoch(s), state, None, length=EPOCHS)

    fused, _ = make_fused_train(cfg.algo, cfg.env.num_envs, EPOCHS)
    texts = {
        "engine": jax.jit(engine_epochs).lower(state).compile().as_text(),
        "fused": jax.jit(fused).lower(jax.random.key(0)).compile().as_text(),
    }
    print("| program | loop: iterations (operations per iteration) |")
    print("| --- | --- |")
    for name, text in texts.items():
        loops = ", ".join(f"{trip} ({ops})" for trip, ops in loop_bodies(text))
        print(f"| {name} | {loops} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
