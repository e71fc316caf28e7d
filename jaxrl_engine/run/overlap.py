"""Acting and learning overlapped (Sebulba-style): `env.overlap`, `env.actor_device`.

An actor thread collects rollout k+1 with the acting params of version k while the learner
trains on rollout k. With a host env the rollout's time is the env's (on the host) and the
learner's is XLA's (which releases the GIL), so the two run at once on one device; with a JAX
env they overlap when the actor has a device of its own (`env.actor_device`: the actor's
rollout runs there, the learner's data mesh takes the other devices, and acting params and
rollouts cross with `jax.device_put`; RLightning's actor/learner split, `run_split`'s schedule).

The schedule is fixed, so results are reproducible and do not depend on placement: rollout 0
of a chunk uses the chunk's current params, every later one the params of the epoch before
(`rollout/policy_lag`: 0, then 1; never more: the actor waits for that version before it
starts). Each chunk (the epochs up to the next evaluation or checkpoint) drains the pipeline at
its end, so checkpoints hold a consistent state, and a resumed run follows the same schedule:
resume is exact for JAX envs (a host env's episodes in flight are not saved).

On-policy (PPO): the actor runs the engine's (hooked) rollout phase; PPO's clipped importance
ratio uses the log-probabilities stored by the acting policy, so a lag of one version is
corrected as in IMPALA/Sebulba. Off-policy (DQN, SAC, TD3): the actor only collects (the
rollout phase's env loop) and the learner writes that trajectory into its replay buffer before
its update_dataset/train/sync_weights, so the replay buffer never leaves the learner (a replaced
or hooked rollout phase is refused at build for this reason).

An exception in the actor (a host env's error included) stops the chunk and is raised in the
driver's thread as it was; nothing waits forever: every wait also watches a stop flag.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

import jax

from jaxrl_engine.core.engine import Engine
from jaxrl_engine.core.sharding import to_host
from jaxrl_engine.core.state import EngineState, Metrics
from jaxrl_engine.distributed.split import split_functions

ACTOR_STREAM = 0xAC7  # fold_in constant: the actor's PRNG stream within a chunk
POLL_S = 0.1


class _Stopped(Exception):
    pass


class Pipeline:
    """The actor thread of one chunk: `start(state, n)`, then `next()` returns each of the n
    rollouts (on the learner's devices); `publish(eval_params, version)` hands the actor the
    learner's new acting params. actor_device: where the actor runs (None: where the state is)."""

    def __init__(self, engine: Engine, actor_device: jax.Device | None = None, act: Any = None):
        # act: the off-policy actor half (`split_functions(engine)[0]`; made by the caller, so
        # that the actor and learner threads never race to build it).
        self.engine, self.actor_device = engine, actor_device
        self._act_fn = (
            act if act is not None or engine.algo.on_policy else split_functions(engine)[0]
        )
        self._results: queue.Queue[tuple[Any, ...]] = queue.Queue(maxsize=1)
        self._params: dict[int, Any] = {}  # version -> acting params (the last two kept)
        self._version = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _to_actor(self, tree: Any) -> Any:
        # A copy, never an alias: the actor donates what it is given.
        device = self.actor_device
        if device is None:
            return jax.tree.map(lambda x: x.copy(), tree)
        return jax.device_put(tree, device, may_alias=False)

    def start(self, state: EngineState, n: int) -> None:
        self._params = {0: state.eval_params}
        rng = jax.random.fold_in(state.rng, ACTOR_STREAM)
        actor: Any
        if self.engine.algo.on_policy:  # (the rollout phase donates nothing)
            actor = state.replace(rng=rng)
            if self.actor_device is not None:
                actor = self._to_actor(actor)
        else:
            actor = self._to_actor((state.env, state.stats, rng))
        self._thread = threading.Thread(target=self._act, args=(actor, n), daemon=True)
        self._thread.start()

    def _act(self, actor: Any, n: int) -> None:
        engine = self.engine
        try:
            for k in range(n):
                version = max(k - 1, 0)  # exactly this one: a fixed, reproducible schedule
                params = self._wait_for_version(version)
                if self.actor_device is not None:
                    params = jax.device_put(params, self.actor_device)
                if engine.algo.on_policy:
                    actor = actor.replace(eval_params=params)
                    if self.actor_device is None:
                        actor, metrics = engine.call("rollout", actor)
                    else:  # compiled for the actor's device on first use
                        actor, metrics = engine.rollout(actor)
                    result: Any = (actor.buffer, actor.env, actor.stats, actor.counters.env_steps)
                else:
                    env, stats, rng, trajectory, metrics = self._act_fn(params, *actor)
                    actor = (env, stats, rng)
                    # Copies: the next collection donates env and stats.
                    result = (trajectory, *jax.tree.map(lambda x: x.copy(), (env, stats)), None)
                jax.block_until_ready(result)
                self._put(("ok", result, metrics, k - version))
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

    def next(self) -> tuple[tuple[Any, ...], Metrics, int]:
        """The next rollout (buffer or trajectory, env, stats, env_steps or None), its
        metrics and policy lag."""
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


def overlap_phases(engine: Engine, actor_device: jax.Device | None) -> list[str]:
    """What the driver warms up for overlapped epochs: the rollout (on-policy, on the learner's
    device), the fused learner epoch (on-policy) and the evaluation; the rest compiles on first
    use (the actor's phases on another device, the off-policy split's halves)."""
    on_policy = engine.algo.on_policy
    return [
        *(["rollout"] if on_policy and actor_device is None else []),
        *(["learn"] if on_policy else []),
        "evaluate",
    ]


def overlapped_epochs(
    engine: Engine, state: EngineState, n: int, actor_device: jax.Device | None = None
) -> tuple[EngineState, list[Metrics]]:
    """`n` epochs with the rollout of epoch k+1 overlapping the learning of epoch k; returns
    the state after them and each epoch's metrics (with `rollout/policy_lag`)."""
    act, learn = (None, None) if engine.algo.on_policy else split_functions(engine)
    pipeline = Pipeline(engine, actor_device, act)
    pipeline.start(state, n)
    sharding = engine.state_sharding
    rows: list[Metrics] = []
    try:
        for k in range(n):
            (data, env, stats, env_steps), metrics, lag = pipeline.next()
            # Onto the learner's placement (from the actor's device, or from where XLA put
            # the rollout's outputs on a multi-device mesh); a no-op when they are there.
            env, stats, env_steps = jax.device_put(
                (env, stats, env_steps), (sharding.env, sharding.stats, sharding.rng)
            )
            replicated = jax.tree.map(lambda _: sharding.rng, data)
            data = jax.device_put(data, sharding.buffer if learn is None else replicated)
            if learn is None:  # on-policy: the rollout's buffer, then the fused learner epoch
                state = state.replace(
                    buffer=data,
                    env=env,
                    stats=stats,
                    counters=state.counters.replace(env_steps=env_steps),
                )
                state, learned = engine.timed_call("learn", state)
            else:  # off-policy: the trajectory into the replay buffer, then learn
                state, learned = learn(state, data)
                state = state.replace(env=env, stats=stats)
            # Off-policy: a copy, since the next `learn` donates the state's acting params.
            published = state.eval_params
            if learn is not None:
                published = jax.tree.map(lambda x: x.copy(), published)
            pipeline.publish(published, k + 1)
            row = {**to_host({**metrics, **learned}), "rollout/policy_lag": lag}
            rows.append(row)
            if any(v >= 0 for name, v in row.items() if name.startswith("guard/")):
                break  # nan_guard fired: stop after this epoch, as the fused loop does
    finally:
        pipeline.stop()
    return state, rows
