"""Child processes that take Ctrl-C as a terminal user's command does."""

import signal


def interruptible() -> None:
    """``preexec_fn`` restoring SIGINT's default in the child before it starts.

    A shell running a command in the background without job control (``cmd &`` in a script, nohup, some
    CI runners) starts it with SIGINT ignored, and Python then never installs its KeyboardInterrupt
    handler; the Ctrl-C tests would send a signal nobody hears.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)
