"""Actor-learner split: rollout on one device, learning on another, dispatched to overlap.

The off-policy epoch's data flow is rollout -> add -> sample -> train inside one compiled epoch,
so on one device train always waits for its own rollout. Here the same pieces run as two
compiled functions, each on its own device:

  actor   (device A): collect `num_steps` with the acting params it was last sent -> trajectory
  learner (device B): add the previous trajectory, update_dataset, train, sync_weights

Each iteration dispatches one actor call and one learner call that share no input (the actor
needs the learner's previous acting params, the learner the actor's previous trajectory), so
JAX's asynchronous dispatch runs them at the same time; trajectories and acting params cross
over with `jax.device_put`. The price is RLightning's bounded staleness: the learner trains on
data one epoch old and the actor acts with params that have not seen its last trajectory.
With `actor == learner` the same schedule runs on one device, one call after the other (same
results: the overlap changes when things run, not what they compute).

`run_split` is the Python API over a given number of epochs; in `engine.run` and the CLI the
same halves (`split_functions`) run inside `run/overlap.py` (`env.overlap`, `env.actor_device`)
with the driver's checkpoints, evaluation and logging. Off-policy algorithms only here.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

import jax

from jaxrl_engine.core.nan_guard import GUARDED_STATE, check_guards, nan_guard
from jaxrl_engine.core.phases import merge_metrics
from jaxrl_engine.core.state import EngineState, Metrics

ACTOR_STREAM = 0xAC7  # fold_in constant: the actor's own PRNG stream
LEARNER_PHASES = ("update_dataset", "train", "sync_weights")


@functools.cache
def split_functions(engine: Any) -> tuple[Any, Any]:
    """(act, learn), jitted: the actor's and the learner's halves of an off-policy epoch
    (one pair per engine, so repeated runs compile once)."""

    def act(params: Any, env: Any, stats: Any, rng: jax.Array):
        rng, key = jax.random.split(rng)

        def collect(_: Any) -> tuple[Any, Metrics]:
            out = engine.builder.collect(params, env, stats, key)
            return SimpleNamespace(env=out[0], out=out[:3]), out[3]

        run: Any = collect
        if engine.nan_guard:  # the rollout phase's own nan_guard
            run = nan_guard("rollout", GUARDED_STATE["rollout"])(collect)
        done, metrics = run(None)
        env, stats, trajectory = done.out
        return env, stats, rng, trajectory, metrics

    def learn(state: EngineState, trajectory: Any) -> tuple[EngineState, Metrics]:
        state = engine.builder.store(state, trajectory)
        metrics: Metrics = {}
        for name in LEARNER_PHASES:
            state, m = engine.pure_phases[name](state)
            merge_metrics(metrics, m, name)
        return state, metrics

    return jax.jit(act, donate_argnums=(1, 2)), jax.jit(learn, donate_argnums=0)


def run_split(
    engine: Any,
    state: EngineState,
    num_epochs: int,
    actor: jax.Device,
    learner: jax.Device,
) -> tuple[EngineState, list[dict[str, float]]]:
    """Train `num_epochs` epochs with acting on `actor` and learning on `learner`.

    Returns the final state (on `learner`) and one record per epoch (the actor's rollout
    metrics of that epoch and the learner's metrics from learning its trajectory). Raises
    `NonFiniteError` (after the run: the metrics are read once, at the end, so that nothing
    waits in between) when `nan_guard` flagged the actor's rollout or a learner phase, naming
    the first epoch it flagged.
    """
    if engine.algo.on_policy:
        raise ValueError(
            f"run_split: algo.name={engine.algo.name!r} is on-policy; the actor-learner "
            "split trains on data one epoch old, which only off-policy algorithms (dqn, sac, td3) "
            "accept"
        )
    if engine.host_between_epochs:
        raise ValueError(
            "run_split: a state kept in host memory between epochs (offload=true, or hooks "
            "such as offload_after) is not supported (each half owns its device)"
        )
    if num_epochs < 1:
        raise ValueError(f"run_split: num_epochs={num_epochs} must be >= 1")
    act, learn = split_functions(engine)

    def put(tree: Any, device: jax.Device) -> Any:
        # Always a copy: with actor == learner an alias would be donated by the other half.
        return jax.device_put(tree, device, may_alias=False)

    learner_state = put(state, learner)
    params = put(state.eval_params, actor)
    env, stats = put(state.env, actor), put(state.stats, actor)
    rng = put(jax.random.fold_in(state.rng, ACTOR_STREAM), actor)

    acted: list[Metrics] = []
    learned: list[Metrics] = []
    pending = None
    for _ in range(num_epochs):
        env, stats, rng, trajectory, metrics = act(params, env, stats, rng)
        acted.append(metrics)
        if pending is not None:
            learner_state, metrics = learn(learner_state, pending)
            learned.append(metrics)
            params = put(learner_state.eval_params, actor)
        pending = put(trajectory, learner)
    learner_state, metrics = learn(learner_state, pending)
    learned.append(metrics)
    final = learner_state.replace(env=put(env, learner), stats=put(stats, learner))

    records = []
    first = int(jax.device_get(state.counters.epoch))
    for i, (a, b) in enumerate(zip(jax.device_get(acted), jax.device_get(learned), strict=True)):
        check_guards({**a, **b}, engine.guarded_names, first + i + 1)  # (the actor's too)
        records.append(
            {
                "epoch": first + i + 1,
                **{k: float(v) for k, v in {**a, **b}.items() if not k.startswith("guard/")},
            }
        )
    return final, records
