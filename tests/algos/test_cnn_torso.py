"""The CNN torso: chosen for image observations, its shapes, its config keys and refusals, and
PPO and DQN training with it on Breakout-MinAtar ([10, 10, 4] observations)."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_engine as jre
from jaxrl_engine.algos.networks import CNN, MLP, ActorCritic, ConvSpec, conv_impl
from jaxrl_engine.algos.torso import CNNConfig, conv_spec
from jaxrl_engine.envs.gymnax_env import make_env

ROOT = Path(__file__).resolve().parents[2]
MINATAR = make_env("Breakout-MinAtar").spec(make_env("Breakout-MinAtar").params)
CARTPOLE = make_env("CartPole-v1").spec(make_env("CartPole-v1").params)
TINY = [
    "env.id=Breakout-MinAtar",
    "env.num_envs=4",
    "eval.num_envs=2",
    "algo.num_steps=8",
    "total_env_steps=64",
    "loggers=[jsonl]",
]
TINY_PPO = [*TINY, "algo.num_minibatches=2", "algo.update_epochs=1", "algo.hidden_sizes=[32]"]
TINY_DQN = [
    *TINY,
    "algo.name=dqn",
    "algo.buffer_size=64",
    "algo.batch_size=8",
    "algo.learning_starts=0",
    "algo.hidden_sizes=[32]",
]


def test_minatar_spec_declares_channels_last_images():
    assert MINATAR.obs_shape == (10, 10, 4) and MINATAR.obs_layout == "hwc"
    assert CARTPOLE.obs_layout is None


def test_auto_picks_the_cnn_for_images_and_the_mlp_otherwise():
    assert conv_spec("auto", CNNConfig(), MINATAR) == ConvSpec((16,), (3,), (1,), "hwc")
    assert conv_spec("auto", CNNConfig(), CARTPOLE) is None
    assert conv_spec("mlp", CNNConfig(), MINATAR) is None
    cnn = CNNConfig(channels=[8, 4], kernels=[3, 2], strides=[2, 1])
    assert conv_spec("cnn", cnn, MINATAR) == ConvSpec((8, 4), (3, 2), (2, 1), "hwc")


def test_actor_critic_with_a_cnn_on_hwc_observations():
    net = ActorCritic(action_dim=3, discrete=True, hidden_sizes=(32,), conv=ConvSpec())
    obs = jnp.ones((5, 10, 10, 4))
    params = net.init(jax.random.key(0), obs)
    logits, log_std, value = net.apply(params, obs)
    assert logits.shape == (5, 3) and log_std is None and value.shape == (5,)
    actor = params["params"]["CNN_0"]
    assert actor["Conv_0"]["kernel"].shape == (3, 3, 4, 16)  # HWIO: 4 input channels
    # VALID 3x3 conv: 8 x 8 x 16 features into the first Dense layer
    assert actor["MLP_0"]["Dense_0"]["kernel"].shape == (8 * 8 * 16, 32)


def test_a_chw_layout_reads_the_same_images_transposed():
    conv = ConvSpec((6,), (3,), (2,), "hwc")
    hwc = CNN(conv, (16,), 3)
    chw = CNN(ConvSpec((6,), (3,), (2,), "chw"), (16,), 3)
    x = jax.random.normal(jax.random.key(1), (2, 9, 7, 4))
    params = hwc.init(jax.random.key(0), x)
    want = hwc.apply(params, x)
    got = chw.apply(params, x.transpose((0, 3, 1, 2)))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("channels", "kernels", "strides", "layout", "shape"),
    [
        ((16,), (3,), (1,), "hwc", (6, 10, 10, 4)),  # MinAtar's torso
        ((8, 16), (4, 3), (2, 1), "hwc", (3, 11, 9, 2)),  # strided, uneven, two layers
        ((5,), (2,), (3,), "chw", (2, 3, 8, 7)),  # stride > kernel, channels first
    ],
)
def test_matmul_and_xla_convolutions_agree(channels, kernels, strides, layout, shape):
    """algo.cnn.impl: the same parameters (names, shapes, init), outputs and gradients equal to
    float rounding, so the choice changes speed only."""
    nets = {
        impl: CNN(ConvSpec(channels, kernels, strides, layout, impl), (32,), 3)
        for impl in ("matmul", "xla")
    }
    x = jax.random.bernoulli(jax.random.key(2), 0.3, shape)  # MinAtar-like boolean images
    params = {impl: net.init(jax.random.key(0), x) for impl, net in nets.items()}
    assert jax.tree.structure(params["matmul"]) == jax.tree.structure(params["xla"])
    for a, b in zip(jax.tree.leaves(params["matmul"]), jax.tree.leaves(params["xla"]), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    p = params["xla"]
    out = {impl: net.apply(p, x) for impl, net in nets.items()}
    np.testing.assert_allclose(out["matmul"], out["xla"], rtol=1e-5, atol=1e-5)
    grads = {
        impl: jax.grad(lambda q, net=net: (net.apply(q, x) ** 2).sum())(p)
        for impl, net in nets.items()
    }
    for a, b in zip(jax.tree.leaves(grads["matmul"]), jax.tree.leaves(grads["xla"]), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


def test_cnn_impl_key_reaches_the_network_and_auto_is_matmul_on_cpu():
    engine = jre.build(jre.load_config(None, [*TINY_PPO, "algo.cnn.impl=xla"]))
    assert engine.algo.static["network"].conv.impl == "xla"
    assert jre.load_config(None, TINY_PPO).algo.cnn.impl == "auto"
    assert conv_impl("auto") == ("matmul" if jax.default_backend() == "cpu" else "xla")
    assert conv_impl("xla") == "xla" and conv_impl("matmul") == "matmul"


def test_ppo_on_minatar_builds_the_cnn_actor_critic():
    engine = jre.build(jre.load_config(None, TINY_PPO))
    network = engine.algo.static["network"]
    assert isinstance(network, ActorCritic) and network.conv == ConvSpec()
    state = engine.init(jax.random.key(0))
    assert set(state.train.params["params"]) == {"CNN_0", "CNN_1"}
    obs = jnp.zeros((4, 10, 10, 4))
    action, extras = engine.algo.act(state.eval_params, obs, jax.random.key(1), False)
    assert action.shape == (4,) and extras["log_prob"].shape == (4,)
    head, _, value = network.apply(state.train.params, obs)
    assert head.shape == (4, engine.spec.action.num_actions) and value.shape == (4,)


def test_torso_mlp_flattens_images():
    engine = jre.build(jre.load_config(None, [*TINY_PPO, "algo.torso=mlp"]))
    assert engine.algo.static["network"].conv is None
    state = engine.init(jax.random.key(0))
    assert set(state.train.params["params"]) == {"MLP_0", "MLP_1"}
    assert state.train.params["params"]["MLP_0"]["Dense_0"]["kernel"].shape == (400, 32)


def test_dqn_on_minatar_uses_a_cnn_q_network():
    engine = jre.build(jre.load_config(None, TINY_DQN))
    network = engine.algo.static["network"]
    assert isinstance(network, CNN) and network.conv == ConvSpec()
    state = engine.init(jax.random.key(0))
    q = engine.algo.static["q_values"](state.train.params, jnp.zeros((5, 10, 10, 4), jnp.bool_))
    assert q.shape == (5, 3)
    cartpole = jre.build(jre.load_config(None, ["algo.name=dqn"]))
    assert isinstance(cartpole.algo.static["network"], MLP)


REFUSED = {
    "cnn on vector observations": (
        ["algo.torso=cnn"],
        ["algo.torso=cnn", "CartPole-v1", "[4]", "algo.torso=mlp"],
    ),
    "dqn cnn on vector observations": (
        ["algo.name=dqn", "algo.torso=cnn"],
        ["algo.torso=cnn", "CartPole-v1", "[4]"],
    ),
    "an unknown torso": (["algo.torso=resnet"], ["algo.torso", "'auto', 'mlp' or 'cnn'"]),
    "layers of different lengths": (
        ["env.id=Breakout-MinAtar", "algo.cnn.kernels=[3,3]"],
        ["algo.cnn", "algo.cnn.channels (1 entries)", "algo.cnn.kernels (2)"],
    ),
    "no layers": (
        ["env.id=Breakout-MinAtar", "algo.cnn.channels=[]", "algo.cnn.kernels=[]"],
        ["algo.cnn", "at least one layer"],
    ),
    "a kernel larger than the image": (
        ["env.id=Breakout-MinAtar", "algo.cnn.kernels=[11]"],
        ["algo.cnn.kernels", "11x11", "10x10", "[10, 10, 4]"],
    ),
    "layers that shrink the image away": (
        [
            "env.id=Breakout-MinAtar",
            "algo.cnn.channels=[8,8,8]",
            "algo.cnn.kernels=[3,3,3]",
            "algo.cnn.strides=[2,2,1]",
        ],
        ["algo.cnn.kernels", "conv layer 2", "1x1 feature map"],
    ),
    "a zero stride": (["algo.cnn.strides=[0]"], ["algo.cnn.strides.0", "greater than 0"]),
}


@pytest.mark.parametrize(("overrides", "fragments"), REFUSED.values(), ids=REFUSED.keys())
def test_bad_torso_configs_are_refused_naming_the_key(overrides, fragments):
    with pytest.raises(jre.ConfigError) as info:
        jre.load_config(None, overrides)
    for fragment in fragments:
        assert fragment in str(info.value), (fragment, str(info.value))


def _finite_epochs(engine, epochs):
    """`epochs` epochs from seed 0; every epoch's loss must be finite."""
    state = engine.init(jax.random.key(0))
    losses = []
    for _ in range(epochs):
        state, metrics = engine.epoch(state)
        losses.append(float(metrics["train/loss"]))
    assert np.isfinite(losses).all(), losses
    return state


