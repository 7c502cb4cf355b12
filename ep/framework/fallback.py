"""onnxruntime's EP-error fallback, as its Python ``InferenceSession`` does it.

onnxruntime's Python layer (``onnxruntime_inference_collection.py``) retries, once, a session
whose creation raised a ``ValueError`` or ``RuntimeError`` (a provider spec it cannot read, a
provider name it does not know: ``Unknown Provider Type``) on ``CPUExecutionProvider``, and a
run that raised ``EPFail`` on a session re-created with that provider, printing what failed to
stdout. Its status errors (``InvalidGraph``, ``Fail``, ``NoSuchFile``...) are not
``RuntimeError``s there, so a bad model is raised as it is; ep's status errors subclass
``RuntimeError`` (:class:`ep.errors.OrtError`), so :func:`retries_creation` leaves them out by
name. Either fallback happens only while the session's fallback is enabled: by default, not
with ``enable_fallback=0``, and never again after one fallback (``disable_fallback``).

The other CPU fallback, of nodes: every node no provider before ``CPUExecutionProvider``
takes runs on it, unless ``session.disable_cpu_ep_fallback`` is ``"1"``; then such a session
fails (:func:`check_cpu_ep_fallback`), with onnxruntime's status and words.

Tools that judge the NPU (the testing kit, the fuzzer, the CLI) create their sessions with
``enable_fallback=0``: a fault of the simulated device must reach them, not be re-run on the
CPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import Fail, InvalidArgument, OrtError
from .options import DISABLE_CPU_EP_FALLBACK
from .registry import CPU_PROVIDER

#: The providers a session falls back to (onnxruntime's, for a build without CUDA).
PROVIDERS = [CPU_PROVIDER]


def enabled(kwargs: Mapping[str, Any]) -> bool:
    """Whether a session made with these extra keyword arguments falls back (onnxruntime:
    ``enable_fallback``, default 1, read with ``int()``: a value it cannot read is its
    ``ValueError`` or ``TypeError``, here saying what is valid)."""
    value = kwargs.get("enable_fallback", 1)
    try:
        return int(value) == 1
    except (TypeError, ValueError) as exc:  # int()'s class, as onnxruntime raises it
        raise type(exc)(f"enable_fallback={value!r}: expected 1 (fall back, the default) or "
                        "0") from None


def retries_creation(exc: BaseException) -> bool:
    """Whether onnxruntime's Python layer retries a creation that raised ``exc``."""
    return isinstance(exc, (ValueError, RuntimeError)) and not isinstance(exc, OrtError)


def report_creation(exc: BaseException, providers: Any) -> None:
    """What onnxruntime prints before retrying a creation (``providers`` as they were given)."""
    print("*************** EP Error ***************")
    print(f"EP Error {exc} when using {providers}")
    print(f"Falling back to {PROVIDERS} and retrying.")
    print("****************************************")


def report_run(exc: BaseException, providers: list[str]) -> None:
    """What onnxruntime prints before re-running on the fallback providers."""
    print(f"EP Error: {exc!s} using {providers}")
    print(f"Falling back to {PROVIDERS} and retrying.")


def check_cpu_ep_fallback(config: Mapping[str, str], cpu_named: bool,
                          providers_used: list[str]) -> None:
    """With ``session.disable_cpu_ep_fallback=1``: ``InvalidArgument`` if the session's
    providers name ``CPUExecutionProvider`` (``cpu_named``), ``Fail`` if any partition runs on
    it (``providers_used``), in onnxruntime's order; other values leave the fallback on, as in
    onnxruntime."""
    if config.get(DISABLE_CPU_EP_FALLBACK) != "1":
        return
    if cpu_named:
        raise InvalidArgument("Conflicting session configuration: explicitly added the CPU EP "
                              "to the session, but also disabled fallback to the CPU EP via "
                              "session configuration options.")
    if CPU_PROVIDER in providers_used:
        raise Fail("This session contains graph nodes that are assigned to the default CPU EP, "
                   "but fallback to CPU EP has been explicitly disabled by the user.")
