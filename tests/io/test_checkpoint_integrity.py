"""Checkpoint integrity: the metadata carries its SHA-256 (an edit or a nulled CRC is refused), a
CRC-32 may be missing only for arrays that are not fully addressable, errors name the file and
the command that resumes from the previous intact checkpoint, and a full disk during a save gives
one `CheckpointWriteError` with the earlier checkpoints intact and no temporary files left."""

from __future__ import annotations

import errno
import hashlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl_engine as jre
from jaxrl_engine.io import checkpoint as checkpoint_module
from jaxrl_engine.io.checkpoint import (
    TMP_SUFFIX,
    Checkpointer,
    CheckpointError,
    CheckpointWriteError,
)
from tests.conftest import small_config
from tests.io.test_checkpoint import leaves_bytes, save

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return jre.build(small_config(tmp_path=tmp_path_factory.mktemp("runs")))


@pytest.fixture(scope="module")
def states(engine):
    """The states after epochs 1, 2 and 3 (index = epoch - 1; copies: `epoch` donates)."""
    state, out = engine.init(jax.random.key(0)), []
    for _ in range(3):
        state, _ = engine.epoch(state)
        out.append(jax.tree.map(lambda x: x.copy(), state))
    return out


def saved(engine, states, run: Path, epochs: int) -> Checkpointer:
    checkpoints = Checkpointer(run / "checkpoints")
    for state in states[:epochs]:
        save(checkpoints, engine, state)
    return checkpoints


def meta_file(run: Path, epoch: int) -> Path:
    return run / "checkpoints" / f"epoch_{epoch}" / "meta" / "metadata"


def edit_meta(run: Path, epoch: int, change, rehash: bool = False) -> None:
    """Edit the stored metadata JSON; rehash: recompute its `sha256` as a forger would."""
    path = meta_file(run, epoch)
    meta = json.loads(path.read_text())
    change(meta)
    if rehash:
        meta.pop("sha256", None)
        canonical = json.dumps(meta, sort_keys=True, separators=(",", ":"), allow_nan=False)
        meta["sha256"] = hashlib.sha256(canonical.encode()).hexdigest()
    path.write_text(json.dumps(meta))


def null_crcs(meta: dict) -> None:
    for leaf in meta["leaves"]:
        leaf["crc32"] = None


def test_an_edited_hyperparameter_in_the_metadata_is_refused(engine, states, tmp_path):
    checkpoints = saved(engine, states, tmp_path, 1)
    edit_meta(tmp_path, 1, lambda meta: meta["config"]["algo"].update(lr=0.5))
    for load in (checkpoints.info, lambda: checkpoints.restore(engine)):
        with pytest.raises(CheckpointError) as info:
            load()
        message = str(info.value)
        assert "epoch_1' is corrupted or was edited: its metadata does not match its checksum" in (
            message
        )
        assert str(meta_file(tmp_path, 1)) in message and "only checkpoint" in message


@pytest.mark.parametrize("drop", ["sha256", None])
def test_nulled_crcs_or_a_removed_checksum_are_refused(engine, states, tmp_path, drop):
    checkpoints = saved(engine, states, tmp_path, 1)
    edit_meta(tmp_path, 1, lambda meta: (null_crcs(meta), meta.pop(drop, None)))
    with pytest.raises(CheckpointError, match="does not match its checksum"):
        checkpoints.restore(engine)


@pytest.mark.parametrize("claim_skipped", [False, True])
def test_nulled_crcs_with_a_recomputed_checksum_are_refused_for_addressable_arrays(
    engine, states, tmp_path, claim_skipped
):
    """A forger who also recomputes the checksum (and even claims the CRC was skipped) gets past
    the metadata check, not the CRC rule: these arrays are fully addressable."""

    def forge(meta):
        null_crcs(meta)
        if claim_skipped:
            for leaf in meta["leaves"]:
                leaf["crc32_skipped"] = "not fully addressable"

    checkpoints = saved(engine, states, tmp_path, 2)
    edit_meta(tmp_path, 2, forge, rehash=True)
    assert checkpoints.info(2).epoch == 2  # the recomputed checksum passes
    with pytest.raises(CheckpointError) as info:
        checkpoints.restore(engine)
    message = str(info.value)
    assert "epoch_2' is corrupted or was edited: " in message
    assert "has no valid CRC-32 or sum64 checksum" in message
    assert f"--resume {tmp_path} --from-checkpoint 1" in message


