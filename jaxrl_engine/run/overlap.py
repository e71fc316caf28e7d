"""Acting and learning overlapped (Sebulba-style), for envs stepped on the host.

With a host env the rollout's time is the env's (on the host) and the learner's is XLA's
(which releases the GIL), so the two can run at once: an actor thread collects rollout k+1
with the acting params of version k while the learner trains on rollout k. The schedule is
fixed, so results are reproducible: rollout 0 of a chunk uses the chunk's current params, every
later one the params of the epoch before (`rollout/policy_lag`: 0, then 1; never more: the
actor waits for that version before it starts). Each chunk (the epochs up to the next
evaluation or checkpoint) drains the pipeline at its end, so checkpoints hold a consistent
state; a resumed run follows the same schedule.

PPO's clipped importance ratio uses the log-probabilities stored by the acting policy, so a lag
of one version is corrected as in IMPALA/Sebulba. Off-policy algorithms keep a replay buffer
that the learner's epoch may update (priorities) while the actor adds to it, so `overlap`
runs on-policy algorithms only.

An exception in the actor (a host env's error included) stops the chunk and is raised in the
driver's thread as it was; nothing waits forever: every wait also watches a stop flag.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

import jax

from jaxrl_engine.core.engine import Engine
from jaxrl_engine.core.state import EngineState, Metrics

ACTOR_STREAM = 0xAC7  # fold_in constant: the actor's PRNG stream within a chunk
POLL_S = 0.1


class _Stopped(Exception):
    pass


class Pipeline:
    """The actor thread of one chunk: `rollouts(state, n)` yields (rollout state, metrics) for
    n epochs; `publish(eval_params, version)` hands it the learner's new acting params."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._results: queue.Queue[tuple[Any, ...]] = queue.Queue(maxsize=1)
        self._params: dict[int, Any] = {}  # version -> acting params (the last two kept)
        self._version = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, state: EngineState, n: int) -> None:
        self._params = {0: state.eval_params}
        actor = state.replace(rng=jax.random.fold_in(state.rng, ACTOR_STREAM))
        self._thread = threading.Thread(target=self._act, args=(actor, n), daemon=True)
        self._thread.start()

    def _act(self, state: EngineState, n: int) -> None:
        try:
            for k in range(n):
                version = max(k - 1, 0)  # exactly this one: a fixed, reproducible schedule
                state = state.replace(eval_params=self._wait_for_version(version))
                state, metrics = _run(self.engine, "rollout", state)
                jax.block_until_ready(state.buffer)
                self._put(("ok", state, metrics, k - version))
        except _Stopped:
            return
        except BaseException as e:  # handed to the learner, raised there as it was
            self._put(("error", e), force=True)

    def _wait_for_version(self, version: int) -> Any:
        with self._version:
            while version not in self._params:
                if self._stop.is_set():
                    raise _Stopped
                self._version.wait(POLL_S)
            return self._params[version]

    def _put(self, item: tuple[Any, ...], force: bool = False) -> None:
        while not self._stop.is_set() or force:
            try:
                self._results.put(item, timeout=POLL_S)
                return
            except queue.Full:
                if force and self._stop.is_set():
                    return
        raise _Stopped

    def next(self) -> tuple[EngineState, Metrics, int]:
        """The next rollout: its state (buffer, env, stats), metrics and policy lag."""
        item: tuple[Any, ...] | None = None
        while True:
            try:
                item = self._results.get(timeout=POLL_S)
                break
            except queue.Empty:
                if self._thread is not None and not self._thread.is_alive():
                    if self._results.empty():
                        raise RuntimeError("the actor thread ended without a result") from None
                    item = self._results.get_nowait()
                    break
        if item[0] == "error":
            raise item[1]
        return item[1], item[2], item[3]

    def publish(self, eval_params: Any, version: int) -> None:
        with self._version:
            self._params[version] = eval_params
            self._params.pop(version - 2, None)  # the actor needs version - 1 at the oldest
            self._version.notify_all()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def _run(engine: Engine, name: str, state: EngineState) -> tuple[EngineState, Metrics]:
    return engine.call(name, state)


def overlapped_epochs(
    engine: Engine, state: EngineState, n: int
) -> tuple[EngineState, list[Metrics]]:
    """`n` epochs with the rollout of epoch k+1 overlapping the learning of epoch k; returns
    the state after them and each epoch's metrics (with `rollout/policy_lag`)."""
    pipeline = Pipeline(engine)
    pipeline.start(state, n)
    rows: list[Metrics] = []
    try:
        for k in range(n):
            rolled, metrics, lag = pipeline.next()
            state = state.replace(
                buffer=rolled.buffer,
                env=rolled.env,
                stats=rolled.stats,
                counters=state.counters.replace(env_steps=rolled.counters.env_steps),
            )
            state, learned = engine.timed_call("learn", state)
            pipeline.publish(state.eval_params, k + 1)
            row = {**jax.device_get({**metrics, **learned}), "rollout/policy_lag": lag}
            rows.append(row)
            if any(v >= 0 for name, v in row.items() if name.startswith("guard/")):
                break  # nan_guard fired: stop after this epoch, as the fused loop does
    finally:
        pipeline.stop()
    return state, rows
