"""Engine behaviours: purity, phases, warm-up checks, vmap over seeds."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_engine as jre
from tests.conftest import SMALL, small_config

ROOT = Path(__file__).resolve().parents[2]


def leaves_equal(a, b) -> bool:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(
        np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True)
        for x, y in zip(la, lb, strict=True)
    )


def key_data(state):
    return state.replace(rng=jax.random.key_data(state.rng))


def test_same_key_gives_bitwise_identical_state_after_an_epoch(small_cfg):
    engine = jre.build(small_cfg)
    a, _ = engine.epoch(engine.init(jax.random.key(7)))
    b, _ = engine.epoch(engine.init(jax.random.key(7)))
    c, _ = engine.epoch(engine.init(jax.random.key(8)))
    assert leaves_equal(key_data(a), key_data(b))
    assert not leaves_equal(key_data(a).train.params, key_data(c).train.params)


def test_epoch_runs_phases_in_rlightning_order_and_counts(small_cfg):
    engine = jre.build(small_cfg)
    state = engine.init(jax.random.key(0))
    state, metrics = engine.epoch(state)
    assert int(state.counters.epoch) == 1
    assert int(state.counters.env_steps) == 4 * 16
    assert int(state.counters.grad_steps) == 2 * 2
    assert int(state.eval_version) == 1
    for key in (
        "rollout/episode_return",
        "update_dataset/advantage_mean",
        "train/loss",
        "sync_weights/version",
    ):
        assert key in metrics


def test_epoch_donates_its_input_state(small_cfg):
    engine = jre.build(small_cfg)
    state = engine.init(jax.random.key(0))
    params_leaf = jax.tree.leaves(state.train.params)[0]
    engine.epoch(state)
    assert params_leaf.is_deleted()


def test_phases_by_hand_equal_the_fused_epoch(small_cfg):
    engine = jre.build(small_cfg)
    fused, fused_metrics = engine.epoch(engine.init(jax.random.key(3)))
    state = engine.init(jax.random.key(3))
    metrics = {}
    for phase in (engine.rollout, engine.update_dataset, engine.train, engine.sync_weights):
        state, m = phase(state)
        metrics.update(m)
    for a, b in zip(
        jax.tree.leaves(key_data(fused)), jax.tree.leaves(key_data(state)), strict=True
    ):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    assert set(metrics) == set(fused_metrics)


def test_evaluate_does_not_advance_the_training_state(small_cfg):
    engine = jre.build(small_cfg)
    state = engine.init(jax.random.key(0))
    after, metrics = engine.evaluate(state)
    assert leaves_equal(key_data(state), key_data(after))
    assert 1.0 <= float(metrics["evaluate/episode_length"]) <= 500


def test_evaluate_uses_its_own_env_params(tmp_path):
    short = small_config("eval.env_params={max_steps_in_episode: 5}", tmp_path=tmp_path)
    engine = jre.build(short)
    _, metrics = engine.evaluate(engine.init(jax.random.key(0)))
    assert float(metrics["evaluate/episode_length"]) <= 5


def test_make_train_vmapped_over_seeds_equals_single_seed_runs(tmp_path):
    """5 epochs evaluated every 2: after epochs 2, 4 and 5 (a short last block, whose missing
    epoch the program skips), in the vmapped program as in each seed's own."""
    cfg = small_config("total_env_steps=320", "eval.interval=2", tmp_path=tmp_path)
    train = jre.make_train(cfg)
    keys = jax.vmap(jax.random.key)(jnp.arange(2))
    batched_state, batched = jax.jit(jax.vmap(train))(keys)
    assert batched["train/loss"].shape == (2, 5)
    assert batched["evaluate/episode_return"].shape == (2, 3)
    assert batched_state.counters.epoch.tolist() == [5, 5]
    single = jax.jit(train)
    for i in range(2):
        state, metrics = single(jax.random.key(i))
        assert int(state.counters.epoch) == 5
        for k in ("train/loss", "evaluate/episode_return"):
            np.testing.assert_allclose(batched[k][i], metrics[k], rtol=1e-4, atol=1e-5)
        for a, b in zip(
            jax.tree.leaves(state.train.params),
            jax.tree.leaves(batched_state.train.params),
            strict=True,
        ):
            np.testing.assert_allclose(np.asarray(b)[i], np.asarray(a), rtol=1e-4, atol=1e-5)