@pytest.mark.parametrize(
    "field, value",
    [
        ("epoch", "ten"),
        ("num_epochs", "x"),
        ("config", "not a dict"),
        ("metrics_lines", [12, None, "garbage"]),
        ("metrics_log", {"bytes": "26", "sha256": "x", "records": 2}),
        ("metrics_log", {"bytes": -1, "sha256": "x", "records": 2}),
        ("metrics_log", [26]),
        ("leaves", ["not a leaf"]),
        ("epoch", True),
    ],
)
def test_metadata_of_the_wrong_types_with_a_recomputed_checksum_is_refused(
    engine, states, tmp_path, field, value
):
    """A forged checksum gets past the hash; a field of another type than `save` writes is
    still a `CheckpointError` naming it (not a TypeError in the driver later)."""
    checkpoints = saved(engine, states, tmp_path, 1)
    edit_meta(tmp_path, 1, lambda meta: meta.update({field: value}), rehash=True)
    with pytest.raises(CheckpointError, match=rf"metadata field\(s\) \['{field}'\]"):
        checkpoints.info(1)


def test_an_unknown_prng_implementation_with_a_recomputed_checksum_is_refused(
    engine, states, tmp_path
):
    def forge(meta):
        for leaf in meta["leaves"]:
            if leaf["key_impl"] is not None:
                leaf["key_impl"] = "bogus"

    checkpoints = saved(engine, states, tmp_path, 1)
    edit_meta(tmp_path, 1, forge, rehash=True)
    with pytest.raises(CheckpointError, match="PRNG implementation 'bogus'"):
        checkpoints.restore(engine)


def test_a_leaf_without_a_crc_needs_its_sharding_independent_sum64():
    """A leaf saved sharded over processes has no CRC-32 but a sum64, checked on restore
    whatever the restoring process holds; a leaf with neither is refused."""
    problem = checkpoint_module._crc_problem
    array = jnp.arange(12.0).reshape(3, 4)
    skipped = {"path": ".x", "crc32": None, "crc32_skipped": "not fully addressable"}
    sum64 = checkpoint_module._sum64(array)
    assert problem({**skipped, "sum64": sum64}, array) == ""
    assert "do not match their checksum (sum64)" in problem(
        {**skipped, "sum64": sum64}, array.at[1, 2].add(1.0)
    )
    assert "has no valid CRC-32 or sum64" in problem(skipped, array)
    assert "has no valid CRC-32 or sum64" in problem({**skipped, "sum64": str(sum64)}, array)
    assert "has no valid CRC-32 or sum64" in problem({"path": ".x", "crc32": "7"}, array)
    crc = checkpoint_module._crc32(np.asarray(array))
    assert problem({"path": ".x", "crc32": crc}, array) == ""
    assert "do not match their CRC-32" in problem({"path": ".x", "crc32": crc + 1}, array)


@pytest.mark.parametrize(
    "format, said",
    [
        (2, r"has format 2; this version reads formats 3, 4$"),
        (5, "written by a newer jaxrl_engine"),
    ],
)
def test_a_checkpoint_of_another_format_is_refused(engine, states, tmp_path, format, said):
    checkpoints = saved(engine, states, tmp_path, 1)
    edit_meta(tmp_path, 1, lambda meta: (meta.update(format=format), meta.pop("sha256", None)))
    with pytest.raises(CheckpointError, match=said):
        checkpoints.info()


def test_the_metadata_is_strict_json_with_its_checksum(engine, states, tmp_path):
    saved(engine, states, tmp_path, 1)
    meta = json.loads(
        meta_file(tmp_path, 1).read_text(),
        parse_constant=lambda token: pytest.fail(f"non-JSON token {token}"),
    )
    assert meta["format"] == 4 and len(meta["sha256"]) == 64
    assert all(type(leaf["crc32"]) is int for leaf in meta["leaves"])


def test_a_corrupted_latest_checkpoint_names_the_command_for_the_previous_intact_one(
    engine, states, tmp_path
):
    checkpoints = saved(engine, states, tmp_path, 3)
    edit_meta(tmp_path, 3, lambda meta: meta.update(num_epochs=99))
    with pytest.raises(CheckpointError) as info:
        checkpoints.restore(engine)
    message = str(info.value)
    assert str(meta_file(tmp_path, 3)) in message
    assert message.endswith(
        "resume from the previous checkpoint (epoch 2): "
        f"jaxrl-engine train --resume {tmp_path} --from-checkpoint 2"
    )
    # Epoch 2 edited as well: the hint skips it.
    edit_meta(tmp_path, 2, lambda meta: meta.update(num_epochs=99))
    assert checkpoints.intact_before(3) == 1
    with pytest.raises(CheckpointError, match=r"epoch_3.*--from-checkpoint 1$"):
        checkpoints.info()
    restored, _ = checkpoints.restore(engine, 1)
    assert leaves_bytes(restored) == leaves_bytes(states[0])


