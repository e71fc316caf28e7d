"""TensorBoard event files, written directly: scalars only, one event per record.

An event file is a sequence of TFRecords (length, masked CRC-32C of the length, payload,
masked CRC-32C of the payload), each payload an `Event` protocol buffer
(tensorflow/core/util/event.proto). The engine writes three kinds: the `file_version` header,
a `SessionLog` START that tells TensorBoard to drop the events a crashed run logged at or after
a resumed run's first step (`purge_step`), and a `Summary` holding every scalar of one record.
Those few fields are encoded here by hand, so writing TensorBoard logs imports neither
TensorFlow nor tensorboardX (which imports torch when it is installed: 1.3 s of every run's
start on a 2-core CPU) and costs one event per epoch, not one per scalar. TensorBoard's own
reader checks the files in tests/io/test_logging.py.
"""

from __future__ import annotations

import itertools
import os
import socket
import struct
import time
from pathlib import Path
from typing import BinaryIO

_FILE_IDS = itertools.count()


def _crc32c_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_CRC_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), the checksum TFRecord framing uses."""
    crc = 0xFFFFFFFF
    table = _CRC_TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> bytes:
    crc = crc32c(data)
    return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


def tfrecord(payload: bytes) -> bytes:
    header = struct.pack("<Q", len(payload))
    return header + _masked_crc(header) + payload + _masked_crc(payload)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        bits, n = n & 0x7F, n >> 7
        if n:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (strings, bytes, messages)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def event(wall_time: float, step: int, what: bytes) -> bytes:
    """An `Event` (wall_time = 1, step = 2) followed by its `what` field, already encoded."""
    if step < 0:
        raise ValueError(f"event step must be >= 0, got {step}")
    return b"\x09" + struct.pack("<d", wall_time) + b"\x10" + _varint(step) + what


def file_version() -> bytes:
    return _field(3, b"brain.Event:2")


def session_start() -> bytes:
    return _field(7, b"\x08\x01")  # SessionLog{status: START}


def summary(values: dict[str, float]) -> bytes:
    """Event.summary (5): one `Summary.Value` (tag = 1, simple_value = 2) per scalar."""
    encoded = b"".join(
        _field(1, _field(1, tag.encode()) + b"\x15" + struct.pack("<f", value))
        for tag, value in values.items()
    )
    return _field(5, encoded)


class EventFileWriter:
    """One new event file in `logdir`, named as TensorBoard expects
    (`events.out.tfevents.<seconds>.<host>.<pid>.<n>`: unique within a process and across
    processes, where two writers of one second would otherwise share a name).

    `purge_step`: the first step this writer logs after a resume; TensorBoard hides what
    earlier files hold at or after it."""

    def __init__(self, logdir: str | Path, purge_step: int | None = None):
        logdir = Path(logdir)
        logdir.mkdir(parents=True, exist_ok=True)
        name = (
            f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}"
            f".{os.getpid()}.{next(_FILE_IDS):04d}"
        )
        self.path = logdir / name
        self._file: BinaryIO | None = open(self.path, "xb")  # noqa: SIM115 (closed in close())
        now = time.time()
        records = [event(now, 0, file_version())]
        if purge_step is not None:
            records += [event(now, purge_step, file_version())]
            records += [event(now, purge_step, session_start())]
        self._write(records)

    def _write(self, payloads: list[bytes]) -> None:
        if self._file is None:
            raise ValueError(f"{self.path} is closed")
        self._file.write(b"".join(tfrecord(p) for p in payloads))
        self._file.flush()

    def add_scalars(self, step: int, values: dict[str, float]) -> None:
        """Every scalar of one step in one event (written through to the file)."""
        self._write([event(time.time(), step, summary(values))])

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
