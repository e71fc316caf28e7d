"""The torch CNN on [H, W, C] observations: its layout from the env spec or
`algo.torch_policy.obs_layout`, refusals of a mismatch, both paths equal to torch, PPO wiring."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import jaxrl_engine as jre  # noqa: E402
from jaxrl_engine.algos.networks import CNN  # noqa: E402
from jaxrl_engine.interop.convert import module_to_jax  # noqa: E402
from jaxrl_engine.interop.torch_layers import ChannelsFirst  # noqa: E402
from jaxrl_engine.interop.torch_nets import cnn  # noqa: E402
from jaxrl_engine.interop.torch_policy import TorchFunction  # noqa: E402

CNN_FACTORY = "algo.torch_policy.factory=jaxrl_engine.interop.torch_nets:cnn"
TINY = [
    "env.id=Breakout-MinAtar",
    "env.num_envs=4",
    "eval.num_envs=2",
    "algo.num_steps=8",
    "algo.num_minibatches=2",
    "algo.update_epochs=1",
    "algo.hidden_sizes=[16]",
    "total_env_steps=64",
    "loggers=[jsonl]",
    CNN_FACTORY,
    "algo.torch_policy.kwargs={channels: [8, 8], hidden: 16}",
]


def _minatar_obs(n):
    return np.random.default_rng(0).random((n, 10, 10, 4)).astype(np.float32)


def test_hwc_cnn_reads_the_last_axis_as_channels():
    module = cnn((10, 10, 4), 3)
    convs = [m for m in module.modules() if isinstance(m, torch.nn.Conv2d)]
    assert isinstance(module[0], ChannelsFirst) and convs[0].in_channels == 4
    chw = cnn((4, 10, 10), 3, obs_layout="chw")
    assert not any(isinstance(m, ChannelsFirst) for m in chw.modules())
    assert next(m for m in chw.modules() if isinstance(m, torch.nn.Conv2d)).in_channels == 4


@pytest.mark.parametrize("path", ["fast", "universal"])
def test_both_paths_equal_torch_on_hwc_observations(path):
    torch.manual_seed(0)
    module = cnn((10, 10, 4), 3, 1.0, channels=(16, 32)).eval()
    x = _minatar_obs(9)
    with torch.no_grad():
        want = module(torch.from_numpy(x)).numpy()
    fn = TorchFunction(module, path)
    got = jax.jit(fn)(fn.params(), jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_fast_path_conversion_of_the_hwc_cnn_equals_torch_to_1e_5():
    """The converter's own output (conv weights kept OIHW, the transpose before the first
    Conv2d, the flatten before the first Linear in torch's C, H, W order)."""
    torch.manual_seed(1)
    module = cnn((10, 10, 4), 5, 1.0, channels=(8,), hidden=32).eval()
    apply, params = module_to_jax(module)
    assert params["1.weight"].shape == (8, 4, 3, 3)  # OIHW, as torch holds it
    x = _minatar_obs(16)
    with torch.no_grad():
        want = module(torch.from_numpy(x)).numpy()
    got = np.asarray(jax.jit(apply)(params, jnp.asarray(x)))
    assert np.abs(got - want).max() <= 1e-5


REFUSED = {
    "MinAtar read as chw": ((10, 10, 4), {"obs_layout": "chw"}, ["look hwc", "obs_layout=hwc"]),
    "Atari frames read as hwc": ((4, 84, 84), {}, ["look chw", "obs_layout=chw"]),
    "in_channels that are not the channel axis": (
        (10, 10, 4),
        {"in_channels": 10},
        ["in_channels=10", "4 channels"],
    ),
    "vector observations": ((8,), {}, ["not images", "[8]"]),
    "an unknown layout": ((10, 10, 4), {"obs_layout": "nhwc"}, ["'nhwc'", "'hwc', 'chw'"]),
}


@pytest.mark.parametrize(("shape", "kwargs", "fragments"), REFUSED.values(), ids=REFUSED.keys())
def test_the_torch_cnn_refuses_a_layout_mismatch(shape, kwargs, fragments):
    with pytest.raises(ValueError) as info:
        cnn(shape, 3, **kwargs)
    for fragment in fragments:
        assert fragment in str(info.value), (fragment, str(info.value))


def test_the_config_passes_the_env_layout_and_the_critic_is_a_cnn():
    engine = jre.build(jre.load_config(None, TINY))
    network = engine.algo.static["network"]
    actor_convs = [m for m in network.actor_module.modules() if isinstance(m, torch.nn.Conv2d)]
    assert isinstance(network.actor_module[0], ChannelsFirst)
    assert actor_convs[0].in_channels == 4  # MinAtar's channels, not its 10 rows
    assert isinstance(network.flax_critic, CNN)  # critic: jax follows algo.torso (auto)


@pytest.mark.parametrize(
    ("overrides", "fragments"),
    [
        (
            ["algo.torch_policy.obs_layout=chw"],
            ["algo.torch_policy.obs_layout=chw", "Breakout-MinAtar declares hwc", "[10, 10, 4]"],
        ),
        (
            ["algo.torch_policy.kwargs={obs_layout: chw}"],
            ["algo.torch_policy.factory", "look hwc", "in_shape=(10, 10, 4)"],
        ),
    ],
    ids=["config flag", "factory kwargs"],
)
def test_a_layout_that_contradicts_the_env_is_refused(overrides, fragments):
    with pytest.raises(jre.ConfigError) as info:
        jre.build(jre.load_config(None, [*TINY, *overrides]))
    for fragment in fragments:
        assert fragment in str(info.value), (fragment, str(info.value))


def test_ppo_trains_the_torch_cnn_on_minatar_alike_on_both_paths():
    results = []
    for path in ("fast", "universal"):
        engine = jre.build(jre.load_config(None, [*TINY, f"algo.torch_policy.path={path}"]))
        state = engine.init(jax.random.key(0))
        state, metrics = engine.epoch(state)
        assert np.isfinite(float(metrics["train/loss"]))
        results.append((float(metrics["train/loss"]), state.train.params["actor"]["1.weight"]))
    (loss_fast, w_fast), (loss_universal, w_universal) = results
    np.testing.assert_allclose(loss_fast, loss_universal, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(w_fast), np.asarray(w_universal), rtol=1e-4, atol=1e-5)