def test_a_save_failing_with_enospc_raises_one_error_and_leaves_no_temporary_directory(
    engine, states, tmp_path, capfd
):
    checkpoints = saved(engine, states, tmp_path, 1)
    capfd.readouterr()

    async def full(self, x, directory):
        raise OSError(errno.ENOSPC, "No space left on device")

    handler = "orbax.checkpoint._src.handlers.json_checkpoint_handler.JsonCheckpointHandler"
    with mock.patch(f"{handler}._save_fn", full), pytest.raises(CheckpointWriteError) as info:
        save(checkpoints, engine, states[1])
    assert isinstance(info.value, OSError) and info.value.errno == errno.ENOSPC
    assert str(info.value) == (
        f"cannot write checkpoint {str(tmp_path / 'checkpoints' / 'epoch_2')!r}: OSError: "
        "[Errno 28] No space left on device (the previous checkpoint, epoch 1, is intact)"
    )
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err and "ERROR" not in out + err
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["epoch_1"]
    assert checkpoints.epochs() == [1]
    save(checkpoints, engine, states[1])  # the Checkpointer still works
    restored, _ = checkpoints.restore(engine, 1)
    assert leaves_bytes(restored) == leaves_bytes(states[0])


DISK_FULL = textwrap.dedent(
    """
    import json, resource, signal, sys
    from pathlib import Path
    import jax, numpy as np
    import jaxrl_engine as jre
    from jaxrl_engine.io.checkpoint import Checkpointer
    from tests.conftest import small_config

    run = Path(sys.argv[1])
    engine = jre.build(small_config(tmp_path=run.parent))
    checkpoints = Checkpointer(run / "checkpoints")
    def save(state):
        return checkpoints.save(state, config=engine.driver.cfg.model_dump(mode="json"),
                                num_epochs=engine.num_epochs)
    def raw(s):
        return [np.asarray(x).tobytes() for x in
                jax.tree.leaves(s.replace(rng=jax.random.key_data(s.rng)))]
    first, _ = engine.epoch(engine.init(jax.random.key(0)))
    save(first)
    first_raw = raw(first)
    second, _ = engine.epoch(first)  # donates `first`
    meta_size = (run / "checkpoints" / "epoch_1" / "meta" / "metadata").stat().st_size
    largest = max(p.stat().st_size for p in (run / "checkpoints" / "epoch_1").rglob("*"))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    out = {"largest_above_limit": largest > meta_size + 1000, "saves": []}
    # 200 bytes: the first file written fails; the metadata's size + 1000: the array files fail.
    for limit in (200, meta_size + 1000):
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
        try:
            save(second)
            out["saves"].append("saved")
        except Exception as e:
            out["saves"].append([type(e).__name__, isinstance(e, OSError), e.errno, str(e)])
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
        out.setdefault("left", []).append(sorted(p.name for p in (run / "checkpoints").iterdir()))
    restored, _ = Checkpointer(run / "checkpoints", read_only=True).restore(engine, 1)
    out["previous_bitwise"] = raw(restored) == first_raw
    out["saved_after"] = str(save(second))
    print(json.dumps(out))
    """
)


def test_disk_full_during_a_save_gives_one_clean_error_and_keeps_the_previous_checkpoint(
    tmp_path,
):
    """A real failing write: RLIMIT_FSIZE makes writes past the limit fail with EFBIG (errno 27),
    in orbax's own Python writes and in tensorstore's."""
    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-c", DISK_FULL, str(run)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["largest_above_limit"]
    message = (
        f"cannot write checkpoint {str(run / 'checkpoints' / 'epoch_2')!r}: OSError: [Errno 27] "
        "File too large (the previous checkpoint, epoch 1, is intact)"
    )
    assert out["saves"] == [["CheckpointWriteError", True, 27, message]] * 2
    assert out["left"] == [["epoch_1"]] * 2  # no *.orbax-checkpoint-tmp
    assert out["previous_bitwise"] and out["saved_after"] == str(run / "checkpoints" / "epoch_2")
    for noise in ("Traceback", "ERROR", "Event loop", TMP_SUFFIX):
        assert noise not in proc.stderr, proc.stderr[-3000:]
