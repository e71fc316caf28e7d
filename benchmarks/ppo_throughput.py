"""PPO throughput: the engine against a hand-fused single-function PPO (issue 2).

Three ways to train the same PPO (configs/ppo_cartpole.yaml: CartPole-v1, 16 envs x 128 steps,
4 epochs x 4 minibatches, 64x64 tanh MLPs, lr 5e-4 annealed, ...) for the same number of epochs:

  engine-a  the driver's way: `engine.epochs(state, 10)` (jitted, donated state; a compiled
            loop over the fused epoch, 10 = the default `eval.interval`, as `engine.run` calls
            it between two evaluations) from a Python loop, blocking once at the end; the
            evaluations the driver would add are left out, as the fused loop has none;
  engine-b  `jax.jit(jre.make_train(cfg))`: the whole training as one compiled function (it
            evaluates once, after the last epoch: `eval.interval` is set to the epoch count);
  fused     a PureJaxRL-style `train(key)` written here, independently of the engine: gymnax
            CartPole-v1 used directly, nested `lax.scan` (epochs -> rollout scan, GAE, update
            epochs x minibatches), same network, loss, GAE (truncated steps bootstrap from
            `info["final_observation"]`), optimizer and hyperparameters.

Extra rows, informational and not gated: "engine, 1 epoch per call" (`engine.epoch` from a
Python loop: what dispatching every epoch costs), "engine-a, nan_guard=false" (the driver's
loop without the NaN/Inf guard hook; `--no-guard-row` skips it) and, per throughput lever of
the engine's epoch, engine-a with that one lever undone (`LEVERS`; `--no-lever-rows` skips them): the
ablation. Levers tried and rejected (slower or no faster here) are listed in RESULTS.md.

Compilation happens first and is reported separately; then the three run alternately
(a, [a without guard,] b, fused, a, ...) `--repeats` times in this one process, and the median env
steps/s of each is compared. Exits 1 when engine-a is slower than 1.25x the fused loop.

    .venv/bin/python benchmarks/ppo_throughput.py [--epochs 100] [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import unittest.mock
from pathlib import Path
from typing import Any

import flax.linen as nn
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxrl_engine as jre
import jaxrl_engine.algos.ppo as ppo_module
import jaxrl_engine.core.phases as phases_module

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "ppo_cartpole.yaml"
THRESHOLD = 1.25
# Each lever of the engine's compiled epoch, undone: (row name, context manager under which an
# engine is built and compiled without it).
LEVERS = {
    "engine-a, shuffle by jax.random.permutation": lambda: unittest.mock.patch.object(
        ppo_module, "permutation", jax.random.permutation
    ),
    "engine-a, critic values per rollout step": lambda: unittest.mock.patch.object(
        ppo_module, "VALUES_AFTER_ROLLOUT", False
    ),
    "engine-a, rollout keys split inside the loop": lambda: unittest.mock.patch.object(
        phases_module, "KEYS_BEFORE_LOOP", False
    ),
}
NO_GUARD = "engine-a, nan_guard=false"
PER_EPOCH = "engine, 1 epoch per call"


# ----------------------------------------------------------------------------- hand-fused PPO
class _MLP(nn.Module):
    widths: tuple[int, ...]
    out: int
    out_scale: float

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for w in self.widths:
            x = nn.tanh(nn.Dense(w, kernel_init=nn.initializers.orthogonal(np.sqrt(2)))(x))
        return nn.Dense(self.out, kernel_init=nn.initializers.orthogonal(self.out_scale))(x)


def make_fused_train(hp: Any, num_envs: int, num_epochs: int):
    """`train(key) -> ((params, ...), per-epoch mean loss)`: the whole PPO run, one function."""
    env, env_params = gymnax.make("CartPole-v1")
    n_actions = env.action_space(env_params).n
    T, N = hp.num_steps, num_envs
    batch = T * N
    mb_size = batch // hp.num_minibatches
    widths = tuple(hp.hidden_sizes)
    actor = _MLP(widths, n_actions, 0.01)
    critic = _MLP(widths, 1, 1.0)
    n_updates = num_epochs * hp.update_epochs * hp.num_minibatches
    schedule = optax.linear_schedule(hp.lr, 0.0, n_updates) if hp.anneal_lr else hp.lr
    tx = optax.chain(optax.clip_by_global_norm(hp.max_grad_norm), optax.adam(schedule, eps=1e-5))
    v_step = jax.vmap(env.step, in_axes=(0, 0, 0, None))
    v_reset = jax.vmap(env.reset, in_axes=(0, None))

    def policy(params, obs):
        return actor.apply(params["actor"], obs), critic.apply(params["critic"], obs)[:, 0]

    def loss_fn(params, obs, action, old_logp, old_v, adv, target):
        logits, v = policy(params, obs)
        logp_all = jax.nn.log_softmax(logits)
        logp = jnp.take_along_axis(logp_all, action[:, None], axis=1)[:, 0]
        entropy = -(jnp.exp(logp_all) * logp_all).sum(-1).mean()
        v_clipped = old_v + jnp.clip(v - old_v, -hp.clip_eps, hp.clip_eps)
        v_loss = 0.5 * jnp.maximum(jnp.square(v - target), jnp.square(v_clipped - target)).mean()
        ratio = jnp.exp(logp - old_logp)
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        pg = jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - hp.clip_eps, 1 + hp.clip_eps) * adv)
        return -pg.mean() + hp.vf_coef * v_loss - hp.ent_coef * entropy

    grad_fn = jax.value_and_grad(loss_fn)

    def epoch(runner, _):
        params, opt_state, env_state, obs, key = runner

        def env_step(carry, _):
            env_state, obs, key = carry
            key, k_act, k_env = jax.random.split(key, 3)
            logits, value = policy(params, obs)
            action = jax.random.categorical(k_act, logits)
            logp = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None], 1)[:, 0]
            next_obs, env_state, reward, term, trunc, info = v_step(
                jax.random.split(k_env, N), env_state, action, env_params
            )
            out = (obs, action, logp, value, reward, term, trunc, info["final_observation"])
            return (env_state, next_obs, key), out

        (env_state, obs, key), traj = jax.lax.scan(env_step, (env_state, obs, key), None, T)
        t_obs, t_act, t_logp, t_value, t_rew, t_term, t_trunc, t_final = traj

        # GAE; V(final observation) bootstraps unless the step terminated.
        next_v = critic.apply(params["critic"], t_final.reshape(batch, -1))[:, 0].reshape(T, N)
        term = t_term.astype(jnp.float32)
        cut = 1.0 - jnp.logical_or(t_term, t_trunc).astype(jnp.float32)
        delta = t_rew + hp.gamma * next_v * (1.0 - term) - t_value

        def gae_step(acc, x):
            d, c = x
            acc = d + hp.gamma * hp.gae_lambda * c * acc
            return acc, acc

        _, adv = jax.lax.scan(gae_step, jnp.zeros(N), (delta, cut), reverse=True)
        data = (t_obs, t_act, t_logp, t_value, adv, adv + t_value)
        data = jax.tree.map(lambda x: x.reshape(batch, *x.shape[2:]), data)

        def update_epoch(carry, _):
            params, opt_state, key = carry
            key, k_perm = jax.random.split(key)
            perm = jax.random.permutation(k_perm, batch)
            mbs = jax.tree.map(
                lambda x: x[perm].reshape(hp.num_minibatches, mb_size, *x.shape[1:]), data
            )

            def update_minibatch(carry, mb):
                params, opt_state = carry
                loss, grads = grad_fn(params, *mb)
                updates, opt_state = tx.update(grads, opt_state, params)
                return (optax.apply_updates(params, updates), opt_state), loss

            (params, opt_state), loss = jax.lax.scan(update_minibatch, (params, opt_state), mbs)
            return (params, opt_state, key), loss

        (params, opt_state, key), loss = jax.lax.scan(
            update_epoch, (params, opt_state, key), None, hp.update_epochs
        )
        return (params, opt_state, env_state, obs, key), loss.mean()

    def train(key):
        key, k_actor, k_critic, k_reset = jax.random.split(key, 4)
        dummy = jnp.zeros((1, *env.observation_space(env_params).shape))
        params = {"actor": actor.init(k_actor, dummy), "critic": critic.init(k_critic, dummy)}
        obs, env_state = v_reset(jax.random.split(k_reset, N), env_params)
        runner = (params, tx.init(params), env_state, obs, key)
        return jax.lax.scan(epoch, runner, None, num_epochs)

    return train, (env, env_params, actor)


def greedy_return(env, env_params, actor, actor_params, key, num_envs=16):
    """Mean undiscounted return of the greedy policy over one full-length episode per env."""
    steps = env_params.max_steps_in_episode

    def run(actor_params, key):
        k_reset, k_steps = jax.random.split(key)
        obs, state = jax.vmap(env.reset, (0, None))(jax.random.split(k_reset, num_envs), env_params)

        def step(carry, k):
            state, obs, ret, alive = carry
            action = jnp.argmax(actor.apply(actor_params, obs), -1)
            obs, state, r, term, trunc, _ = jax.vmap(env.step, (0, 0, 0, None))(
                jax.random.split(k, num_envs), state, action, env_params
            )
            ret = ret + jnp.where(alive, r, 0.0)
            return (state, obs, ret, alive & ~(term | trunc)), None

        init = (state, obs, jnp.zeros(num_envs), jnp.ones(num_envs, bool))
        (_, _, ret, _), _ = jax.lax.scan(step, init, jax.random.split(k_steps, steps))
        return ret.mean()

    return float(jax.jit(run)(actor_params, key))


# ----------------------------------------------------------------------------------- harness
def _timed(fn) -> tuple[float, Any]:
    start = time.perf_counter()
    out = jax.block_until_ready(fn())
    return time.perf_counter() - start, out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=100, help="training epochs per run")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs of each variant")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--pin-cpu",
        type=int,
        default=None,
        metavar="CPU",
        help="run on one CPU only, like `taskset -c CPU` (Linux; the script re-executes "
        "itself pinned): XLA then runs single-threaded",
    )
    parser.add_argument(
        "--no-guard-row",
        action="store_true",
        help="skip the extra engine-a row with nan_guard=false (informational, not gated)",
    )
    parser.add_argument(
        "--no-lever-rows",
        action="store_true",
        help="skip the ablation rows (engine-a with one throughput lever undone)",
    )
    parser.add_argument(
        "--override", action="append", default=[], help="extra config override (key=value)"
    )
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.epochs < 1:
        parser.error("--epochs and --repeats must be >= 1")

    if args.pin_cpu is not None and os.sched_getaffinity(0) != {args.pin_cpu}:
        # XLA sizes its CPU thread pool from the affinity it sees when it starts, and importing
        # jax has started threads already: pin, then re-exec, so all of JAX starts on one CPU.
        os.sched_setaffinity(0, {args.pin_cpu})
        sys.stdout.flush()
        os.execv(sys.executable, [sys.executable, *sys.argv])
    # Sizes after --override (env.num_envs=2048, say), so that each run is --epochs epochs.
    base = jre.load_config(CONFIG, overrides=args.override)
    steps_per_epoch = base.env.num_envs * base.algo.num_steps
    # compile_cache_dir=null: every compile measured cold (the default `auto` would load what an
    # earlier run of this script compiled; nothing then sets a cache for the fused loop either),
    # unless JAX_COMPILATION_CACHE_DIR is set in the environment: JAX's own cache still applies.
    overrides = [
        f"total_env_steps={args.epochs * steps_per_epoch}",
        "progress=false",
        "compile_cache_dir=null",
    ]
    cfg = jre.load_config(CONFIG, overrides=[*overrides, *args.override])
    # make_train evaluates every eval.interval epochs: once, at the end, for engine-b.
    cfg_b = jre.load_config(
        CONFIG, overrides=[*overrides, f"eval.interval={args.epochs}", *args.override]
    )
    env_steps = args.epochs * steps_per_epoch
    key = jax.random.key(args.seed)
    jax.block_until_ready(jax.jit(lambda x: x + 1)(1))  # JAX start-up outside every timing

    # ---- compile all three (excluded from throughput)
    engine = jre.build(cfg)
    assert engine.num_epochs == args.epochs, (engine.num_epochs, args.epochs)
    state = engine.init(key)
    engine.warm_up(state, phases=["epochs", "evaluate"])
    chunk = engine.epochs_per_call
    compile_s = {
        "engine-a": engine.compile_report["epochs"]["compile_s"],
        # `engine.epoch` runs the epochs program with n = 1: one compile serves both rows.
        PER_EPOCH: engine.compile_report["epochs"]["compile_s"],
    }

    train_b = jre.make_train(cfg_b)
    start = time.perf_counter()
    compiled_b = jax.jit(train_b).lower(key).compile()
    compile_s["engine-b"] = time.perf_counter() - start

    fused, (env, env_params, actor) = make_fused_train(cfg.algo, cfg.env.num_envs, args.epochs)
    start = time.perf_counter()
    compiled_f = jax.jit(fused).lower(key).compile()
    compile_s["fused"] = time.perf_counter() - start

    def driver_loop(eng):
        def run(k):
            s = eng.init(k)
            jax.block_until_ready(s)
            start = time.perf_counter()
            done = 0
            while done < args.epochs:
                n = min(chunk, args.epochs - done)
                s, metrics, ran = eng.call("epochs", s, n)
                done += n
            jax.block_until_ready((s, metrics))
            assert int(ran) == n and int(s.counters.epoch) == args.epochs
            return time.perf_counter() - start, s

        return run

    def per_epoch_loop(k):
        s = engine.init(k)
        jax.block_until_ready(s)
        start = time.perf_counter()
        for _ in range(args.epochs):
            s, metrics = engine.call("epoch", s)
        jax.block_until_ready((s, metrics))
        return time.perf_counter() - start, s

    runners = {"engine-a": driver_loop(engine), PER_EPOCH: per_epoch_loop}
    if cfg.nan_guard and not args.no_guard_row:
        # The same driver loop without the nan_guard hook, to size that hook's cost.
        unguarded = jre.build(cfg.model_copy(update={"nan_guard": False}))
        unguarded.warm_up(unguarded.init(key), phases=["epochs"])
        compile_s[NO_GUARD] = unguarded.compile_report["epochs"]["compile_s"]
        runners[NO_GUARD] = driver_loop(unguarded)
    for name, undone in ({} if args.no_lever_rows else LEVERS).items():
        with undone():  # traced and compiled without the lever
            ablated = jre.build(cfg)
            ablated.warm_up(ablated.init(key), phases=["epochs"])
        compile_s[name] = ablated.compile_report["epochs"]["compile_s"]
        runners[name] = driver_loop(ablated)
    runners |= {
        "engine-b": lambda k: _timed(lambda: compiled_b(k)),
        "fused": lambda k: _timed(lambda: compiled_f(k)),
    }
    # One untimed run of each: first-call allocations, page faults, thread-pool start-up.
    last = {name: fn(jax.random.fold_in(key, 10_000))[1] for name, fn in runners.items()}
    seconds: dict[str, list[float]] = {name: [] for name in runners}
    for rep in range(args.repeats):
        k = jax.random.fold_in(key, rep)
        for name, fn in runners.items():
            dt, last[name] = fn(k)
            seconds[name].append(dt)

    # One evaluation (the one engine-b performs) timed on its own, to size that share of b.
    eval_s = statistics.median(
        _timed(lambda: engine.call("evaluate", last["engine-a"]))[0] for _ in range(5)
    )

    # Sanity: all three learned (greedy return of the final policy; not timed).
    k_eval = jax.random.key(12345)
    actor_params = {
        name: {"params": out.train.params["params"]["MLP_0"]}
        for name, out in last.items()
        if name not in ("engine-b", "fused")
    }
    actor_params["engine-b"] = {"params": last["engine-b"][0].train.params["params"]["MLP_0"]}
    actor_params["fused"] = last["fused"][0][0]["actor"]
    greedy = {
        name: greedy_return(env, env_params, actor, p, k_eval) for name, p in actor_params.items()
    }

    fused_med = statistics.median(seconds["fused"])
    rows = []
    for name in runners:
        med = statistics.median(seconds[name])
        rows.append(
            f"| {name} | {env_steps / med:,.0f} | {min(seconds[name]):.3f} / {med:.3f} / "
            f"{max(seconds[name]):.3f} | {fused_med / med:.3f} | {compile_s[name]:.2f} | "
            f"{greedy[name]:.1f} |"
        )
    ratio_a = fused_med / statistics.median(seconds["engine-a"])
    print(
        f"PPO CartPole-v1, {cfg.env.num_envs} envs x {cfg.algo.num_steps} steps, "
        f"{cfg.algo.update_epochs} epochs x {cfg.algo.num_minibatches} minibatches, "
        f"{'x'.join(map(str, cfg.algo.hidden_sizes))} MLP; {args.epochs} epochs = {env_steps:,} "
        f"env steps per run; engine-a: {chunk} epochs per call; {args.repeats} alternating "
        f"repeats; nan_guard={cfg.nan_guard}; "
        f"CPUs used: {sorted(os.sched_getaffinity(0))}"
    )
    print()
    print(
        "| variant | env steps/s (median) | run s (min / median / max) | x fused | compile s "
        "| greedy return |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    print("\n".join(rows))
    print()
    print(
        f"engine-b includes one final evaluation (16 envs x 500 steps, inference only): "
        f"{eval_s * 1e3:.1f} ms measured on its own."
    )
    verdict = "PASS" if ratio_a >= THRESHOLD else "FAIL"
    print(f"{verdict}: engine-a / fused = {ratio_a:.3f} (threshold {THRESHOLD})")
    return 0 if ratio_a >= THRESHOLD else 1


if __name__ == "__main__":
    sys.exit(main())
