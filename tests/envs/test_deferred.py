"""gymnax's render-only imports (matplotlib.pyplot, seaborn) are deferred, never lost."""

import subprocess
import sys
import textwrap

import pytest

from jaxrl_engine.envs.deferred import DeferredModule, deferred_imports


@pytest.fixture
def counting_module(tmp_path, monkeypatch):
    """A module `deferme_probe` that counts its executions in `deferme_probe_runs`."""
    (tmp_path / "deferme_probe.py").write_text(
        "import builtins\n"
        "builtins.deferme_probe_runs = getattr(builtins, 'deferme_probe_runs', 0) + 1\n"
        "VALUE = 42\n"
        "def double(x):\n    return 2 * x\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "deferme_probe", raising=False)
    import builtins

    monkeypatch.setattr(builtins, "deferme_probe_runs", 0, raising=False)
    yield builtins
    sys.modules.pop("deferme_probe", None)


def test_an_import_in_the_block_runs_the_module_only_when_an_attribute_is_used(counting_module):
    with deferred_imports("deferme_probe"):
        import deferme_probe as probe
    assert isinstance(probe, DeferredModule)
    assert counting_module.deferme_probe_runs == 0
    assert "deferme_probe" not in sys.modules  # later imports get the real module
    assert probe.double(probe.VALUE) == 84
    assert counting_module.deferme_probe_runs == 1
    import deferme_probe as real

    assert not isinstance(real, DeferredModule)
    assert real.VALUE == 42 and counting_module.deferme_probe_runs == 1
    probe.VALUE = 7  # a write through the stand-in reaches the real module
    assert real.VALUE == 7


def test_a_missing_or_already_imported_module_is_left_as_it_is(counting_module):
    with deferred_imports("no_such_module_anywhere"), pytest.raises(ModuleNotFoundError):
        import no_such_module_anywhere  # noqa: F401
    with deferred_imports("no_such_package.sub"), pytest.raises(ModuleNotFoundError):
        import no_such_package.sub  # noqa: F401
    assert "no_such_package.sub" not in sys.modules
    import deferme_probe as real

    with deferred_imports("deferme_probe"):
        import deferme_probe as again
    assert again is real and counting_module.deferme_probe_runs == 1


def test_gymnax_loads_without_its_renderers_libraries_and_still_renders():
    """A fresh process (the point is what a new process imports)."""
    code = textwrap.dedent(
        """
        import sys
        import jaxrl_engine.envs.gymnax_env as adapter
        assert "seaborn" not in sys.modules and "matplotlib.pyplot" not in sys.modules
        env = adapter.GymnaxEnv("Catch-bsuite")
        import jax
        _, state = env.env.reset(jax.random.PRNGKey(0), env.params)
        import matplotlib
        matplotlib.use("Agg")
        fig, ax = env.env.render(state, env.params)  # imports pyplot through the stand-in
        import matplotlib.pyplot as plt
        assert type(plt) is type(sys) and plt.gcf() is fig
        import gymnax.environments.misc.pong as pong
        assert callable(pong.sns.color_palette)
        assert "seaborn" in sys.modules and type(sys.modules["seaborn"]) is type(sys)
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")
