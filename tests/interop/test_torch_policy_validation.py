"""A torch policy that cannot work is refused through `jaxrl-engine train` before anything is
compiled: exit status 2, one `jaxrl-engine: ...` line naming `algo.torch_policy.factory` and
the factory, no traceback. The factories below are named by the tests as
`tests.interop.test_torch_policy_validation:<name>`."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tests.conftest import SMALL  # noqa: E402
from tests.test_bad_input import assert_clean_refusal, nothing_run, train  # noqa: E402, F401

nn = torch.nn
HERE = "tests.interop.test_torch_policy_validation"
NOT_A_FUNCTION = 42
pytestmark = pytest.mark.usefixtures("nothing_run")  # a refusal comes before any compile


def plain(in_shape, out_dim, out_scale, width=8):
    return nn.Sequential(nn.Linear(in_shape[0], width), nn.Tanh(), nn.Linear(width, out_dim))


def raises(in_shape, out_dim, out_scale):
    raise RuntimeError("no GPU left for this network\nsecond line")


def not_a_module(in_shape, out_dim, out_scale):
    return {"weights": torch.zeros(in_shape[0], out_dim)}


def three_logits(in_shape, out_dim, out_scale):
    return nn.Sequential(nn.Linear(in_shape[0], 3))


def cartpole_sized(in_shape, out_dim, out_scale):
    """Ignores `in_shape`: 4 inputs, CartPole's observation size."""
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, out_dim))


class Sorted(nn.Module):
    """A forward with an operation the fast path does not translate (torch.sort)."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.lin = nn.Linear(in_dim, out_dim)

    def forward(self, x):
        return torch.sort(self.lin(x), dim=-1).values


def custom(in_shape, out_dim, out_scale):
    return Sorted(in_shape[0], out_dim)


def refuse(capsys, tmp_path, factory: str, *overrides: str, expected: tuple[str, ...]) -> None:
    status, out, err = train(
        capsys,
        *SMALL,
        f"run_dir={tmp_path}",
        f"algo.torch_policy.factory={factory}",
        *overrides,
    )
    assert_clean_refusal(status, out, err, "algo.torch_policy.factory", repr(factory), *expected)


def test_a_factory_module_that_is_not_importable(capsys, tmp_path):
    refuse(
        capsys,
        tmp_path,
        "no_such_nets:make",
        expected=(
            "no module named 'no_such_nets', installed or in the current directory",
            "name its file instead, e.g. 'path/to/no_such_nets.py:make'",
        ),
    )


NETS = """
import torch.nn as nn

def make(in_shape, out_dim, out_scale):
    return nn.Sequential(nn.Linear(in_shape[0], out_dim))