def test_the_shipped_minatar_config_with_the_cnn_trains_a_few_epochs_with_finite_losses():
    cfg = jre.load_config(
        ROOT / "configs" / "ppo_minatar_breakout.yaml",
        [
            "env.num_envs=8",
            "algo.num_steps=16",
            "total_env_steps=384",
            "eval.num_envs=2",
            "algo.torso=cnn",  # the shipped config uses gymnax-blines' MLP; the CNN in its place
        ],
    )
    assert cfg.algo.torso == "cnn" and cfg.env.id == "Breakout-MinAtar"
    engine = jre.build(cfg)
    state = _finite_epochs(engine, 3)
    assert int(state.counters.env_steps) == 3 * 8 * 16
    # the parameters moved: the losses come from gradient steps through the conv layers
    before = engine.init(jax.random.key(0)).train.params["params"]["CNN_0"]["Conv_0"]["kernel"]
    after = state.train.params["params"]["CNN_0"]["Conv_0"]["kernel"]
    assert not np.allclose(np.asarray(before), np.asarray(after))
    _, eval_metrics = engine.evaluate(state)
    assert np.isfinite(float(eval_metrics["evaluate/episode_return"]))


def test_dqn_with_the_cnn_trains_a_few_epochs_with_finite_losses():
    _finite_epochs(jre.build(jre.load_config(None, [*TINY_DQN, "total_env_steps=96"])), 3)


def test_cnn_settings_that_no_network_uses_are_not_checked():
    """With both networks from a torch factory no flax torso is built: `algo.cnn.*` is not
    read (as with algo.torso=mlp), so an 11x11 kernel on a 10x10 image is not refused."""
    base = ["env.id=Breakout-MinAtar", "algo.cnn.kernels=[11]"]
    torch_both = ["algo.torch_policy.factory=torch_nets:cnn", "algo.torch_policy.critic=torch"]
    jre.load_config(None, [*base, *torch_both, "algo.torso=cnn"])
    jre.load_config(None, [*base, "algo.torso=mlp"])
    with pytest.raises(jre.ConfigError, match=r"algo\.cnn\.kernels"):  # the flax critic's torso
        jre.load_config(None, [*base, "algo.torch_policy.factory=torch_nets:cnn", "algo.torso=cnn"])
