"""Errors with ONNX Runtime's names, status codes and message format.

onnxruntime raises exceptions named after its status codes (``InvalidGraph``, ``Fail``...) whose
text reads ``[ONNXRuntimeError] : 10 : INVALID_GRAPH : <message>``. These classes keep the same
names, codes and format, so code that catches onnxruntime's errors by name ports unchanged.
"""

from __future__ import annotations


class OrtError(RuntimeError):
    """Base class; ``code`` and ``status`` are ONNX Runtime's ``StatusCode`` number and name."""

    code: int = 6
    status: str = "RUNTIME_EXCEPTION"

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(f"[ONNXRuntimeError] : {self.code} : {self.status} : {message}")


class Fail(OrtError):
    code, status = 1, "FAIL"


class InvalidArgument(OrtError):
    code, status = 2, "INVALID_ARGUMENT"


class NoSuchFile(OrtError):
    code, status = 3, "NO_SUCHFILE"


class NoModel(OrtError):
    code, status = 4, "NO_MODEL"


class EngineError(OrtError):
    code, status = 5, "ENGINE_ERROR"


class RuntimeException(OrtError):
    code, status = 6, "RUNTIME_EXCEPTION"


class InvalidProtobuf(OrtError):
    code, status = 7, "INVALID_PROTOBUF"


class ModelLoaded(OrtError):
    code, status = 8, "MODEL_LOADED"


class NotImplemented(OrtError):  # noqa: A001 - ONNX Runtime's name
    code, status = 9, "NOT_IMPLEMENTED"


class InvalidGraph(OrtError):
    code, status = 10, "INVALID_GRAPH"


class EPFail(OrtError):
    code, status = 11, "EP_FAIL"


class ModelLoadCanceled(OrtError):
    code, status = 12, "MODEL_LOAD_CANCELED"


class ModelRequiresCompilation(OrtError):
    code, status = 13, "MODEL_REQUIRES_COMPILATION"


class NotFound(OrtError):
    code, status = 14, "NOT_FOUND"


class UnknownProvider(RuntimeError):
    """A provider name onnxruntime does not know (``Unknown Provider Type: <name>``): its plain
    ``RuntimeError``, not a status error, which is why onnxruntime's Python layer retries a
    session that raised it on ``CPUExecutionProvider`` (:mod:`ep.framework.fallback`)."""
