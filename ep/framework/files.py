"""Writing files so that a reader never sees half of one.

Every file the EP produces (EPContext models, context binaries, external initializers, profiles)
goes through :func:`atomic_write`: the bytes land in a temporary file in the target's folder,
are fsynced, and the temporary file is renamed over the target. A failure at any point removes
the temporary file and leaves the target as it was.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path


def atomic_write(path: str | os.PathLike[str], chunks: Iterable[bytes]) -> None:
    """Write ``chunks`` to ``path`` atomically (temporary file, fsync, rename)."""
    target = Path(path)
    fd, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
