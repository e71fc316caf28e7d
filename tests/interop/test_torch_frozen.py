"""What torch keeps fixed stays fixed in JAX: buffers and parameters with requires_grad=False
get no gradient on either path; the universal path differentiates with respect to the input
as the fast path does, and runs modules with running statistics (BatchNorm)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from jaxrl_engine.interop.torch_policy import TorchFunction  # noqa: E402

nn = torch.nn


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Linear(4, 8)
        self.second = nn.Linear(8, 2)
        self.register_buffer("scale", torch.full((4,), 0.5))
        self.first.requires_grad_(False)

    def forward(self, x):
        return self.second(torch.tanh(self.first(x * self.scale)))


def grads(fn: TorchFunction, argnums=0):
    params = jax.tree.map(jnp.array, fn.params())
    x = jax.random.normal(jax.random.key(0), (5, 4))
    return jax.grad(lambda p, xs: (fn(p, xs) ** 2).sum(), argnums=argnums)(params, x)


@pytest.mark.parametrize("path", ["fast", "universal"])
def test_buffers_and_frozen_parameters_get_no_gradient(path):
    torch.manual_seed(0)
    g = grads(TorchFunction(Scaled(), path))
    for name in ("scale", "first.weight", "first.bias"):
        assert not np.any(np.asarray(g[name])), name
    assert np.any(np.asarray(g["second.weight"]))


def test_the_universal_path_differentiates_the_input_as_the_fast_path():
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    fast = grads(TorchFunction(module, "fast"), argnums=1)
    universal = grads(TorchFunction(module, "universal"), argnums=1)
    assert np.any(np.asarray(universal))
    np.testing.assert_allclose(universal, fast, atol=1e-6)


def test_the_universal_path_runs_a_module_with_running_statistics():
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    g = grads(TorchFunction(module, "universal"))
    assert not np.any(np.asarray(g["1.running_mean"])) and np.any(np.asarray(g["0.weight"]))
