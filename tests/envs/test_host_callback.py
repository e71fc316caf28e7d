"""`ordered_host_call` (the host envs' step callback): what `io_callback(ordered=True)` does,
with numpy arrays handed to the function, on the installed jax's fast path."""

from __future__ import annotations

import jax
import jax.interpreters.mlir
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback

import jaxrl_engine as jre
from jaxrl_engine.envs import host_callback
from jaxrl_engine.envs.host_callback import ordered_host_call
from tests.conftest import SMALL


def test_the_installed_jax_takes_the_fast_path():
    # On a jax without the internals the module falls back to io_callback (correct, ~45 us a
    # call slower); this says so when an upgrade takes them away.
    assert host_callback.FAST
    assert host_callback._fast_path()


def test_a_jax_whose_internals_do_not_lower_gets_io_callback_with_a_warning(monkeypatch):
    def broken(*args, **kwargs):
        raise TypeError("emit_python_callback() got an unexpected keyword argument")

    monkeypatch.setattr(jax.interpreters.mlir, "emit_python_callback", broken)
    seen = []

    def host(x):
        seen.append(type(x))
        return x + 1

    fn = jax.jit(lambda x: ordered_host_call(host, jax.ShapeDtypeStruct((), jnp.float32), x))
    host_callback._lowers.cache_clear()  # the check runs again, on the broken lowering
    try:
        with pytest.warns(UserWarning, match="io_callback"):
            out = fn(jnp.float32(1.0))
    finally:
        host_callback._lowers.cache_clear()  # later tests check the real one
    assert float(out) == 2.0
    assert seen and seen[0] is not np.ndarray  # io_callback's jax Array: the fallback ran


def counting_scan(call):
    """A scan whose every step calls the host with its carry; the host answers carry + its
    call count, so results depend on the calls' order and number."""
    calls: list[tuple[type, np.ndarray]] = []

    def host(x):
        calls.append((type(x), np.array(x)))
        return x * 2 + len(calls), np.float32(len(calls))

    shapes = (jax.ShapeDtypeStruct((3,), jnp.int32), jax.ShapeDtypeStruct((), jnp.float32))

    @jax.jit
    def run(x):
        def step(c, _):
            y, n = call(host, shapes, c)
            return y, n

        return jax.lax.scan(step, x, None, length=5)

    return run, calls


def test_results_and_call_order_equal_an_ordered_io_callback():
    fast, fast_calls = counting_scan(ordered_host_call)
    slow, slow_calls = counting_scan(lambda f, s, *a: io_callback(f, s, *a, ordered=True))
    x = jnp.arange(3, dtype=jnp.int32)
    out_fast, out_slow = jax.device_get(fast(x)), jax.device_get(slow(x))
    jax.tree.map(np.testing.assert_array_equal, out_fast, out_slow)
    assert [c[1].tolist() for c in fast_calls] == [c[1].tolist() for c in slow_calls]
    assert len(fast_calls) == 5
    # The function gets numpy arrays (io_callback's are jax Arrays).
    assert all(kind is np.ndarray for kind, _ in fast_calls)


def test_calls_in_two_programs_run_in_dispatch_order():
    seen: list[str] = []

    def tag(name):
        def host(x):
            seen.append(name)
            return x

        return jax.jit(lambda x: ordered_host_call(host, jax.ShapeDtypeStruct((), jnp.float32), x))

    a, b = tag("a"), tag("b")
    x = jnp.float32(1.0)
    for _ in range(3):
        a(x)
        b(x)
    jax.effects_barrier()
    assert seen == ["a", "b"] * 3


def test_the_call_carries_the_ordered_io_effect_and_is_never_dropped():
    seen: list[float] = []

    def host(x):
        seen.append(float(x))
        return x

    def f(x):
        ordered_host_call(host, jax.ShapeDtypeStruct((), jnp.float32), x)  # result unused
        return x + 1

    assert host_callback._EFFECT in jax.make_jaxpr(f)(jnp.float32(0.0)).effects
    jax.jit(f)(jnp.float32(3.0))
    jax.effects_barrier()
    assert seen == [3.0]


def test_it_runs_eagerly_and_under_disable_jit():
    def host(x):
        assert isinstance(x, np.ndarray)
        return x + 1

    struct = jax.ShapeDtypeStruct((2,), jnp.float32)
    np.testing.assert_array_equal(ordered_host_call(host, struct, jnp.zeros(2)), np.ones(2))
    with jax.disable_jit():
        out = jax.lax.scan(
            lambda c, _: (ordered_host_call(host, struct, c), None), jnp.zeros(2), None, length=3
        )[0]
    np.testing.assert_array_equal(out, np.full(2, 3.0))


def test_a_64_bit_result_without_x64_and_a_gradient_are_refused_when_traced():
    with pytest.raises(ValueError, match="64-bit"):
        jax.make_jaxpr(
            lambda x: ordered_host_call(lambda a: a, jax.ShapeDtypeStruct((), np.float64), x)
        )(jnp.float32(0.0))
    with pytest.raises(ValueError, match="cannot be differentiated"):
        jax.grad(
            lambda x: ordered_host_call(lambda a: a, jax.ShapeDtypeStruct((), jnp.float32), x)
        )(jnp.float32(1.0))


def test_a_result_of_the_wrong_shape_or_dtype_is_an_error_naming_it():
    def run(value):
        return jax.jit(
            lambda x: ordered_host_call(lambda _: value, jax.ShapeDtypeStruct((2,), jnp.float32), x)
        )(jnp.float32(0.0))

    np.testing.assert_array_equal(run(np.ones(2, np.float32)), np.ones(2, np.float32))
    with pytest.raises(Exception, match="Incorrect output shape"):
        jax.block_until_ready(run(np.ones(3, np.float32)))
    with pytest.raises(Exception, match="Incorrect output dtype"):
        jax.block_until_ready(run(np.ones(2, np.int64)))


def test_an_exception_in_the_function_reaches_the_caller():
    def host(x):
        raise ValueError("the simulator broke")

    fn = jax.jit(lambda x: ordered_host_call(host, jax.ShapeDtypeStruct((), jnp.float32), x))
    with pytest.raises(Exception, match="the simulator broke"):
        jax.block_until_ready(fn(jnp.float32(0.0)))


def test_vmapping_a_host_call_is_refused_with_a_message():
    fn = jax.vmap(
        lambda x: ordered_host_call(lambda a: a, jax.ShapeDtypeStruct((), jnp.float32), x)
    )
    with pytest.raises(ValueError, match="cannot be vmapped"):
        fn(jnp.zeros(3))


def test_a_host_env_rollout_is_bitwise_the_same_on_the_fallback(monkeypatch):
    """PPO on gymnasium CartPole: two rollouts and a training epoch from the same key, with
    the fast path and with io_callback (the fallback a jax without its internals takes)."""

    def states(fast: bool):
        monkeypatch.setattr(host_callback, "FAST", fast)
        cfg = jre.load_config(None, [*SMALL, "env.suite=gymnasium", "run_dir=unused"])
        engine = jre.build(cfg)
        state = engine.init(jax.random.key(7))
        state, metrics = engine.epoch(state)
        state, _ = engine.rollout(state)
        out = jax.device_get((state.buffer, state.train, state.stats, metrics))
        engine.env.close()
        return out

    fast, slow = states(True), states(False)
    jax.tree.map(np.testing.assert_array_equal, fast, slow)