"""


def test_a_factory_module_in_the_current_directory_or_named_by_its_file(tmp_path, monkeypatch):
    """`mynets:make` from the directory holding mynets.py (no PYTHONPATH), and
    `path/to/nets.py:make` from anywhere; a missing file is named."""
    from jaxrl_engine.interop.torch_nets import TorchPolicyError, resolve_factory

    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "mynets_in_cwd.py").write_text(NETS)
    (tmp_path / "deep" / "er").mkdir(parents=True)
    (tmp_path / "deep" / "er" / "nets.py").write_text(NETS)
    monkeypatch.chdir(tmp_path / "here")
    module = resolve_factory("mynets_in_cwd:make")((4,), 2, 1.0)  # a Sequential of one Linear(4, 2)
    assert module[0].in_features == 4 and module[0].out_features == 2
    assert str(tmp_path / "here") not in __import__("sys").path  # the path is left as it was
    module = resolve_factory("../deep/er/nets.py:make")((3,), 5, 1.0)
    assert module[0].in_features == 3 and module[0].out_features == 5
    module = resolve_factory(f"{tmp_path}/deep/er/nets.py:make")((3,), 5, 1.0)
    assert module[0].out_features == 5
    with pytest.raises(TorchPolicyError, match=r"no file '\.\./deep/missing\.py'"):
        resolve_factory("../deep/missing.py:make")


def test_a_factory_module_that_raises_on_import(capsys, tmp_path, monkeypatch):
    (tmp_path / "broken_nets.py").write_text("import math\nraise RuntimeError('bad config')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    refuse(
        capsys,
        tmp_path,
        "broken_nets:make",
        expected=("importing 'broken_nets' raised RuntimeError: bad config",),
    )


def test_a_factory_name_without_a_colon(capsys, tmp_path):
    refuse(capsys, tmp_path, f"{HERE}.plain", expected=("'package.module:function'",))


def test_a_factory_that_the_module_does_not_have(capsys, tmp_path):
    refuse(capsys, tmp_path, f"{HERE}:nothing_here", expected=(f"{HERE} has no 'nothing_here'",))


def test_a_factory_that_is_not_callable(capsys, tmp_path):
    refuse(
        capsys,
        tmp_path,
        f"{HERE}:NOT_A_FUNCTION",
        expected=("NOT_A_FUNCTION is not callable (int)",),
    )


def test_kwargs_the_factory_does_not_take(capsys, tmp_path):
    refuse(
        capsys,
        tmp_path,
        f"{HERE}:plain",
        "algo.torch_policy.kwargs={bogus: 1}",
        expected=(
            "algo.torch_policy.kwargs {'bogus': 1}",
            "unexpected keyword argument 'bogus'",
            "(in_shape, out_dim, out_scale, width=8)",
        ),
    )


def test_a_factory_that_raises(capsys, tmp_path):
    refuse(
        capsys,
        tmp_path,
        f"{HERE}:raises",
        expected=("raised RuntimeError: no GPU left for this network",),
    )


def test_a_factory_that_returns_no_module(capsys, tmp_path):
    refuse(
        capsys, tmp_path, f"{HERE}:not_a_module", expected=("returned dict, not a torch.nn.Module",)
    )


def test_three_logits_on_cartpole(capsys, tmp_path):
    refuse(
        capsys,
        tmp_path,
        f"{HERE}:three_logits",
        expected=(
            "the torch actor outputs 3 values per observation; env CartPole-v1 has 2 actions",
        ),
    )


def test_a_torch_critic_must_output_one_value(capsys, tmp_path):
    refuse(
        capsys,
        tmp_path,
        f"{HERE}:three_logits",
        "env.id=Acrobot-v1",  # 3 actions: the actor fits, the critic does not
        "algo.torch_policy.critic=torch",
        expected=("the torch critic outputs 3 values per observation", "1 value"),
    )


def test_a_cartpole_sized_network_on_acrobot(capsys, tmp_path):
    refuse(
        capsys,
        tmp_path,
        f"{HERE}:cartpole_sized",
        "env.id=Acrobot-v1",
        expected=(
            "env Acrobot-v1's observations of shape (6,)",
            "its first Linear takes 4 input features",
            "RuntimeError: mat1 and mat2 shapes cannot be multiplied",
        ),
    )


def test_an_unsupported_module_on_the_fast_path(capsys, tmp_path):
    refuse(
        capsys,
        tmp_path,
        f"{HERE}:custom",
        expected=(
            "the function 'sort' in the forward of module <root> (Sorted)",
            "not supported by the fast path",
            "algo.torch_policy.path=universal",
        ),
    )


def test_the_universal_path_takes_what_the_fast_path_refuses(tmp_path):
    import jaxrl_engine as jre
    from tests.conftest import small_config

    cfg = small_config(
        f"algo.torch_policy.factory={HERE}:custom",
        "algo.torch_policy.path=universal",
        tmp_path=tmp_path,
    )
    assert jre.build(cfg).algo.static["network"].path == "universal"


# ---------------------------------------------------------- what the fast path cannot see
class InPlace(nn.Module):
    """`relu(inplace=True)` changes `y`, which is used again: torch.fx records it as a new
    value, so a translation node by node would return y + relu(y) instead of 2 relu(y)."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.lin = nn.Linear(in_dim, out_dim)

    def forward(self, x):
        y = self.lin(x)
        z = nn.functional.relu(y, inplace=True)
        return y + z


