"""The DLPack bridge: zero-copy proven by pointers, and one test per trap in NOTES-jax-torch.md."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from jaxrl_engine.interop import (  # noqa: E402
    BridgeError,
    BridgeReport,
    check_donatable,
    from_torch,
    shares_memory,
    to_torch,
    torch_views,
)
from tests.conftest import subprocess_env  # noqa: E402

ZERO_COPY_DTYPES = [
    (torch.float32, jnp.float32),
    (torch.bfloat16, jnp.bfloat16),
    (torch.float16, jnp.float16),
    (torch.int32, jnp.int32),
    (torch.int16, jnp.int16),
    (torch.int8, jnp.int8),
    (torch.uint8, jnp.uint8),
    (torch.bool, jnp.bool_),
    (torch.complex64, jnp.complex64),
]


def _tensor(dtype, shape=(8, 16)):
    return (torch.arange(int(np.prod(shape))).reshape(shape) % 7).to(dtype)


@pytest.mark.parametrize(("tdtype", "jdtype"), ZERO_COPY_DTYPES)
def test_torch_to_jax_is_zero_copy_for_each_dtype(tdtype, jdtype):
    t = _tensor(tdtype)
    report = BridgeReport()
    a = from_torch({"x": t}, report=report)["x"]
    assert a.dtype == jdtype
    assert a.unsafe_buffer_pointer() == t.data_ptr()
    assert report.copied_bytes == 0 and report.zero_copy_bytes == t.numel() * t.element_size()
    t[0, 0] = 1  # an in-place torch write is visible in JAX: the same memory
    assert bool(a[0, 0] == jnp.asarray(1, jdtype))


@pytest.mark.parametrize(("tdtype", "jdtype"), ZERO_COPY_DTYPES)
def test_jax_to_torch_is_zero_copy_for_each_dtype(tdtype, jdtype):
    a = jnp.asarray(np.arange(128).reshape(8, 16) % 7).astype(jdtype)
    report = BridgeReport()
    t = to_torch([a], report=report)[0]
    assert t.dtype == tdtype
    assert t.data_ptr() == a.unsafe_buffer_pointer()
    assert report.copied_bytes == 0
    assert shares_memory(a, t)


def test_whole_state_dict_round_trips_zero_copy():
    module = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    state = module.state_dict()
    params = from_torch(dict(state))
    for name, tensor in state.items():
        assert params[name].unsafe_buffer_pointer() == tensor.data_ptr(), name
    back = to_torch(params)
    for name, tensor in state.items():
        assert back[name].data_ptr() == tensor.data_ptr(), name


def test_non_array_leaves_pass_through():
    out = from_torch({"t": torch.ones(4), "n": 3, "s": "x"})
    assert out["n"] == 3 and out["s"] == "x" and isinstance(out["t"], jax.Array)


# ---------------------------------------------------------------- traps, torch -> JAX
def test_int64_is_refused_or_cast_with_a_report_never_silently_truncated():
    t = torch.arange(64, dtype=torch.int64)
    with pytest.raises(BridgeError, match=r"int64.*jax_enable_x64"):
        from_torch(t)
    report = BridgeReport()
    a = from_torch(t, copy="if_needed", report=report)
    assert a.dtype == jnp.int32 and np.array_equal(np.asarray(a), np.arange(64))
    assert report.copied_bytes == 64 * 8 and "int64" in report.copies[0].reason
    # What plain DLPack does with the same value: silently wrong.
    big = torch.tensor([2**40], dtype=torch.int64)
    assert int(jax.dlpack.from_dlpack(big)[0]) == 0
    with pytest.raises(BridgeError, match="outside"):
        from_torch(big, copy="if_needed")


def test_float64_is_refused_or_cast_with_a_report_never_silently_inf():
    t = torch.linspace(0, 1, 64, dtype=torch.float64)
    with pytest.raises(BridgeError, match="float64"):
        from_torch(t)
    report = BridgeReport()
    a = from_torch(t, copy="if_needed", report=report)
    assert a.dtype == jnp.float32 and report.copied_bytes == 64 * 8
    np.testing.assert_allclose(np.asarray(a), t.numpy(), rtol=1e-6)
    huge = torch.tensor([1e300], dtype=torch.float64)
    assert np.isinf(np.asarray(jax.dlpack.from_dlpack(huge))[0])  # the silent trap
    with pytest.raises(BridgeError, match="overflow"):
        from_torch(huge, copy="if_needed")


@pytest.mark.parametrize(
    "make",
    [lambda: torch.arange(64.0).reshape(8, 8)[:, ::2], lambda: torch.ones(1, 16).expand(4, 16)],
)
def test_non_compact_strides_are_refused_or_copied_with_a_report(make):
    t = make()
    with pytest.raises(BridgeError, match="not compact"):
        from_torch(t)
    report = BridgeReport()
    a = from_torch(t, copy="if_needed", report=report)
    np.testing.assert_array_equal(np.asarray(a), t.numpy())
    assert report.copied_bytes == t.numel() * 4 and not shares_memory(a, t)


def test_misaligned_views_are_refused_or_copied_with_a_report():
    view = torch.arange(100.0)[1:65]
    assert view.data_ptr() % 64 != 0
    with pytest.raises(BridgeError, match="aligned"):
        from_torch(view)
    report = BridgeReport()
    a = from_torch(view, copy="if_needed", report=report)
    np.testing.assert_array_equal(np.asarray(a), view.numpy())
    assert report.copied_bytes == 64 * 4 and "aligned" in report.copies[0].reason


def test_requires_grad_is_refused_with_the_fix_and_detach_is_zero_copy():
    p = torch.nn.Parameter(torch.ones(16))
    with pytest.raises(BridgeError, match="detach"):
        from_torch(p)
    a = from_torch(p, detach=True)
    assert a.unsafe_buffer_pointer() == p.data_ptr()


def test_conjugate_bit_is_refused_or_resolved_with_a_report():
    t = torch.ones(16, dtype=torch.complex64) * (1 + 2j)
    c = t.conj()
    assert c.is_conj()
    with pytest.raises(BridgeError, match="conjugate"):
        from_torch(c)
    report = BridgeReport()
    a = from_torch(c, copy="if_needed", report=report)
    np.testing.assert_allclose(np.asarray(a), np.full(16, 1 - 2j))
    assert report.copied_bytes == 16 * 8


def test_transposed_views_are_zero_copy_and_reported_as_relaid():
    t = torch.arange(64.0).reshape(8, 8)
    report = BridgeReport()
    a = from_torch(t.T, report=report)
    assert a.unsafe_buffer_pointer() == t.data_ptr()
    np.testing.assert_array_equal(np.asarray(a), t.T.numpy())
    assert report.transfers[0].relaid and not report.transfers[0].copied


def test_copy_always_really_copies_unlike_from_dlpack_copy_true():
    t = torch.ones(64)
    trap = jax.dlpack.from_dlpack(t, copy=True)
    assert trap.unsafe_buffer_pointer() == t.data_ptr()  # the trap: no copy made
    report = BridgeReport()
    a = from_torch(t, copy="always", report=report)
    assert not shares_memory(a, t) and report.copied_bytes == 256
    back = to_torch(a, copy="always")
    assert not shares_memory(a, back)


def test_resize_after_export_is_detected():
    t = torch.ones(64)
    report = BridgeReport()
    from_torch(t, report=report)
    report.check_alive()
    t.resize_(1 << 16)  # reallocates: the JAX array would read freed memory
    with pytest.raises(BridgeError, match="resized"):
        report.check_alive()


# ---------------------------------------------------------------- traps, JAX -> torch
def test_donating_an_array_torch_views_is_refused_up_front():
    a = jnp.arange(64.0)
    view = to_torch(a)
    # The trap itself: XLA skips the donation silently and torch keeps the old buffer.
    out = jax.jit(lambda x: x + 1, donate_argnums=0)(a)
    assert out.unsafe_buffer_pointer() != view.data_ptr()
    assert float(view[1]) == 1.0
    b = jnp.arange(64.0)
    view_b = to_torch(b)
    assert torch_views({"b": b}) == ["['b']"]
    with pytest.raises(BridgeError, match="donat"):
        check_donatable({"b": b})
    del view_b
    check_donatable({"b": b})  # no live torch view: fine


def test_keys_deleted_arrays_and_tracers_are_refused_with_the_fix():
    with pytest.raises(BridgeError, match="key_data"):
        to_torch(jax.random.key(0))
    d = jnp.ones(8)
    d.delete()
    with pytest.raises(BridgeError, match="deleted"):
        to_torch(d)
    with pytest.raises(BridgeError, match="callback"):
        jax.jit(lambda x: to_torch(x))(jnp.ones(3))


def test_host_memory_kinds_export_zero_copy():
    dev = jax.devices()[0]
    host = jax.device_put(
        jnp.arange(64.0), jax.sharding.SingleDeviceSharding(dev, memory_kind="pinned_host")
    )
    t = to_torch(host)
    assert t.data_ptr() == host.unsafe_buffer_pointer()


def test_sharded_arrays_are_refused_exported_per_shard_or_gathered():
    script = textwrap.dedent(
        """
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        from jaxrl_engine.interop import BridgeError, BridgeReport, to_torch, to_torch_shards
        mesh = Mesh(np.array(jax.devices()), ("data",))
        a = jax.device_put(jnp.arange(128.0), NamedSharding(mesh, P("data")))
        try:
            to_torch(a)
            raise SystemExit("no error")
        except BridgeError as e:
            assert "to_torch_shards" in str(e)
        shards = to_torch_shards(a)
        assert [t.data_ptr() for t in shards] == [s.data.unsafe_buffer_pointer() for s in a.addressable_shards]
        report = BridgeReport()
        whole = to_torch(a, copy="if_needed", report=report)
        assert whole.tolist() == list(range(128)) and report.copied_bytes == 512
        r = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P()))
        t = to_torch(r)
        assert t.data_ptr() == r.addressable_shards[0].data.unsafe_buffer_pointer()
        print("ok")
        """
    )
    env = subprocess_env(devices=2)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]


def test_copy_mode_is_checked():
    with pytest.raises(BridgeError, match=r"copy="):
        from_torch(torch.ones(2), copy="sometimes")


# ---------------------------------------------------------------- shares_memory
def test_shares_memory_compares_byte_ranges_across_libraries():
    base = torch.arange(128.0)
    left, right = base[:64], base[64:]
    assert shares_memory(base, left) and not shares_memory(left, right)
    a = from_torch(left)
    assert shares_memory(a, base) and not shares_memory(a, right)
    assert shares_memory(left.numpy(), a)
    assert not shares_memory(jnp.ones(4), jnp.ones(4))
