"""TD3: actions inside the bounds, noise-free deterministic acting, delayed actor and target
updates, discrete envs refused, and hyperparameter sweeps under vmap equal to separate runs."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_engine as jre
from jaxrl_engine.algos.td3 import TD3Config

ROOT = Path(__file__).resolve().parents[2]
SMALL = [
    "algo.name=td3",
    "env.id=Pendulum-v1",
    "env.num_envs=4",
    "eval.num_envs=4",
    "eval.interval=4",
    "algo.num_steps=8",
    "algo.buffer_size=200",
    "algo.batch_size=16",
    "algo.learning_starts=64",
    "algo.train_ratio=0.25",
    "algo.hidden_sizes=[16,16]",
    "total_env_steps=256",
    "progress=false",
]


def config(*overrides: str, tmp_path=None) -> jre.Config:
    extra = [f"run_dir={tmp_path}"] if tmp_path is not None else []
    return jre.load_config(None, [*SMALL, *extra, *overrides])


def host(tree):
    return jax.tree.map(lambda x: np.array(x, copy=True), tree)


def same(a, b) -> bool:
    return all(
        np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return jre.build(config("algo.learning_starts=0", tmp_path=tmp_path_factory.mktemp("td3")))


def test_the_shipped_config_and_the_defaults_are_td3():
    cfg = jre.load_config(ROOT / "configs/td3_pendulum.yaml", ["progress=false"])
    assert isinstance(cfg.algo, TD3Config) and cfg.env.id == "Pendulum-v1"
    default = TD3Config()
    assert (default.train_ratio, default.batch_size, default.hidden_sizes) == (1.0, 256, [256, 256])
    assert (default.actor_lr, default.critic_lr, default.tau) == (1e-3, 1e-3, 0.005)
    assert (default.exploration_noise, default.policy_noise, default.noise_clip) == (0.1, 0.2, 0.5)
    assert default.policy_delay == 2


@pytest.mark.parametrize("random", [False, True], ids=["policy", "warm_up"])
def test_actions_have_the_env_shape_and_stay_in_bounds_even_with_huge_weights(engine, random):
    state = engine.init(jax.random.key(0))
    params = engine.algo.acting_params(state.train, engine.hparams)
    huge = jax.tree.map(lambda x: 1000.0 * x, params["actor"])
    obs = jnp.linspace(-10.0, 10.0, 64 * 3).reshape(64, 3)
    for actor in (params["actor"], huge):
        acting = {**params, "actor": actor, "random": jnp.asarray(random)}
        for deterministic in (False, True):
            action, extras = engine.algo.act(acting, obs, jax.random.key(1), deterministic)
            assert action.shape == (64, *engine.spec.action.shape) == (64, 1)
            assert extras == {}
            assert float(action.min()) >= -2.0 and float(action.max()) <= 2.0
    # Huge weights saturate tanh: the deterministic actions are at the bounds themselves.
    action, _ = engine.algo.act({**params, "actor": huge}, obs, jax.random.key(1), True)
    np.testing.assert_allclose(np.abs(np.asarray(action)), 2.0, rtol=1e-6)


def test_deterministic_acting_is_the_noise_free_actor_and_repeatable(engine):
    state = engine.init(jax.random.key(0))
    params = engine.algo.acting_params(state.train, engine.hparams)
    assert not bool(params["random"])  # learning_starts=0
    obs = jax.random.normal(jax.random.key(2), (32, 3))
    act = engine.algo.act
    first, _ = act(params, obs, jax.random.key(1), True)
    again, _ = act(params, obs, jax.random.key(7), True)
    np.testing.assert_array_equal(np.asarray(first), np.asarray(again))
    actor = engine.algo.static["actor"]
    want = 2.0 * jnp.tanh(actor.apply(params["actor"], obs))  # Pendulum: [-2, 2]
    np.testing.assert_allclose(np.asarray(first), np.asarray(want), rtol=1e-6, atol=1e-6)
    # Exploration adds noise of std `exploration_noise`; with none it is the actor itself.
    noisy, _ = act(params, obs, jax.random.key(1), False)
    other, _ = act(params, obs, jax.random.key(7), False)
    assert not np.array_equal(np.asarray(noisy), np.asarray(other))
    assert not np.array_equal(np.asarray(noisy), np.asarray(first))
    quiet, _ = act({**params, "noise": jnp.float32(0.0)}, obs, jax.random.key(1), False)
    np.testing.assert_allclose(np.asarray(quiet), np.asarray(first), rtol=1e-6, atol=1e-6)


def test_actor_and_targets_change_only_every_policy_delay_gradient_steps(tmp_path):
    # 4 envs x 4 steps = 16 env steps per epoch, 2 gradient steps each, policy_delay=3: the
    # actor and targets move in epochs 2, 3, 5, 6 (steps 3, 6, 9, 12), not 1, 4, 7. A delay
    # ignored, a count reset each epoch, counted per epoch or off by one all give other epochs.
    grad_steps = 2
    cfg = config(
        "algo.num_steps=4",
        f"algo.train_ratio={grad_steps / 16}",
        "algo.learning_starts=0",
        "algo.policy_delay=3",
        "total_env_steps=112",  # 7 epochs
        tmp_path=tmp_path,
    )
    engine = jre.build(cfg)
    state = engine.init(jax.random.key(0))
    changed = []
    for epoch in range(1, engine.num_epochs + 1):
        before = host((state.train.params, state.train.target_actor, state.train.target_critic))
        state, metrics = engine.epoch(state)
        after = host((state.train.params, state.train.target_actor, state.train.target_critic))
        (p0, ta0, tc0), (p1, ta1, tc1) = before, after
        assert not same(p0["critic"], p1["critic"]), f"critic frozen in epoch {epoch}"
        moved = [not same(p0["actor"], p1["actor"]), not same(ta0, ta1), not same(tc0, tc1)]
        assert len(set(moved)) == 1, f"epoch {epoch}: actor, targets moved: {moved}"
        changed.append(moved[0])
        for key in ("train/critic_loss", "train/actor_loss", "train/q_mean"):
            assert np.isfinite(float(metrics[key])), key
    # Gradient steps are counted over the run: epoch e makes steps (e-1)*g+1 .. e*g.
    want = [
        any(n % 3 == 0 for n in range((e - 1) * grad_steps + 1, e * grad_steps + 1))
        for e in range(1, engine.num_epochs + 1)
    ]
    assert changed == want == [False, True, True, False, True, True, False]
    assert int(state.train.schedule.grad_steps) == engine.num_epochs * grad_steps


def test_a_discrete_env_is_refused_naming_the_algorithm_and_env(tmp_path):
    # Refused when the config is read, before anything is built.
    with pytest.raises(jre.ConfigError, match=r"algo\.name=td3 needs a continuous.*CartPole-v1"):
        config("env.id=CartPole-v1", tmp_path=tmp_path)


def test_vmapped_actor_lr_sweep_equals_separate_runs(tmp_path):
    cfg = config(tmp_path=tmp_path)
    train = jre.make_train(cfg)
    hp = jre.hparams(cfg)
    settings = [hp.replace(actor_lr=3e-4), hp.replace(actor_lr=1e-3)]
    stacked = jax.tree.map(
        lambda *x: jnp.stack([jnp.asarray(v, jnp.float32) for v in x]), *settings
    )
    keys = jnp.stack([jax.random.key(0), jax.random.key(0)])  # same seed: only actor_lr differs
    batched, _ = jax.jit(jax.vmap(train))(keys, stacked)
    single = jax.jit(train)
    actors = []
    for i, setting in enumerate(settings):
        state, _ = single(jax.random.key(0), setting)
        for a, b in zip(
            jax.tree.leaves(state.train.params),
            jax.tree.leaves(batched.train.params),
            strict=True,
        ):
            np.testing.assert_allclose(np.asarray(b)[i], np.asarray(a), rtol=1e-5, atol=1e-6)
        actors.append(host(state.train.params["actor"]))
    assert not same(*actors)  # the learning rate reached the actor's optimizer


OU = ["algo.noise=ou", "algo.learning_starts=0", "algo.exploration_noise=0.2"]


def noise_of_a_rollout(cfg: jre.Config) -> tuple[jre.Engine, np.ndarray]:
    """(engine, the rollout's noise [T, num_envs]): its actions minus the noise-free actor's
    actions at the same observations, in [-1, 1] units (Pendulum's actions are 2x those)."""
    engine = jre.build(cfg)
    state = engine.init(jax.random.key(0))
    state, _ = engine.builder.rollout(state)
    traj = state.buffer  # the replay buffer holds the one rollout, [T, num_envs, ...]
    steps = engine.num_steps
    obs = np.asarray(traj.data.obs[:steps]).reshape(-1, 3)
    action = np.asarray(traj.data.action[:steps]).reshape(-1)
    mean, _ = engine.algo.act(state.eval_params, jnp.asarray(obs), jax.random.key(0), True)
    noise = (action - np.asarray(mean).reshape(-1)) / 2.0
    return engine, noise.reshape(steps, engine.num_envs)


def test_ou_noise_makes_rollout_actions_temporally_correlated(tmp_path):
    # Zero-mean Gaussian noise is independent from step to step; an Ornstein-Uhlenbeck process
    # (theta * dt = 0.0015 per step) keeps almost all of the previous step's noise. 64 envs x
    # 48 steps, sigma 0.2: no action reaches the [-1, 1] clip for these seeds, so action minus
    # actor is the noise itself.
    sizes = ["env.num_envs=64", "algo.num_steps=48", "algo.buffer_size=4096"]
    _, gaussian = noise_of_a_rollout(
        config(*sizes, "algo.learning_starts=0", "algo.exploration_noise=0.2", tmp_path=tmp_path)
    )
    engine, ou = noise_of_a_rollout(config(*sizes, *OU, tmp_path=tmp_path))
    assert engine.algo.explore is not None
    assert np.abs(ou).max() < 1.0 and np.abs(gaussian).max() < 1.0

    def lag1(x):
        return np.corrcoef(x[:-1].reshape(-1), x[1:].reshape(-1))[0, 1]

    assert abs(lag1(gaussian)) < 0.1
    assert lag1(ou) > 0.9
    # The process's own law: x_t = (1 - theta dt) x_{t-1} + sigma sqrt(dt) N(0, 1) from x_0 = 0,
    # so Var[x_t] = sigma^2 dt (1 - a^(2t)) / (1 - a^2), a = 1 - theta dt; across 64 envs.
    a, t = 1 - 0.15 * 0.01, np.arange(1, 49)
    var = 0.2**2 * 0.01 * (1 - a ** (2 * t)) / (1 - a**2)
    ratio = ou.var(axis=1).mean() / var.mean()
    assert 0.8 < ratio < 1.2, ratio
    # Gaussian noise has the configured std at every step.
    assert 0.18 < gaussian.std() < 0.22


def test_ou_noise_restarts_at_each_episode_start():
    # One env whose noise stands at 0.9, stepped with the same key three ways: within an episode
    # the value decays and takes a step; at an episode's first observation it starts again from
    # 0 (only the step); from 0 within an episode, the step alone.
    cfg = TD3Config(noise="ou", exploration_noise=0.5, hidden_sizes=[8])
    spec = jre.build(config("algo.hidden_sizes=[8]")).spec
    algo = cfg.build(spec, num_envs=1, num_epochs=1)
    params = {
        "actor": algo.init(jax.random.key(0), algo.hparams).params["actor"],
        "random": jnp.asarray(False),
        "noise": jnp.float32(0.5),
        "ou_theta": jnp.float32(0.15),
        "ou_dt": jnp.float32(0.01),
    }
    obs = jnp.zeros((1, 3))
    x = algo.explore.init(jax.random.key(0), 1)
    assert x.shape == (1, 1) and not x.any()
    big = jnp.full((1, 1), 0.9)  # far from what 5 steps of sigma sqrt(dt) reach from 0
    key = jax.random.key(3)
    _, _, carried = algo.explore.act(params, big, obs, jnp.array([False]), key)
    _, _, restarted = algo.explore.act(params, big, obs, jnp.array([True]), key)
    _, _, fresh = algo.explore.act(params, jnp.zeros((1, 1)), obs, jnp.array([False]), key)
    step = float(fresh[0, 0])  # sigma sqrt(dt) N(0, 1) for this key
    np.testing.assert_allclose(float(carried[0, 0]), 0.9 * (1 - 0.0015) + step, rtol=1e-6)
    np.testing.assert_allclose(float(restarted[0, 0]), step, rtol=1e-6)


def test_ou_noise_state_is_in_the_checkpoint_and_a_run_resumes_exactly(tmp_path):
    base = [*OU, "save_interval=2", "eval.interval=2", f"run_dir={tmp_path}"]
    straight = jre.build(config(*base, "name=a"))
    want, summary = straight.run(straight.init(jax.random.key(2)))
    assert summary["epochs"] == 8
    assert want.env.explore.shape == (4, 1) and np.asarray(want.env.explore).any()
    half = jre.build(config(*base, "name=b"))
    mid, _ = half.run(half.init(jax.random.key(2)), num_epochs=4)
    engine, state = jre.resume(tmp_path / "b")
    np.testing.assert_array_equal(np.asarray(state.env.explore), np.asarray(mid.env.explore))
    got, _ = engine.run(state)
    assert same(host(got.train.params), host(want.train.params))
    np.testing.assert_array_equal(np.asarray(got.env.explore), np.asarray(want.env.explore))
