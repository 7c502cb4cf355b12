"""Forking while another thread holds a module's lock: the child must still get through."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import pytest

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="the platform has no fork()")


def finishes_after_fork(lock: threading.Lock, work: Callable[[], object],
                        timeout: float = 20.0) -> bool:
    """Whether a child forked while a thread of the parent holds ``lock`` runs ``work`` to the
    end (exit status 0) within ``timeout`` seconds; a child still running then is killed."""
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with lock:
            held.set()
            release.wait()

    thread = threading.Thread(target=holder)
    thread.start()
    held.wait()
    pid = os.fork()
    if pid == 0:  # the child: no pytest machinery, only the work and an exit status
        code = 1
        try:
            work()
            code = 0
        finally:
            os._exit(code)
    release.set()
    thread.join()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status) == 0
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return False