def test_make_train_equals_the_engine_epochs(small_cfg):
    """The pure function and the driver's epoch loop are the same computation."""
    engine = jre.build(small_cfg)
    state = engine.init(jax.random.key(5))
    for _ in range(engine.num_epochs):
        state, _ = engine.epoch(state)
    pure_state, _ = jax.jit(jre.make_train(small_cfg))(jax.random.key(5))
    for a, b in zip(
        jax.tree.leaves(state.train.params), jax.tree.leaves(pure_state.train.params), strict=True
    ):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_warm_up_compiles_every_phase_and_reports_costs(small_cfg):
    engine = jre.build(small_cfg)
    state = engine.init(jax.random.key(0))
    before = jax.tree.map(np.asarray, key_data(state))
    state = engine.warm_up(state)
    assert set(engine.compile_report) == {
        "rollout",
        "evaluate",
        "update_dataset",
        "train",
        "sync_weights",
        "epochs",  # (also `epoch`'s: one epoch is this program with n = 1)
    }
    assert all(r["compile_s"] > 0 for r in engine.compile_report.values())
    assert engine.compile_report["train"]["flops"] > 0
    assert leaves_equal(before, key_data(state))


class _Compiles(logging.Handler):
    """The names of the programs jax compiles while installed (`jax.log_compiles`)."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def emit(self, record):
        message = record.getMessage()
        if message.startswith("Compiling "):
            self.names.append(message.split()[1])

    def __enter__(self):
        self._log = jax.log_compiles()
        self._log.__enter__()
        logging.getLogger("jax").addHandler(self)
        return self

    def __exit__(self, *exc):
        logging.getLogger("jax").removeHandler(self)
        self._log.__exit__(*exc)


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_an_epoch_or_phase_compiles_once_for_the_states_it_returns(tmp_path, algo):
    """A phase's output state has its input's signature (no weakly typed leaf, e.g. gymnax's
    `time + 1`): calling `engine.epoch` or a phase on what it returned compiles nothing."""
    if algo == "dqn":
        dqn = ["algo.name=dqn", "algo.buffer_size=256", "algo.batch_size=16"]
        overrides = [*(o for o in SMALL if not o.startswith("algo.")), *dqn]
        cfg = jre.load_config(None, [*overrides, "algo.learning_starts=0", f"run_dir={tmp_path}"])
    else:
        cfg = small_config(tmp_path=tmp_path)
    engine = jre.build(cfg)
    state = engine.init(jax.random.key(0))
    weak = [
        jax.tree_util.keystr(p)
        for p, x in jax.tree_util.tree_leaves_with_path(state)
        if jax.typeof(x).weak_type
    ]
    assert weak == []
    with _Compiles() as compiles:
        for _ in range(3):
            state, _ = engine.epoch(state)
        for name in ("rollout", "update_dataset", "train", "sync_weights"):
            for _ in range(2):
                state, _ = getattr(engine, name)(state)
    # The epoch (the epochs program with n = 1) and each of the four phases; `epoch` takes the
    # first row of the epochs' metrics with a small jit of its own, compiled once per process.
    names = [n for n in compiles.names if n != "jit(_first_row)"]
    assert names.count("jit(pure_epochs)") == 1, compiles.names
    assert len(names) == 5 and compiles.names.count("jit(_first_row)") <= 1, compiles.names


def test_calls_after_warm_up_run_its_executables(small_cfg):
    """`warm_up` then `engine.epoch` / `epochs` / each phase (the README's order) compiles
    nothing more; inside a user's jit the phases are traced as before."""
    engine = jre.build(small_cfg)
    state = engine.warm_up(engine.init(jax.random.key(0)))
    with _Compiles() as compiles:
        state, _ = engine.epoch(state)
        state, _, done = engine.epochs(state, 2)
        for name in ("rollout", "update_dataset", "train", "sync_weights"):
            state, _ = getattr(engine, name)(state)
        engine.evaluate(state)
    assert compiles.names == [] and int(done) == 2
    loss = jax.jit(lambda s: engine.train(s)[1]["train/loss"])(state)
    assert np.isfinite(loss)
    # A donated state is named as such, not as XLA's "Array has been deleted".
    old = state
    state, _ = engine.epoch(old)
    with pytest.raises(ValueError, match="donated to an earlier call"):
        engine.epoch(old)
    with pytest.raises(ValueError, match=r"engine\.run: the state passed was donated"):
        engine.run(old)


@pytest.mark.parametrize(
    "env_id, action_dim, discrete, fragment",
    [
        (
            "CartPole-v1",
            3,
            True,
            "logits) has shape (3,) per observation, but env 'CartPole-v1' has 2 discrete actions",
        ),
        (
            "Pendulum-v1",
            2,
            False,
            "policy mean has shape (2,) per observation, but env "
            "'Pendulum-v1' has continuous actions of shape (1,)",
        ),
        ("Pendulum-v1", 1, True, "gives no log-std"),
    ],
)
def test_a_network_head_that_does_not_fit_the_action_space_is_refused_at_build(
    tmp_path, env_id, action_dim, discrete, fragment
):
    """A head of the wrong width would act outside the action space (an argmax over 3 logits
    sends action 2 to a 2-action CartPole) or fail with a reshape error: refused when the
    engine is built, naming the network's output and the env's actions."""
    from jaxrl_engine.algos.networks import ActorCritic
    from jaxrl_engine.algos.ppo import ppo

    cfg = small_config(f"env.id={env_id}", tmp_path=tmp_path)
    spec = jre.build(cfg).spec
    algo = ppo(
        ActorCritic(action_dim=action_dim, discrete=discrete, hidden_sizes=(16, 16)),
        spec,
        num_envs=4,
        num_steps=16,
        num_epochs=4,
        hparams=jre.hparams(cfg),
    )
    with pytest.raises(jre.ShapeMismatchError) as e:
        jre.build(cfg, algorithm=algo)
    assert fragment in str(e.value) and "phase 'rollout'" in str(e.value)


def test_warm_up_names_phase_and_both_shapes_when_policy_and_env_disagree(small_cfg, tmp_path):
    engine = jre.build(small_cfg)  # CartPole: obs (4,)
    acrobot = jre.build(small_config("env.id=Acrobot-v1", tmp_path=tmp_path))  # obs (6,)
    state = engine.init(jax.random.key(0))
    foreign = acrobot.init(jax.random.key(0))
    bad = state.replace(eval_params=foreign.eval_params)
    with pytest.raises(jre.ShapeMismatchError, match=r"phase 'rollout'.*\(4,\)"):
        engine.warm_up(bad)


def test_warm_up_catches_an_env_whose_observations_disagree_with_its_space(small_cfg):
    engine = jre.build(small_cfg)
    state = engine.init(jax.random.key(0))
    env = state.env.replace(obs=jnp.zeros((4, 5)))
    with pytest.raises(jre.ShapeMismatchError, match=r"phase 'rollout'.*\(5,\).*\(4,\)"):
        engine.warm_up(state.replace(env=env))


def test_warm_up_refuses_a_phase_name_it_does_not_know(small_cfg):
    """A typo ("epcohs") must not pass for a phase: it would compile nothing, and the first
    epoch would compile after all."""
    engine = jre.build(small_cfg)
    state = engine.init(jax.random.key(0))
    with pytest.raises(ValueError, match=r"unknown phase\(s\) \['epcohs'\].*'epochs'"):
        engine.warm_up(state, phases=["rollout", "epcohs"])
    assert not engine.compiled("rollout")  # refused before compiling anything
    with pytest.raises(ValueError, match=r"engine.call: unknown phase 'bogus'"):
        engine.call("bogus", state)


def test_a_state_another_engine_made_is_refused_naming_the_leaf(small_cfg, tmp_path):
    """Another env.num_envs keeps the observations' per-env shape (the policy check passes);
    inside jit it would fail with a bare "vmap got inconsistent sizes"."""
    engine = jre.build(small_cfg)  # 4 envs
    other = jre.build(small_config("env.num_envs=8", "eval.num_envs=8", tmp_path=tmp_path))
    state = other.init(jax.random.key(0))
    fits = r"the state does not fit this engine \(.*float32\[8, 4\] in it and float32\[4, 4\]"
    with pytest.raises(jre.ShapeMismatchError, match="engine.warm_up: " + fits):
        engine.warm_up(state)
    with pytest.raises(jre.ShapeMismatchError, match="engine.run: " + fits):
        engine.run(state, run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()  # refused before the run directory is made


def test_continuous_ppo_epoch_runs(tmp_path):
    cfg = small_config(
        "env.id=Pendulum-v1",
        "algo.normalize_obs=true",
        "algo.normalize_reward=true",
        tmp_path=tmp_path,
    )
    engine = jre.build(cfg)
    state, metrics = engine.epoch(engine.init(jax.random.key(0)))
    assert np.isfinite(float(metrics["train/loss"]))
    assert float(state.train.obs_norm.count) > 1


def test_episode_stats_match_a_step_by_step_count():
    """The vectorised statistics equal a plain loop over steps (episodes spanning rollouts,
    several ends per env in one rollout, envs with no end)."""
    from jaxrl_engine.core.phases import episode_stats
    from jaxrl_engine.core.state import EpisodeStats

    rng = np.random.default_rng(0)
    T, N = 12, 5
    stats = EpisodeStats.zeros(N)
    ret, length = np.zeros(N, np.float32), np.zeros(N, np.int64)
    for _ in range(4):
        reward = rng.uniform(-1, 2, (T, N)).astype(np.float32)
        done = rng.uniform(size=(T, N)) < 0.2
        done[:, 0] = False  # env 0 never ends
        done[[2, 3, 9], 1] = True  # env 1 ends three times, once on consecutive steps
        ended_returns, ended_lengths = [], []
        for t in range(T):
            ret, length = ret + reward[t], length + 1
            for n in np.flatnonzero(done[t]):
                ended_returns.append(ret[n])
                ended_lengths.append(length[n])
            ret, length = np.where(done[t], 0.0, ret), np.where(done[t], 0, length)
        previous = stats
        stats, metrics = episode_stats(stats, jnp.asarray(reward), jnp.asarray(done))
        np.testing.assert_allclose(stats.current_return, ret, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(stats.current_length, length)
        assert int(metrics["rollout/episodes"]) == len(ended_returns) == int(done.sum())
        assert int(stats.episodes) == int(previous.episodes) + len(ended_returns)
        np.testing.assert_allclose(metrics["rollout/episode_return"], np.mean(ended_returns), 1e-5)
        np.testing.assert_allclose(metrics["rollout/episode_length"], np.mean(ended_lengths))
    # A rollout in which no episode ends keeps the last means.
    stats2, metrics = episode_stats(stats, jnp.ones((T, N)), jnp.zeros((T, N), bool))
    assert float(metrics["rollout/episode_return"]) == float(stats.last_return)
    np.testing.assert_allclose(stats2.current_return, np.asarray(stats.current_return) + T)


def _lapack_calls(compiled_text: str) -> list[str]:
    return [line for line in compiled_text.splitlines() if 'custom_call_target="lapack_' in line]


@pytest.mark.parametrize("algo", ["ppo", "dqn", "sac"])
def test_vmapped_init_runs_each_qr_unbatched_and_equals_per_key_init(algo):
    """Orthogonal init is a QR; vmapped over seeds it must stay one unbatched QR per seed
    (jaxlib's batched CPU QR can deadlock XLA's thread pool: see `one_key_at_a_time`)."""
    config = {"ppo": "ppo_cartpole", "dqn": "dqn_cartpole", "sac": "sac_pendulum"}[algo]
    cfg = jre.load_config(ROOT / "configs" / f"{config}.yaml", ["progress=false"])
    engine = jre.build(cfg)
    keys = jax.random.split(jax.random.key(0), 4)
    batched = jax.jit(jax.vmap(engine.init_pure))
    calls = _lapack_calls(batched.lower(keys).compile().as_text())
    assert calls, "expected the orthogonal initialisers' QR"
    for line in calls:
        operand_shape = line.split("operand_layout_constraints={")[1].split("{")[0]
        assert operand_shape.count(",") == 1, f"batched LAPACK call: {line[:160]}"
    states = batched(keys)
    for i in range(4):
        single = engine.init_pure(keys[i])
        for a, b in zip(jax.tree.leaves(single.train), jax.tree.leaves(states.train), strict=True):
            np.testing.assert_array_equal(np.asarray(b)[i], np.asarray(a))


def test_vmapped_init_does_not_hang_when_called_many_times():
    """Regression: before `one_key_at_a_time`, this loop hung within 200 calls in each of 3
    tries on the 2-core CI machine (XLA's pool threads all blocked in batched QRs)."""
    import subprocess
    import sys

    script = (
        "import jax, jaxrl_engine as jre\n"
        "engine = jre.build(jre.load_config(None, ['progress=false']))\n"
        "init = jax.jit(jax.vmap(engine.init_pure))\n"
        "for i in range(1000):\n"
        "    jax.block_until_ready(init(jax.random.split(jax.random.key(i), 4)))\n"
        "print('done')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "done", proc.stderr[-2000:]


def test_hparams_given_to_init_or_with_hparams_are_checked(small_cfg):
    """Another algorithm's hyperparameters, a missing value, or a stacked sweep where one
    setting is expected: a ValueError naming the field, before anything is compiled. A Python
    int becomes a float (gamma=1 is not an int32 leaf, which would compile again)."""
    from jaxrl_engine.algos.dqn import DQNHParams

    engine, key = jre.build(small_cfg), jax.random.key(0)
    hp = jre.hparams(small_cfg)
    stacked = jax.tree.map(lambda a: jnp.stack([jnp.float32(a)] * 2), hp)
    for call, message in [
        (lambda: engine.init(key, DQNHParams()), "must be a PPOHParams"),
        (lambda: engine.init(key, hp.replace(lr=None)), "hparams.lr is None"),
        (lambda: engine.init(key, stacked), "hparams.lr has shape (2,)"),
    ]:
        with pytest.raises(ValueError) as e:
            call()
        assert message in str(e.value)
    state = engine.init(key, hp.replace(gamma=1))
    assert state.hparams.gamma.dtype == jnp.float32 and float(state.hparams.gamma) == 1.0
    with pytest.raises(ValueError, match="must be a PPOHParams"):
        engine.with_hparams(state, DQNHParams())
    lrs = jax.vmap(engine.init)(jax.random.split(key, 2), stacked).hparams.lr
    assert lrs.shape == (2,)


def test_hparams_of_a_custom_algorithm_may_be_any_pytree_of_numbers():
    """An algorithm of one's own may keep its hyperparameters in a dict (or have none): the
    check then holds them to its structure, and names the leaf at fault."""
    from jaxrl_engine.core.state import check_hparams

    check_hparams({"lr": 0.1, "gamma": 0.9}, {"lr": 0.2, "gamma": 0.99}, "engine.init", True)
    check_hparams({"anything": None}, None, "engine.init")  # no hyperparameters: nothing held
    for bad, message in [
        ({"lr": 0.1}, "not the algorithm's"),
        ({"lr": None, "gamma": 0.9}, "not the algorithm's"),
        ({"lr": np.ones(2), "gamma": 0.9}, "hparams['lr'] has shape (2,)"),
        ({"lr": "0.1", "gamma": 0.9}, "hparams['lr'] is '0.1': a number is needed"),
    ]:
        with pytest.raises(ValueError) as e:
            check_hparams(bad, {"lr": 0.2, "gamma": 0.99}, "engine.init", scalars=True)
        assert message in str(e.value), str(e.value)


def test_a_value_or_q_network_giving_batch_by_one_is_refused_not_broadcast(tmp_path):
    # A critic ending in Dense(1) without a squeeze gives [batch, 1]: against [batch] targets
    # its loss would broadcast to [batch, batch] and train wrong without an error.
    import flax.linen as nn

    from jaxrl_engine.algos.networks import MLP
    from jaxrl_engine.compose import num_epochs

    class UnsqueezedActorCritic(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(2)(x), None, nn.Dense(1)(x)

    cfg = small_config(tmp_path=tmp_path)
    spec = jre.build(cfg).spec
    algo = cfg.algo.build(spec, 4, num_epochs(cfg), network=UnsqueezedActorCritic())
    with pytest.raises(jre.ShapeMismatchError) as e:
        jre.build(cfg, algorithm=algo)
    assert str(e.value).startswith("phase 'rollout': the PPO network's value has shape (4, 1)")
    assert "out[..., 0]" in str(e.value)

    class UnsqueezedCritic(nn.Module):
        @nn.compact
        def __call__(self, obs, action):
            return nn.Dense(1)(jnp.concatenate([obs, action], -1))

    sac = ["algo.name=sac", "env.id=Pendulum-v1", "env.num_envs=4", "algo.num_steps=8"]
    more = ["algo.buffer_size=64", "algo.batch_size=16", "algo.learning_starts=32"]
    cfg = jre.load_config(None, [*sac, *more, "total_env_steps=256", f"run_dir={tmp_path}"])
    spec = jre.build(cfg).spec
    network = (MLP((16,), 2), UnsqueezedCritic())
    algo = cfg.algo.build(spec, cfg.env.num_envs, num_epochs(cfg), network=network)
    engine = jre.build(cfg, algorithm=algo)
    with pytest.raises(jre.ShapeMismatchError, match=r"phase 'train': the critic's Q-value has"):
        engine.warm_up(engine.init(jax.random.key(0)))


def test_an_evaluation_far_longer_than_training_between_two_is_warned_about(tmp_path):
    cfg = small_config("eval.num_envs=1", "eval.episodes=100000", tmp_path=tmp_path)
    with pytest.warns(UserWarning, match=r"each evaluation steps the env up to 50,000,000 times"):
        jre.build(cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jre.build(small_config(tmp_path=tmp_path))  # the usual sizes: nothing said
