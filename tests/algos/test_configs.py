"""The algorithms' config classes live in `algos.configs` (no JAX) and are found where they
were: re-exported by the algorithm modules and by `jaxrl_engine.algos`, whose `HParams` import on
first use."""

from __future__ import annotations

import importlib

import jaxrl_engine.algos as algos
from jaxrl_engine.algos import configs, networks, torso


def test_config_classes_are_re_exported_where_they_were():
    homes = {
        "ppo": ["PPOConfig", "TorchPolicyConfig", "minibatch_size"],
        "off_policy": ["OffPolicyConfig", "ContinuousOffPolicyConfig", "grad_steps_per_epoch"],
        "dqn": ["DQNConfig"],
        "sac": ["SACConfig"],
        "td3": ["TD3Config"],
    }
    for module, names in homes.items():
        loaded = importlib.import_module(f"jaxrl_engine.algos.{module}")
        for name in names:
            assert getattr(loaded, name) is getattr(configs, name), (module, name)
    for name, config_class in configs.ALGORITHMS.items():
        assert getattr(algos, config_class.__name__) is config_class
        assert algos.ALGORITHMS[name] is config_class
    assert networks.ConvSpec is torso.ConvSpec


def test_the_package_s_hparams_import_on_first_use():
    for name in ("ppo", "dqn", "sac", "td3"):
        module = importlib.import_module(f"jaxrl_engine.algos.{name}")
        assert getattr(algos, f"{name.upper()}HParams") is getattr(module, f"{name.upper()}HParams")
