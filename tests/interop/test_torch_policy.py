"""Torch modules as policies: both paths equal the module, refusals, export, PPO wiring."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import jaxrl_engine as jre  # noqa: E402
from jaxrl_engine.interop.convert import UnsupportedModuleError, module_to_jax  # noqa: E402
from jaxrl_engine.interop.torch_nets import cnn, mlp  # noqa: E402
from jaxrl_engine.interop.torch_policy import TorchFunction, export_to_torch  # noqa: E402
from tests.conftest import small_config  # noqa: E402

nn = torch.nn
ROOT = Path(__file__).resolve().parents[2]


def _modules():
    torch.manual_seed(0)
    every_activation = nn.Sequential(
        nn.Linear(6, 32),
        nn.ReLU(),
        nn.Linear(32, 32),
        nn.GELU(),
        nn.Linear(32, 32),
        nn.SiLU(),
        nn.LayerNorm(32),
        nn.Linear(32, 32),
        nn.ELU(),
        nn.Sequential(nn.Linear(32, 16), nn.LeakyReLU(0.1), nn.Dropout(0.5)),
        nn.Linear(16, 16),
        nn.Softplus(),
        nn.Linear(16, 8),
        nn.Sigmoid(),
        nn.Linear(8, 4),
        nn.Tanh(),
    )
    conv = nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding="same", dilation=2, groups=2),
        nn.Flatten(),
        nn.LayerNorm(8 * 5 * 5),
        nn.Linear(8 * 5 * 5, 3),
    )
    return [
        ("mlp", mlp((6,), 4, 1.0), (6,)),
        ("activations", every_activation, (6,)),
        ("cnn", cnn((3, 9, 9), 5, 1.0, obs_layout="chw"), (3, 9, 9)),
        ("cnn_hwc", cnn((9, 7, 3), 5, 1.0), (9, 7, 3)),
        ("conv", conv, (3, 9, 9)),
    ]


@pytest.mark.parametrize("path", ["fast", "universal"])
@pytest.mark.parametrize(
    ("name", "module", "shape"), _modules(), ids=lambda x: x if isinstance(x, str) else ""
)
def test_both_paths_equal_the_module(path, name, module, shape):
    x = np.random.default_rng(0).normal(size=(7, *shape)).astype(np.float32)
    want = module.eval()(torch.from_numpy(x)).detach().numpy()
    fn = TorchFunction(module, path)
    params = fn.params()
    got = jax.jit(fn)(params, jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    # vmapped over examples: still one torch call per batch on the universal path
    per_example = jax.jit(jax.vmap(fn, (None, 0)))(params, jnp.asarray(x)[:, None])[:, 0]
    np.testing.assert_allclose(np.asarray(per_example), want, rtol=1e-5, atol=1e-5)


def test_universal_path_is_one_torch_call_per_step_under_vmap():
    module = mlp((4,), 2, 1.0)
    calls = []
    module.register_forward_hook(lambda m, i, o: calls.append(i[0].shape))
    fn = TorchFunction(module, "universal")
    out = jax.jit(jax.vmap(fn, (None, 0)))(fn.params(), jnp.ones((16, 3, 4)))
    out.block_until_ready()
    calls.clear()
    jax.jit(jax.vmap(fn, (None, 0)))(fn.params(), jnp.ones((16, 3, 4))).block_until_ready()
    assert calls == [torch.Size([48, 4])]


def test_universal_gradients_equal_the_fast_path():
    module = _modules()[2][1]
    x = jnp.asarray(np.random.default_rng(1).normal(size=(5, 3, 9, 9)).astype(np.float32))
    fast, universal = TorchFunction(module, "fast"), TorchFunction(module, "universal")
    params = fast.params()
    g_fast = jax.grad(lambda p: (fast(p, x) ** 2).sum())(params)
    g_univ = jax.jit(jax.grad(lambda p: (universal(p, x) ** 2).sum()))(params)
    for k in g_fast:
        np.testing.assert_allclose(
            np.asarray(g_univ[k]), np.asarray(g_fast[k]), rtol=1e-4, atol=1e-4
        )


def test_seed_batched_params_run_on_the_universal_path():
    module = mlp((4,), 2, 1.0)
    fast, universal = TorchFunction(module, "fast"), TorchFunction(module, "universal")
    stacked = jax.tree.map(lambda p: jnp.stack([p, 2 * p]), fast.params())
    x = jnp.ones((3, 4))
    want = jax.vmap(fast, (0, None))(stacked, x)
    got = jax.jit(jax.vmap(universal, (0, None)))(stacked, x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


class Custom(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.norm = nn.BatchNorm1d(3)

    def forward(self, x):
        return self.norm(self.lin(x)) * 2


@pytest.mark.parametrize(
    "module",
    [Custom(), nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3)), nn.Sequential(nn.GRU(4, 3))],
)
def test_unsupported_modules_are_refused_pointing_to_the_universal_path(module):
    with pytest.raises(UnsupportedModuleError, match="universal path"):
        module_to_jax(module)


class Residual(nn.Module):
    """A forward that composes layers with tensor operations: a residual add with a weight
    used directly, a reshape through x.size, a concatenation, a nested Sequential head."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 8)
        self.scale = nn.Parameter(torch.randn(8))
        self.head = nn.Sequential(nn.Tanh(), nn.Linear(16, 3))

    def forward(self, x):
        h = torch.nn.functional.relu(self.a(x))
        h2 = h + torch.tanh(self.b(h)) * self.scale
        return self.head(torch.cat([h, h2.view(h2.size(0), -1)], dim=-1))