def in_place(in_shape, out_dim, out_scale):
    return InPlace(in_shape[0], out_dim)


class FixedBatch(nn.Module):
    """Its batch size written into forward (`view(batch, -1)`): right for that batch only."""

    def __init__(self, in_dim: int, out_dim: int, batch: int):
        super().__init__()
        self.lin, self.batch = nn.Linear(in_dim, out_dim), batch

    def forward(self, x):
        return self.lin(x.view(self.batch, -1))


def one_at_a_time(in_shape, out_dim, out_scale):
    return FixedBatch(in_shape[0], out_dim, 1)


def batch_of_two(in_shape, out_dim, out_scale):
    return FixedBatch(in_shape[0], out_dim, 2)


def half(in_shape, out_dim, out_scale):
    return plain(in_shape, out_dim, out_scale).half()


def test_a_fast_path_translation_that_differs_from_torch_is_refused(capsys, tmp_path):
    refuse(
        capsys,
        tmp_path,
        f"{HERE}:in_place",
        expected=("fast path's translation does not compute what the module computes", "universal"),
    )


def test_a_module_that_takes_one_observation_at_a_time_is_refused(capsys, tmp_path):
    refuse(capsys, tmp_path, f"{HERE}:one_at_a_time", expected=("the torch actor",))


def test_a_module_with_a_batch_size_in_its_forward_is_refused(capsys, tmp_path):
    refuse(
        capsys,
        tmp_path,
        f"{HERE}:batch_of_two",
        expected=("works on a batch of 2 observations but on 3 raises", "x.flatten(1)"),
    )


def test_a_half_precision_module_is_refused_naming_the_dtype(capsys, tmp_path):
    refuse(capsys, tmp_path, f"{HERE}:half", expected=("float16 weights", "module.float()"))


def test_a_torch_actor_given_to_the_library_directly_is_checked_as_the_configs_is(tmp_path):
    """`TorchActorCritic(actor)` passed to `algo.build(network=...)` (the examples' way in):
    a fast-path translation that computes something else, or half-precision weights, are
    refused before anything is compiled, as through `algo.torch_policy`."""
    import jaxrl_engine as jre
    from jaxrl_engine.compose import num_epochs
    from jaxrl_engine.envs import make_env
    from jaxrl_engine.interop.torch_nets import TorchPolicyError
    from jaxrl_engine.interop.torch_policy import TorchActorCritic

    cfg = jre.load_config(None, [*SMALL, f"run_dir={tmp_path}"])
    env = make_env(cfg.env.id)
    spec = env.spec(env.params)

    def build(actor, path="fast"):
        network = TorchActorCritic(actor, action_dim=2, discrete=True, path=path)
        algo = cfg.algo.build(spec, cfg.env.num_envs, num_epochs(cfg), network=network)
        return jre.build(cfg, env=env, algorithm=algo)

    with pytest.raises(TorchPolicyError, match="the torch actor: the fast path's translation"):
        build(InPlace(4, 2))
    assert build(InPlace(4, 2), path="universal").algo.static["network"].path == "universal"
    with pytest.raises(TorchPolicyError, match="the torch actor has float16 weights"):
        build(plain((4,), 2, 0.01).half())


@pytest.mark.parametrize("factory", ["mlp", "cnn"])
def test_the_shipped_factories_build_float32_whatever_torchs_default_dtype(factory):
    # A notebook that set torch's default dtype to float64: the engine's own factories build
    # the float32 modules (the same weights) they build in a process that never changed it.
    import torch

    from jaxrl_engine.interop import torch_nets

    shape = (4,) if factory == "mlp" else (10, 10, 4)

    def weights():
        torch.manual_seed(0)
        module = getattr(torch_nets, factory)(shape, 3)
        return {k: v.clone() for k, v in module.state_dict().items()}

    reference = weights()
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        built = weights()
        assert torch.get_default_dtype() == torch.float64  # (given back)
    finally:
        torch.set_default_dtype(previous)
    assert {v.dtype for v in built.values()} == {torch.float32}
    for name, value in reference.items():
        assert torch.equal(built[name], value), name
