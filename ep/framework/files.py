"""Writing files so that a reader never sees half of one.

Every file the EP produces (EPContext models, context binaries, external initializers, profiles)
goes through :func:`atomic_write`: the bytes land in a temporary file in the target's folder,
are fsynced, and the temporary file is renamed over the target. A failure at any point removes
the temporary file, leaves the target as it was and is ``Fail`` with the operating system's
reason (disk full, read-only folder, permission denied).

A process killed mid-write (``kill -9``) cannot remove its temporary file. Temporaries are
therefore named after the writing process (``.<target>.npusim-<pid>-<random>.tmp``), and
:func:`remove_stale_temporaries`, run before each generation into a folder, removes those whose
process is gone.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Iterable
from pathlib import Path

from npu_sim.files import write_atomic

from ..errors import Fail

_TEMP = re.compile(r"^\..*\.?npusim-(\d+)-[^/]*(\.tmp)?$")


def temp_prefix(name: str = "") -> str:
    """The prefix of this process's temporary files and folders for ``name``."""
    return f".{name}.npusim-{os.getpid()}-" if name else f".npusim-{os.getpid()}-"


def atomic_write(path: str | os.PathLike[str], chunks: Iterable[bytes]) -> None:
    """Write ``chunks`` to ``path`` atomically (:func:`npu_sim.files.write_atomic`, with this
    process's temporary name); an OS error is ``Fail`` naming the file and the reason, with
    nothing left behind."""
    target = Path(path)
    try:
        write_atomic(target, chunks, prefix=temp_prefix(target.name))
    except OSError as exc:
        raise Fail(f"cannot write {str(target)!r}: {exc.strerror or exc}") from None


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except PermissionError:  # exists, owned by another user
        return True
    except (OSError, OverflowError, ValueError):
        return False
    return True


def remove_stale_temporaries(folder: str | os.PathLike[str]) -> list[str]:
    """Remove the temporary files and folders a killed writer left in ``folder``; returns
    their names. Those of live processes (this one included) are left alone."""
    removed: list[str] = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            match = _TEMP.match(entry.name)
            if match is None or _alive(int(match.group(1))):
                continue
            with contextlib.suppress(OSError):
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
                removed.append(entry.name)
    return removed