class ChannelsLastConv(nn.Module):
    """A CNN on [N, H, W, C] images permuting to NCHW itself, with a functional activation."""

    def __init__(self):
        super().__init__()
        self.conv, self.out = nn.Conv2d(3, 4, 3), nn.Linear(4 * 3 * 3, 2)

    def forward(self, x):
        y = torch.nn.functional.gelu(self.conv(x.permute(0, 3, 1, 2)))
        return torch.nn.functional.log_softmax(self.out(y.flatten(1)), dim=-1)


class TorchFunctions(nn.Module):
    """The torch.* forms of reductions, matmul and softmax, beside their method and F.*
    forms."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 6)
        self.w = nn.Parameter(torch.randn(6, 3))

    def forward(self, x):
        h = self.a(x)
        h = h - torch.mean(h, dim=-1, keepdim=True) + torch.sum(h, -1, keepdim=True) / 10
        return torch.log_softmax(torch.softmax(torch.matmul(h, self.w), dim=-1), -1)


class ShapeFlatten(nn.Module):
    """A CNN's usual flatten, `x.view(x.shape[0], -1)`: the tensor's `.shape` read."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.lin = nn.Linear(4 * 3 * 3, 2)

    def forward(self, x):
        h = self.conv(x)
        return self.lin(h.view(h.shape[0], -1)) * x.ndim


@pytest.mark.parametrize(
    ("module", "shape"),
    [
        (Residual, (5, 4)),
        (ChannelsLastConv, (2, 5, 5, 3)),
        (TorchFunctions, (5, 4)),
        (ShapeFlatten, (2, 3, 5, 5)),
    ],
)
def test_a_module_whose_forward_composes_layers_takes_the_fast_path(module, shape):
    torch.manual_seed(0)
    module = module().eval()
    x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    apply, params = module_to_jax(module)  # traced with torch.fx, translated node by node
    got = np.asarray(jax.jit(apply)(params, jnp.asarray(x)))
    np.testing.assert_allclose(got, module(torch.from_numpy(x)).detach().numpy(), atol=1e-5)
    grads = jax.grad(lambda p: apply(p, jnp.asarray(x)).sum())(params)
    assert set(grads) == set(module.state_dict())  # scale too: every weight is trainable


