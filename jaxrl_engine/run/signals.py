"""SIGINT/SIGTERM during a run: the first asks the driver to stop after the current call; the
second ends the process at once. Before training (imports, build, compile) the CLI's
`stop_before_training` handler records the signal and the CLI stops at the next safe point."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from typing import Any


class StopSignal:
    """SIGINT/SIGTERM while training: the first asks to stop after the current epoch; the
    second ends the process at once (`os._exit(128 + signum)`), even while the main thread
    waits inside a compiled epoch.

    Python runs signal handlers only between bytecodes of the main thread, which may sit in
    one XLA call for minutes; so the C-level handler's wakeup fd is watched by a thread, which
    sees every signal as it arrives. Exiting without cleanup is safe: checkpoints, metrics
    rewrites and the summary are all written to a temporary name and renamed.
    """

    def __init__(self, checkpoints: bool = True) -> None:
        self.signame: str | None = None
        self.checkpoints = checkpoints
        # Nothing trained yet (a sweep compiling its first program): the signal then ends the
        # start-up, as the CLI's `stop_before_training` handler does, and says so.
        self.starting = False
        # Every epoch trained (the run's end: checkpoint, summary, export): a signal lets it
        # finish, and says so
        self.ending = False
        # The compiled call running now trains the run's last epochs (a sweep: its last
        # group's): a signal then lets the run complete, and says so
        self.last = False

    def agreed(self) -> str | None:
        """The signal this process or any other of the job got (None: none did), so that
        every process stops after the same epoch. A collective in a multi-process run: every
        process calls it at the same point. Another process's signal is not recorded as this
        one's (its own may still come: that one is then its first, not a second)."""
        # (here, not at the top: the CLI imports this module before JAX starts, for its
        # start-up handler; core.sharding imports jax)
        from jaxrl_engine.core.sharding import max_over_processes

        got = max_over_processes(signal.Signals[self.signame].value if self.signame else 0)
        return signal.Signals(got).name if got else None

    def handler(self, signum: int, frame: Any) -> None:
        """The Python-level handler (runs late, in the main thread); the watcher did the work."""

    def watch(self, wakeup: socket.socket) -> None:
        while data := wakeup.recv(64):
            for signum in data:
                if signum not in (signal.SIGINT, signal.SIGTERM):
                    continue
                if self.signame is not None:
                    os._exit(128 + signum)
                self.signame = signal.Signals(signum).name
                if self.starting:
                    print(
                        f"\njaxrl-engine: {self.signame}: stopping before training starts "
                        "(after the current step: compilation); send it again to exit at once",
                        file=sys.stderr,
                        flush=True,
                    )
                    continue
                if self.ending or self.last:
                    # (the last epochs may still fail nan_guard: the run then ends as that
                    # failure ends it, not with an export)
                    now = (
                        "the run has trained its last epoch; its checkpoint, summary and "
                        "export finish first"
                        if self.ending
                        else "the epochs running now are the last this run trains; it ends "
                        "after them as it would without the signal"
                    )
                    print(
                        f"\njaxrl-engine: {self.signame}: {now}; send it again to exit at once",
                        file=sys.stderr,
                        flush=True,
                    )
                    continue
                follows = (
                    "checkpoint and summary follow"
                    if self.checkpoints
                    else "the summary follows; save_interval=0 writes no checkpoint"
                )
                print(
                    f"\njaxrl-engine: {self.signame}: stopping after the epochs running now "
                    f"(up to the next evaluation or checkpoint: one compiled call; {follows}); "
                    "send it again to exit at once",
                    file=sys.stderr,
                    flush=True,
                )


@contextlib.contextmanager
def stop_on_signals(checkpoints: bool = True) -> Iterator[StopSignal]:
    stop = StopSignal(checkpoints)
    if threading.current_thread() is not threading.main_thread():
        yield stop  # signal handlers can only be installed from the main thread
        return
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    previous_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    previous = {sig: signal.signal(sig, stop.handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    watcher = threading.Thread(target=stop.watch, args=(reader,), daemon=True)
    watcher.start()
    try:
        yield stop
    finally:
        global _training_ended, _stopped_in_training
        _training_ended = True
        _stopped_in_training = stop.signame is not None  # a next signal is the second
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(previous_fd)
        writer.close()  # the watcher reads EOF and returns
        watcher.join()
        reader.close()


_pending: list[str] = []  # signals received before training (with `stop_before_training`)
# Set when a training's handler (`stop_on_signals`) gives the CLI's back: a signal then comes
# while the process closes, not before training.
_training_ended = False
_stopped_in_training = False  # that handler got a signal (its first)


def _record_early(signum: int, frame: Any) -> None:
    if _pending or _stopped_in_training:
        os._exit(128 + signum)
    _pending.append(signal.Signals(signum).name)
    when = (
        "the run has ended and is closing (its checkpoint and summary are written)"
        if _training_ended
        else "stopping before training starts (after the current step: imports or compilation)"
    )
    print(
        f"\njaxrl-engine: {_pending[0]}: {when}; send it again to exit at once",
        file=sys.stderr,
        flush=True,
    )


def stop_before_training() -> None:
    """Install the CLI's handler for the time before training: a signal is recorded, never
    raised at a random bytecode (a `KeyboardInterrupt` raised inside a garbage-collector
    callback is swallowed), and `raise_if_stopped` ends the start-up at the next safe point."""
    global _training_ended, _stopped_in_training
    _training_ended = _stopped_in_training = False
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _record_early)


def raise_if_stopped() -> None:
    """Raise `KeyboardInterrupt` when a signal came during start-up (`stop_before_training`)."""
    if _pending:
        raise KeyboardInterrupt(_pending[0])
