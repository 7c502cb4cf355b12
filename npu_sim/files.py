"""Writing a file so that a reader never sees half of it.

:func:`write_atomic` puts the bytes in a temporary file in the target's folder, fsyncs it and
renames it over the target: a reader sees the old file or the whole new one, and a failure at
any point removes the temporary file and leaves the target as it was. Every layer writes through
it (traces here; the EP's context models and binaries through ``ep.framework.files``, which
names its temporaries after the writing process and reports OS errors in ONNX Runtime's words).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path


def write_atomic(path: str | os.PathLike[str], chunks: Iterable[bytes], *,
                 prefix: str | None = None) -> Path:
    """Write ``chunks`` to ``path`` atomically; the temporary file's name starts with
    ``prefix`` (default ``.<name>.``). An ``OSError`` propagates with nothing left behind."""
    target = Path(path)
    temp: str | None = None
    try:
        fd, temp = tempfile.mkstemp(dir=target.parent, suffix=".tmp",
                                    prefix=prefix if prefix is not None else f".{target.name}.")
        os.chmod(temp, 0o644)  # mkstemp makes it private; the result is an ordinary file
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, target)
    except BaseException:
        if temp is not None:
            with contextlib.suppress(OSError):
                os.unlink(temp)
        raise
    return target
