"""An env of the user's own is checked against the `Env` protocol (`core/protocols.py`) when
the engine is built: `reset` and `step` traced once (nothing compiled), a mistake named by the
env, the method and the output (was a scan-carry, flax or gymnax error from inside a phase).
Every shipped gymnax env passes the same check."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

import jaxrl_engine as jre
from jaxrl_engine.compose import make_configured_env
from jaxrl_engine.core.warm_up import ShapeMismatchError, check_env
from jaxrl_engine.envs.gymnax_env import GymnaxEnv
from jaxrl_engine.io.config import GYMNAX_ENV_IDS
from tests.conftest import SMALL


@struct.dataclass
class Params:
    n: int = struct.field(pytree_node=False, default=5)
    max_steps_in_episode: int = struct.field(pytree_node=False, default=20)


@struct.dataclass
class State:
    pos: jax.Array
    t: jax.Array


class Chain:
    """A corridor of `n` cells: action 1 walks right, 0 left; reward 1 at the last cell."""

    params = Params()

    def obs(self, pos, params):
        return jax.nn.one_hot(pos, params.n)

    def reset(self, key, params):
        state = State(pos=jnp.int32(0), t=jnp.int32(0))
        return self.obs(state.pos, params), state

    def step(self, key, state, action, params):
        pos = jnp.clip(state.pos + 2 * action - 1, 0, params.n - 1)
        moved = State(pos=pos, t=state.t + 1)
        terminated = pos == params.n - 1
        truncated = ~terminated & (moved.t >= params.max_steps_in_episode)
        final = self.obs(pos, params)
        obs0, state0 = self.reset(key, params)
        done = terminated | truncated
        new = jax.tree.map(lambda a, b: jnp.where(done, a, b), state0, moved)
        obs = jnp.where(done, obs0, final)
        reward = terminated.astype(jnp.float32)
        return obs, new, reward, terminated, truncated, {"final_observation": final}

    def spec(self, params):
        return jre.EnvSpec(
            env_id="Chain",
            obs_shape=(params.n,),
            obs_dtype=jnp.float32,
            action=jre.ActionSpec(shape=(), dtype=jnp.int32, num_actions=2),
            max_episode_steps=params.max_steps_in_episode,
        )


def broken(**overrides):
    return type("Chain", (Chain,), overrides)()


def wrap_step(change):
    def step(self, key, state, action, params):
        return change(*Chain.step(self, key, state, action, params))

    return step


CASES = {
    "obs dtype from step": (
        {"step": wrap_step(lambda o, s, r, te, tr, i: (o.astype(jnp.int32), s, r, te, tr, i))},
        r"env Chain \(Chain\): step\(\) gives observations of shape \(4, 5\) and dtype int32; "
        r"its spec says \(4, 5\) float32",
    ),
    "obs shape from reset": (
        {"reset": lambda self, k, p: (Chain.reset(self, k, p)[0][:3], Chain.reset(self, k, p)[1])},
        r"reset\(\) gives observations of shape \(4, 3\)",
    ),
    "state dtype": (
        {
            "step": wrap_step(
                lambda o, s, r, te, tr, i: (o, s.replace(t=s.t.astype(jnp.float32)), r, te, tr, i)
            )
        },
        r"step\(\) returns state\.t of shape \(4,\) float32; reset\(\) returned \(4,\) int32",
    ),
    "reward shape": (
        {"step": wrap_step(lambda o, s, r, te, tr, i: (o, s, r[None], te, tr, i))},
        r"step\(\) returns reward of shape \(4, 1\) .* \(4 envs: \(4,\)\)",
    ),
    "terminated as float": (
        {"step": wrap_step(lambda o, s, r, te, tr, i: (o, s, r, te.astype(jnp.float32), tr, i))},
        r"step\(\) returns terminated of shape \(4,\) and dtype float32; each env's terminated "
        r"is bool",
    ),
    "no final observation": (
        {"step": wrap_step(lambda o, s, r, te, tr, i: (o, s, r, te, tr, {}))},
        r"info must be a dict holding 'final_observation'.*it is keys \[\]",
    ),
    "five values": (
        {"step": wrap_step(lambda o, s, r, te, tr, i: (o, s, r, te | tr, i))},
        r"must return 6 values \(obs, state, reward, terminated, truncated, info\); it returns 5 values",
    ),
    "spec says another dtype": (
        {
            "spec": lambda self, p: jre.EnvSpec(
                env_id="Chain",
                obs_shape=(p.n,),
                obs_dtype=jnp.uint8,
                action=jre.ActionSpec(shape=(), dtype=jnp.int32, num_actions=2),
                max_episode_steps=20,
            )
        },
        r"of shape \(4, 5\) and dtype float32; its spec says \(4, 5\) uint8",
    ),
    "no step": ({"step": None}, r"env Chain has no step\(\) method"),
    "no spec": ({"spec": None}, r"env Chain has no spec\(\) method"),
    "no params": ({"params": property(lambda self: self.missing)}, r"has no params attribute"),
    "step fails": (
        {"step": lambda self, k, s, a, p: jnp.zeros(3) + jnp.zeros(4)},
        r"env Chain \(Chain\): step\(key, state, action, params\) fails when traced for 4 "
        r"envs: TypeError",
    ),
}


@pytest.fixture(scope="module")
def cfg():
    return jre.load_config(None, [*SMALL, "progress=false"])


@pytest.mark.parametrize("overrides, message", CASES.values(), ids=CASES.keys())
def test_an_env_that_breaks_the_protocol_is_named_when_the_engine_is_built(cfg, overrides, message):
    with pytest.raises(ShapeMismatchError, match=message):
        jre.build(cfg, env=broken(**overrides))


def test_the_chain_itself_builds_and_a_shape_given_as_a_list_is_a_tuple(cfg):
    engine = jre.build(cfg, env=Chain())
    assert engine.spec.obs_shape == (5,)
    spec = jre.EnvSpec("Chain", [5], jnp.float32, jre.ActionSpec([], jnp.int32, 2), 20)
    assert spec.obs_shape == (5,) and spec.action.shape == ()


def test_a_float64_spec_is_float32_as_the_observations_are(cfg):
    """With JAX's 64-bit mode off a float64 spec (a Box space's dtype copied) means float32."""
    spec = Chain().spec(Params())
    wide = broken(spec=lambda self, p: dataclasses.replace(spec, obs_dtype=np.float64))
    jre.build(cfg, env=wide)


def test_every_gymnax_env_returns_what_its_spec_says_and_builds(cfg):
    """bsuite's Catch said int32 (its space) and returned float32 observations, which the
    exported policy's meta.json then recorded; the misc envs' spec, read while a phase was
    traced, staged their action bounds (PointRobot, Reacher and Swimmer could not build)."""
    for env_id in GYMNAX_ENV_IDS:
        env = GymnaxEnv(env_id)
        check_env(env, env.params, env.spec(env.params), 2)
        jre.build(cfg.model_copy(update={"env": cfg.env.model_copy(update={"id": env_id})}))
    assert GymnaxEnv("Catch-bsuite").spec(GymnaxEnv("Catch-bsuite").params).obs_dtype == (
        jnp.float32
    )


@pytest.mark.parametrize(
    "suite, env_id",
    [
        ("gymnasium", "CartPole-v1"),
        ("gymnasium", "Pendulum-v1"),
        ("envpool", "CartPole-v1"),
        ("brax", "inverted_pendulum"),
    ],
)
def test_the_engines_host_and_brax_adapters_keep_the_protocol(suite, env_id):
    """Builds skip the protocol trace for the engine's own adapters (a Brax step takes seconds
    to trace); this is where they are checked."""
    pytest.importorskip(suite)
    cfg = jre.load_config(None, [f"env.suite={suite}", f"env.id={env_id}", "env.num_envs=2"])
    env = make_configured_env(cfg)
    assert env.engine_adapter
    try:
        check_env(env, env.params, env.spec(env.params), 2)
    finally:
        getattr(env, "close", lambda: None)()


def test_cartpoles_derived_params_follow_the_params_they_come_from():
    # gymnax's step reads total_mass and polemass_length as stored: a heavier pole alone left
    # them at the defaults' values (inconsistent physics, silently).
    from jaxrl_engine.envs.gymnax_env import GymnaxEnv

    heavy = GymnaxEnv("CartPole-v1", {"masspole": 1.0, "length": 2.0}).params
    assert (heavy.total_mass, heavy.polemass_length) == (2.0, 2.0)  # 1 + 1.0 cart; 1.0 * 2
    given = GymnaxEnv.with_params(heavy, {"masspole": 0.5, "total_mass": 9.0})
    assert (given.total_mass, given.polemass_length) == (9.0, 1.0)  # as given; 0.5 * 2
    cfg = jre.load_config(None, ["eval.env_params={masspole: 1.0}"])
    assert jre.build(cfg).eval_env_params.total_mass == 2.0


def test_continuous_bounds_broadcast_one_value_and_refuse_swapped_or_missized_ones():
    spec = jre.ActionSpec((3,), jnp.float32, low=-1.0, high=(1.0, 2.0, 3.0))
    assert spec.low == (-1.0, -1.0, -1.0) and spec.high == (1.0, 2.0, 3.0)
    assert np.asarray(spec.clip(jnp.full((2, 3), 2.5))).tolist() == [[1.0, 2.0, 2.5]] * 2
    with pytest.raises(ValueError, match=r"low\[1\]=3 > high\[1\]=1.*swapped"):
        jre.ActionSpec((2,), jnp.float32, low=(0.0, 3.0), high=1.0)
    with pytest.raises(ValueError, match=r"low has 2 values for the action shape \(3,\)"):
        jre.ActionSpec((3,), jnp.float32, low=(0.0, 1.0), high=5.0)
    with pytest.raises(ValueError, match=r"high .* holds NaN"):
        jre.ActionSpec((1,), jnp.float32, low=0.0, high=float("nan"))


def test_sac_and_td3_refuse_bounds_they_cannot_scale_into(cfg):
    from jaxrl_engine.algos.off_policy import action_bounds

    unbounded = jre.ActionSpec((2,), jnp.float32, low=-np.inf, high=np.inf)
    spec = jre.EnvSpec("Free", (3,), jnp.float32, unbounded, 10)
    with pytest.raises(ValueError, match=r"'Free': action bounds .* are not finite in float32"):
        action_bounds(spec)
    huge = jre.ActionSpec((1,), jnp.float32, low=-3e38, high=3e38)  # (high - low overflows)
    with pytest.raises(ValueError, match="not finite in float32: SAC and TD3"):
        action_bounds(jre.EnvSpec("Huge", (3,), jnp.float32, huge, 10))
    bounded = jre.EnvSpec(
        "Box", (3,), jnp.float32, jre.ActionSpec((2,), jnp.float32, low=-2, high=2), 10
    )
    low, high = action_bounds(bounded)
    assert low.dtype == np.float32 and high.tolist() == [2.0, 2.0]
