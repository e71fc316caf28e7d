"""A training process for the tests that kill one: `python -m tests.core.run_child MODE RUN_DIR
[key=value ...]`, MODE `fresh` (a new run) or `resume` (continue RUN_DIR).

It prints `epoch N` after each logged epoch (flushed, for the parent to follow). Environment:
- PAUSE_IN_EPOCH=N: inside the compiled epoch N (counted from 1, during its rollout), print
  `in epoch N` and sleep, so that the parent can kill the process in the middle of that epoch.
  Every run of a test uses the same hook, so the compiled program is the same in all of them.
- KILL_IN_CHECKPOINT_WRITER=N: SIGKILL this process while the checkpoint of epoch N is being
  written: after its files are in the temporary directory, before orbax commits (renames) it.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import jax

import jaxrl_engine as jre
from jaxrl_engine.compose import resume

PAUSE_IN_EPOCH = int(os.environ.get("PAUSE_IN_EPOCH", "0"))
KILL_IN_WRITER = int(os.environ.get("KILL_IN_CHECKPOINT_WRITER", "0"))


def _pause_if(epoch_index) -> None:
    if PAUSE_IN_EPOCH and int(epoch_index) + 1 == PAUSE_IN_EPOCH:
        print(f"in epoch {PAUSE_IN_EPOCH}", flush=True)
        time.sleep(120)


def pause_hook(phase):
    def wrapped(state):
        jax.debug.callback(_pause_if, state.counters.epoch)
        return phase(state)

    return wrapped


def _kill_before_commit() -> None:
    from orbax.checkpoint._src.path import atomicity

    finalize = atomicity.AtomicRenameTemporaryPath.finalize

    async def dying_finalize(self):
        if self.get_final().name == f"epoch_{KILL_IN_WRITER}":
            files = [p for p in Path(str(self.get())).rglob("*") if p.is_file()]
            print(f"killed while writing {self.get().name} ({len(files)} files)", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return await finalize(self)

    atomicity.AtomicRenameTemporaryPath.finalize = dying_finalize


def main() -> None:
    mode, run_dir, *overrides = sys.argv[1:]
    if KILL_IN_WRITER:
        _kill_before_commit()
    hooks = {"rollout": [pause_hook]}
    if mode == "fresh":
        cfg = jre.load_config(None, overrides)
        engine = jre.build(cfg, hooks=hooks)
        state = engine.init(jax.random.key(cfg.seed))
    else:
        engine, state = resume(run_dir, overrides, hooks=hooks)
    engine.run(
        state,
        run_dir=run_dir,
        on_epoch=lambda record: print(f"epoch {record['epoch']}", flush=True),
    )


if __name__ == "__main__":
    main()
