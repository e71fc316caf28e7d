"""Data parallel on 4 CPU devices: env batch and buffer sharded on `data`, params replicated,
same results as one device for the same seed (run in a subprocess: XLA_FLAGS must be set
before JAX starts)."""

from __future__ import annotations

import textwrap

import pytest

from tests.conftest import run_on_four_devices

SCRIPT = textwrap.dedent(
    """
    import json, jax, numpy as np
    import jaxrl_engine as jre
    from jaxrl_engine.core.sharding import data_mesh
    assert len(jax.devices()) == 4, jax.devices()
    cfg = jre.load_config(None, ["env.num_envs=8", "eval.num_envs=8", "algo.num_steps=16",
        "algo.num_minibatches=2", "algo.update_epochs=2", "algo.hidden_sizes=[16,16]",
        "progress=false", "offload=OFFLOAD"])
    out = {}
    for n in (1, 4):
        engine = jre.build(cfg, mesh=data_mesh(jax.devices()[:n]))
        state = engine.init(jax.random.key(0))
        for _ in range(3):
            state, metrics = engine.epoch(state)
        out[n] = dict(
            params=[np.asarray(x).tolist() for x in jax.tree.leaves(state.train.params)],
            loss=float(metrics["train/loss"]),
            obs_devices=len(state.env.obs.sharding.device_set),
            obs_spec=str(state.env.obs.sharding.spec),
            buffer_spec=str(state.buffer.obs.sharding.spec),
            params_replicated=all(x.sharding.is_fully_replicated
                                  for x in jax.tree.leaves(state.train.params)),
        )
    try:  # the default mesh spans the 4 devices: both counts are named at once
        jre.build(jre.load_config(None, ["env.num_envs=6", "eval.num_envs=6"]))
    except jre.ConfigError as e:
        out["uneven"] = str(e)
    print(json.dumps(out))
    """
)


@pytest.mark.multidevice
@pytest.mark.parametrize("offload", ["false", "true"])
def test_four_devices_shard_the_env_batch_and_match_one_device(offload):
    out = run_on_four_devices(SCRIPT.replace("OFFLOAD", offload))
    one, four = out["1"], out["4"]
    assert four["obs_devices"] == 4 and four["obs_spec"] == "P('data',)"
    assert four["buffer_spec"] == "P(None, 'data')"
    assert four["params_replicated"] and one["params_replicated"]
    assert out["uneven"].startswith("env.num_envs=6 and eval.num_envs=6 must be multiples of")
    assert abs(one["loss"] - four["loss"]) <= 1e-4 * max(1.0, abs(one["loss"]))
    import numpy as np

    for a, b in zip(one["params"], four["params"], strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