class Sorting(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return torch.sort(self.lin(x)).values


class DeviceOf(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x).to(x.device)


class Branching(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) if x.sum() > 0 else x


@pytest.mark.parametrize(
    ("module", "named"),
    [
        (Sorting, "the function 'sort' in the forward of module <root> (Sorting)"),
        (Branching, "module <root> (Branching), whose forward torch.fx cannot trace"),
        (DeviceOf, "the tensor attribute 'device' in the forward of module <root> (DeviceOf)"),
    ],
)
def test_the_first_operation_the_fast_path_cannot_run_is_named(module, named):
    with pytest.raises(UnsupportedModuleError) as refused:
        module_to_jax(module())
    assert named in str(refused.value)
    assert "algo.torch_policy.path=universal" in str(refused.value)


def test_the_universal_path_runs_what_the_fast_path_refuses():
    module = Custom().eval()
    x = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    fn = TorchFunction(module, "universal")
    got = jax.jit(fn)(fn.params(), jnp.asarray(x))
    np.testing.assert_allclose(
        np.asarray(got), module(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-6
    )


def test_fast_path_params_alias_the_live_torch_weights():
    module = mlp((4,), 2, 1.0)
    _, params = module_to_jax(module)
    for name, tensor in module.state_dict().items():
        assert params[name].unsafe_buffer_pointer() == tensor.data_ptr()


def test_export_to_torch_writes_trained_params_back_into_the_module():
    module = mlp((4,), 2, 1.0)
    fn = TorchFunction(module, "fast")
    trained = jax.tree.map(lambda p: p * 0.5 + 0.1, fn.params())
    x = jnp.asarray(np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32))
    want = fn(trained, x)
    written = export_to_torch(trained, module)
    assert written == sum(t.numel() * 4 for t in module.state_dict().values())
    np.testing.assert_allclose(
        module(torch.from_numpy(np.array(x))).detach().numpy(),
        np.asarray(want),
        rtol=1e-5,
        atol=1e-6,
    )
    with pytest.raises(KeyError, match="missing"):
        export_to_torch({"0.weight": trained["0.weight"]}, module)


def _torch_cfg(tmp_path, *extra):
    return small_config("algo.torch_policy={}", *extra, tmp_path=tmp_path)


def test_ppo_acts_with_the_torch_module_and_its_outputs(tmp_path):
    engine = jre.build(_torch_cfg(tmp_path))
    network = engine.algo.static["network"]
    state = engine.init(jax.random.key(0))
    obs = state.env.obs
    head, _, _ = engine.algo.static["dist"](state.eval_params["net"], obs)
    want = network.actor_module(torch.from_numpy(np.array(obs))).detach().numpy()
    np.testing.assert_allclose(np.asarray(head), want, rtol=1e-5, atol=1e-6)
    state, metrics = engine.epoch(state)
    assert np.isfinite(float(metrics["train/loss"]))


@pytest.mark.parametrize("path", ["fast", "universal"])
def test_a_run_writes_the_factorys_module_with_its_trained_weights(path, tmp_path):
    import copy
    import json

    engine = jre.build(_torch_cfg(tmp_path, f"algo.torch_policy.path={path}"))
    network = engine.algo.static["network"]
    given = copy.deepcopy(network.actor_module.state_dict())
    if path == "universal":  # (no jax.export form: warned, the torch actor still written)
        with pytest.warns(UserWarning, match=r"its torch actor's trained weights: .*actor.pt"):
            state, _ = engine.run(engine.init(jax.random.key(0)))
    else:
        state, _ = engine.run(engine.init(jax.random.key(0)))
    policy = tmp_path / engine.driver.cfg.name / "policy"
    module = copy.deepcopy(network.actor_module)  # as the user's factory builds it again
    module.load_state_dict(torch.load(policy / "torch_actor.pt", weights_only=True))
    obs = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
    head, _, _ = engine.algo.static["dist"](state.eval_params["net"], jnp.asarray(obs))
    with torch.no_grad():
        np.testing.assert_allclose(
            module(torch.from_numpy(obs)).numpy(), np.asarray(head), rtol=1e-5, atol=1e-6
        )
    trained = {k: v for k, v in module.state_dict().items() if not torch.equal(v, given[k])}
    assert trained, "the weights written are the untrained ones"
    for k, v in network.actor_module.state_dict().items():  # the engine's module: untouched
        assert torch.equal(v, given[k]), k
    if path == "fast":
        meta = json.loads((policy / "meta.json").read_text())
        assert meta["torch_actor"] == "torch_actor.pt"


def test_fast_and_universal_paths_train_identically(tmp_path):
    """One PPO epoch from the same torch init: the learner sees the same numbers either way."""
    results = {}
    for path in ("fast", "universal"):
        engine = jre.build(_torch_cfg(tmp_path, f"algo.torch_policy.path={path}"))
        state, metrics = engine.epoch(engine.init(jax.random.key(0)))
        results[path] = (state.train.params["actor"], float(metrics["train/loss"]))
    for k, v in results["fast"][0].items():
        np.testing.assert_allclose(
            np.asarray(results["universal"][0][k]), np.asarray(v), rtol=1e-3, atol=1e-4
        )
    assert abs(results["fast"][1] - results["universal"][1]) < 1e-3


def test_bf16_acting_copy(tmp_path):
    engine = jre.build(_torch_cfg(tmp_path, "algo.torch_policy.acting_dtype=bfloat16"))
    state = engine.init(jax.random.key(0))
    state, _ = engine.epoch(state)
    actor = state.eval_params["net"]["actor"]
    assert {p.dtype for p in actor.values()} == {jnp.dtype(jnp.bfloat16)}
    assert {p.dtype for p in state.train.params["actor"].values()} == {jnp.dtype(jnp.float32)}
    f32 = engine.algo.static["dist"](
        {**state.eval_params["net"], "actor": state.train.params["actor"]}, state.env.obs
    )[0]
    bf16 = engine.algo.static["dist"](state.eval_params["net"], state.env.obs)[0]
    np.testing.assert_allclose(np.asarray(bf16), np.asarray(f32), atol=0.05)


def huge_first_layer(obs_shape, action_dim, scale):
    """An MLP whose first layer's weights (1e8) overflow float16 (largest value 65504)."""
    module = mlp(obs_shape, action_dim, scale)
    with torch.no_grad():
        module[0].weight.mul_(1e8)
    return module


def test_a_float16_actor_that_overflows_is_named_in_the_non_finite_error(tmp_path):
    # The NaN shows first in the learner's losses (the actor's log-probs are NaN), whose
    # name alone does not point at the acting dtype: the error's notes do.
    engine = jre.build(
        _torch_cfg(
            tmp_path,
            "algo.torch_policy.factory=tests.interop.test_torch_policy:huge_first_layer",
            "algo.torch_policy.acting_dtype=float16",
        )
    )
    with pytest.raises(jre.NonFiniteError) as e:
        engine.run(engine.init(jax.random.key(0)))
    assert "acts in float16 (algo.torch_policy.acting_dtype=float16)" in "\n".join(
        e.value.__notes__
    )


def test_a_bf16_acting_policy_is_exported_evaluated_and_loaded(tmp_path):
    # numpy saves bfloat16 as raw 2-byte records ('|V2'): eval and the loaders failed on them.
    import importlib.util

    from jaxrl_engine.export.evaluate import evaluate_run
    from jaxrl_engine.export.policy import load_params

    engine = jre.build(_torch_cfg(tmp_path, "algo.torch_policy.acting_dtype=bfloat16"))
    state, _ = engine.run(engine.init(jax.random.key(0)))
    run = tmp_path / engine.driver.cfg.name
    assert evaluate_run(run, episodes=4)["episodes"] == 4
    loaded = load_params(engine, run / "policy")
    for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(state.eval_params), strict=True):
        assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b))
    spec = importlib.util.spec_from_file_location("bf16_policy", run / "policy" / "policy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    act, params = module.load()
    assert act(params, np.zeros((3, 4), np.float32)).shape == (3,)


def test_torch_learner_needs_a_torch_critic():
    with pytest.raises(jre.ConfigError, match="critic: torch"):
        small_config("algo.torch_policy.learner=torch")


def test_a_bad_factory_is_named(tmp_path):
    with pytest.raises(ValueError, match="no_such_module"):
        jre.build(_torch_cfg(tmp_path, "algo.torch_policy.factory=no_such_module:mlp"))


def test_jax_learner_to_a_bf16_torch_actor_casts_on_export():
    module = mlp((4,), 2, 1.0)
    params = TorchFunction(module, "fast").params()
    trained = jax.tree.map(lambda p: p + 0.25, params)
    actor = mlp((4,), 2, 1.0).to(torch.bfloat16)
    written = export_to_torch(trained, actor)
    assert written == sum(p.numel() * 2 for p in actor.parameters())
    for name, tensor in actor.state_dict().items():
        assert tensor.dtype == torch.bfloat16
        want = np.asarray(trained[name].astype(jnp.bfloat16).astype(jnp.float32))
        np.testing.assert_array_equal(tensor.float().numpy(), want)


def test_the_package_imports_and_trains_without_torch(tmp_path):
    import subprocess
    import sys

    script = (
        "import sys, importlib.abc\n"
        "class NoTorch(importlib.abc.MetaPathFinder):\n"  # `import torch` raises ImportError
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] == 'torch':\n"
        "            raise ImportError('torch is not installed')\n"
        "sys.meta_path.insert(0, NoTorch())\n"
        "import jax, jaxrl_engine as jre, jaxrl_engine.interop\n"
        "from tests.conftest import small_config\n"
        f"engine = jre.build(small_config(tmp_path={str(tmp_path)!r}))\n"
        "engine.epoch(engine.init(jax.random.key(0)))\n"
        "assert 'torch' not in sys.modules\n"
        "try:\n"
        "    jaxrl_engine.interop.from_torch({})\n"
        "except ImportError as e:\n"
        "    assert 'jaxrl-engine[torch]' in str(e), e\n"
        "    print('ok')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=str(ROOT)
    )
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]


def test_fast_path_keeps_linear_weights_out_in_and_the_graph_has_no_transpose():
    module = _modules()[1][1]  # Linear [out, in] weights, LayerNorm, activations
    fn = TorchFunction(module, "fast")
    hlo = jax.jit(fn).lower(fn.params(), jnp.ones((2, 6))).compile().as_text()
    assert "transpose(" not in hlo


def test_the_learner_state_does_not_alias_torch_so_the_epoch_can_donate_it(tmp_path):
    from jaxrl_engine.interop import check_donatable

    engine = jre.build(_torch_cfg(tmp_path))
    state = engine.init(jax.random.key(0))
    check_donatable(state, "EngineState")  # init copied the torch weights into JAX buffers
    actor = engine.algo.static["network"].actor_module
    for name, tensor in actor.state_dict().items():
        np.testing.assert_array_equal(np.asarray(state.train.params["actor"][name]), tensor.numpy())
