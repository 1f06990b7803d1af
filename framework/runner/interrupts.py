"""Ctrl-C inside a fit, seen as Ctrl-C by commands that run many fits; workers that stop with their parent.

Lightning answers Ctrl-C in ``fit`` by stopping gracefully and calling ``sys.exit(1)``
(``lightning.pytorch.trainer.call._call_and_handle_interrupt``); the ``ripieno`` command turns that
exit into its own message. ``ripieno tune`` and ``ripieno benchmark`` run many fits and must tell an
interrupted fit from a failed one, so that the trial or cell runs again when the command is
repeated, and the report is written from the store. ``fits_interrupted`` turns that exit back into
a ``KeyboardInterrupt``.

``stop_with_parent`` makes a spawned worker stop like Ctrl-C when the process that started it
dies (killed, or its terminal closed), instead of running its remaining fits to the end.
"""

from __future__ import annotations

import _thread
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

PARENT_GRACE_SECONDS = 60.0
"""How long a worker whose parent died may take to stop its fit before it exits at once."""


@contextmanager
def fits_interrupted() -> Iterator[None]:
    """In the block, a fit that Lightning stopped for Ctrl-C raises ``KeyboardInterrupt`` (module docstring).

    A SIGINT handler of the block's own notes that Ctrl-C came (then raises ``KeyboardInterrupt``
    as Python's does), so an exit that follows it is told from any other exit; the previous handler
    is back afterwards, whatever Lightning left. A process that ignores SIGINT keeps ignoring it.

    Example:
        >>> with fits_interrupted():  # an ordinary exit stays one
        ...     try:
        ...         raise SystemExit(2)
        ...     except SystemExit as stop:
        ...         print(stop.code)
        2
    """
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or previous in (signal.SIG_IGN, None):
        yield
        return
    interrupted = False

    def on_sigint(signum: int, frame: object) -> None:
        nonlocal interrupted
        interrupted = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    except SystemExit:
        if not interrupted:
            raise
        raise KeyboardInterrupt from None
    finally:
        signal.signal(signal.SIGINT, previous)


def join_workers(
    processes: list[multiprocessing.process.BaseProcess], grace: float = PARENT_GRACE_SECONDS
) -> None:
    """Wait for spawned workers; on Ctrl-C, interrupt them too, wait ``grace`` seconds, end the rest.

    Ctrl-C in a terminal reaches every process of the command, but a ``kill -INT`` of the parent
    alone does not: each worker gets SIGINT here so that it marks its running trial or cell to run
    again; the ``KeyboardInterrupt`` is raised again once they are gone.
    """
    try:
        for process in processes:
            process.join()
    except KeyboardInterrupt:
        for process in processes:
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signal.SIGINT)
        for process in processes:
            process.join(grace)
            if process.is_alive():
                process.terminate()
                process.join()
        raise


def stop_with_parent(grace: float = PARENT_GRACE_SECONDS) -> None:
    """In a spawned worker: when the parent process dies, interrupt this one as Ctrl-C would.

    A thread waits on the parent's sentinel; when it fires, the main thread gets a
    ``KeyboardInterrupt`` (the fit stops and its trial or cell is marked to run again), and after
    ``grace`` seconds the process exits regardless. Does nothing outside a multiprocessing child.
    """
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        _thread.interrupt_main(signal.SIGINT)
        threading.Event().wait(grace)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="ripieno-parent-watch").start()
