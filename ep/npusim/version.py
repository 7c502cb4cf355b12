"""Versions the NPU execution provider stamps into what it produces.

``SDK_VERSION`` is the version of this SDK (the EP, its compiler and the firmware model): it goes
into every context binary and into the ``ep_sdk_version`` attribute of EPContext nodes. A binary
built by an SDK of another *major* version is refused, since the program encoding may differ.

``FORMAT_VERSION`` is the ``(major, minor)`` version of the context binary layout specified in
``docs/binary_format.md``: the major changes on any incompatible layout change; the minor changes
when something is added that older readers may safely ignore.
"""

from __future__ import annotations

SDK_VERSION = "0.1.0"
FORMAT_VERSION: tuple[int, int] = (2, 2)


def sdk_major(version: str) -> int:
    """The major component of a ``MAJOR.MINOR.PATCH`` version string.

    Raises ``ValueError`` when ``version`` does not start with a decimal major number.
    """
    head = version.split(".", 1)[0]
    if not head.isdecimal() or not head.isascii():
        raise ValueError(f"version {version!r} does not start with a MAJOR number")
    return int(head)
