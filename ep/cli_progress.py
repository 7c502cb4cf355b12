"""Progress bars of the command line, on stderr, for work that can take more than a moment.

``with phase("compiling bert.onnx for npu-m") as step:`` shows the label and the elapsed time
once the phase has lasted :data:`DELAY` seconds (shorter phases show nothing) and clears it at
the end; with ``total=N`` it is a bar that ``step(k)`` advances. Bars are drawn by tqdm, an
optional dependency (``pip install "npu-sim[progress]"``): without it, or when stderr is not a
terminal (a pipe, a file, CI), or with ``NPU_SIM_PROGRESS=0``, a phase is silent and costs
nothing, so scripted output and logs never carry progress noise.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

DELAY = 2.0  # seconds before a phase shows itself
REFRESH = 0.5  # seconds between redraws of the elapsed time


def _tqdm() -> Any:
    try:
        from tqdm import tqdm
    except ImportError:  # the optional extra is not installed: progress stays silent
        return None
    return tqdm


def wanted(stream: TextIO) -> bool:
    """Whether progress is drawn on ``stream``: a terminal, and not NPU_SIM_PROGRESS=0."""
    if os.environ.get("NPU_SIM_PROGRESS", "1") == "0":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


@contextmanager
def phase(label: str, total: int | None = None, *, stream: TextIO | None = None,
          delay: float = DELAY) -> Iterator[Callable[[int], None]]:
    """A progress display for the ``with`` block; yields ``step(n)`` (advance by ``n``)."""
    stream = stream or sys.stderr
    tqdm = _tqdm() if wanted(stream) else None
    if tqdm is None:
        yield lambda n=1: None
        return
    bar = tqdm(total=total, desc=label, file=stream, leave=False, delay=delay,
               bar_format=None if total else "{desc}: {elapsed}", dynamic_ncols=True)
    done = threading.Event()

    def tick() -> None:  # an indeterminate phase has no updates: redraw its elapsed time
        while not done.wait(REFRESH):
            if bar.format_dict["elapsed"] >= delay:
                bar.refresh()

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield bar.update
    finally:
        done.set()
        ticker.join()
        bar.close()
