"""Real threads started together, for tests of what several threads do at once."""

from __future__ import annotations

import threading
from collections.abc import Callable


def run_together(work: Callable[[int], object], count: int) -> None:
    """Run ``work(k)`` for each ``k`` in ``range(count)``, each on a thread of its own, all
    released at once by a barrier; once every thread has ended, re-raise the first exception
    any of them raised."""
    start = threading.Barrier(count)
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            start.wait()
            work(k)
        except BaseException as exc:  # re-raised on the calling thread below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
