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

Files a model refers to (external data, weight files, context binaries) are opened with
:func:`open_regular`: without blocking, and refused unless regular, so a FIFO put in a file's
place is an error at once, not a wait for a writer that never comes.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
from collections.abc import Iterable
from pathlib import Path

from npu_sim.files import write_atomic

from ..errors import Fail

_TEMP = re.compile(r"^\..*\.?npusim-(\d+)-[^/]*(\.tmp)?$")


class NotRegularFile(OSError):
    """A path :func:`open_regular` refused: not a regular file (a folder, a FIFO, a device)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(0, "not a regular file", os.fspath(path))


_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def open_regular(path: str | os.PathLike[str]) -> tuple[int, os.stat_result]:
    """A read-only descriptor of the regular file ``path`` and its status. Opened without
    blocking (reads of a regular file never block anyway); anything else is closed again and
    :class:`NotRegularFile`. Any other failure is the ``OSError`` of ``os.open``."""
    fd = os.open(path, _READ_FLAGS)
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode):
        os.close(fd)
        raise NotRegularFile(path)
    return fd, status


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
