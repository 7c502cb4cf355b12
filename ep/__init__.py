"""ep: an execution provider in the shape of ONNX Runtime's, running on the simulated NPU.

The public face mirrors ``onnxruntime``: :class:`InferenceSession`, :class:`SessionOptions`,
:class:`RunOptions`, :class:`ModelCompiler`, :func:`get_available_providers` and the errors named
after ONNX Runtime's status codes, so code written for onnxruntime ports by changing the import.
"""

import onnxruntime as _onnxruntime
from onnxruntime import (
    OrtAllocatorType,
    OrtArenaCfg,
    OrtDevice,
    OrtDeviceMemoryType,
    OrtDeviceVendorId,
    OrtMemoryInfo,
    OrtMemoryInfoDeviceType,
    OrtMemType,
    OrtValue,
)

from . import npusim  # noqa: F401 - registers NpuSimExecutionProvider
from .errors import (
    EngineError,
    EPFail,
    Fail,
    InvalidArgument,
    InvalidGraph,
    InvalidProtobuf,
    ModelRequiresCompilation,
    NoSuchFile,
    NotFound,
    NotImplemented,  # noqa: A004 - ONNX Runtime's name
    OrtError,
    RuntimeException,
    UnknownProvider,
)
from .framework.context_data import OrtEpContextData, OrtEpContextDataBuffer
from .framework.io_binding import IOBinding
from .framework.model_compiler import ModelCompiler, OrtCompileApiFlags
from .framework.node_args import NodeArg
from .framework.options import (
    ExecutionMode,
    ExecutionOrder,
    GraphOptimizationLevel,
    SessionOptions,
)
from .framework.run_options import RunOptions
from .framework.session import (
    InferenceSession,
    ModelMetadata,
    get_all_providers,
    get_available_providers,
    get_device,
)

__all__ = [
    "EPFail",
    "EngineError",
    "ExecutionMode",
    "ExecutionOrder",
    "Fail",
    "GraphOptimizationLevel",
    "IOBinding",
    "InferenceSession",
    "InvalidArgument",
    "InvalidGraph",
    "InvalidProtobuf",
    "ModelCompiler",
    "ModelMetadata",
    "ModelRequiresCompilation",
    "NoSuchFile",
    "NodeArg",
    "NotFound",
    "NotImplemented",
    "OrtAllocatorType",
    "OrtArenaCfg",
    "OrtCompileApiFlags",
    "OrtDevice",
    "OrtDeviceMemoryType",
    "OrtDeviceVendorId",
    "OrtEpContextData",
    "OrtEpContextDataBuffer",
    "OrtError",
    "OrtMemType",
    "OrtMemoryInfo",
    "OrtMemoryInfoDeviceType",
    "OrtValue",
    "RunOptions",
    "RuntimeException",
    "SessionOptions",
    "UnknownProvider",
    "disable_telemetry_events",
    "enable_telemetry_events",
    "get_all_providers",
    "get_available_providers",
    "get_build_info",
    "get_device",
    "get_version_string",
    "has_collective_ops",
    "preload_dlls",
    "print_debug_info",
    "set_default_logger_severity",
    "set_default_logger_verbosity",
    "set_seed",
]

# Process-wide settings of onnxruntime, which runs the CPU provider's partitions here: its
# logger (user code silences it with set_default_logger_severity(3)), the seed of its random
# operators, its telemetry, the CUDA libraries it may preload, and its version, build and
# debug strings.
disable_telemetry_events = _onnxruntime.disable_telemetry_events
enable_telemetry_events = _onnxruntime.enable_telemetry_events
get_build_info = _onnxruntime.get_build_info
get_version_string = _onnxruntime.get_version_string
has_collective_ops = _onnxruntime.has_collective_ops
preload_dlls = _onnxruntime.preload_dlls
print_debug_info = _onnxruntime.print_debug_info
set_default_logger_severity = _onnxruntime.set_default_logger_severity
set_default_logger_verbosity = _onnxruntime.set_default_logger_verbosity
set_seed = _onnxruntime.set_seed

#: The onnxruntime API this package mirrors is the installed onnxruntime's: code that checks
#: ``onnxruntime.__version__`` before using a feature checks the same here. npu-sim's own
#: version is ``importlib.metadata.version("npu-sim")``.
__version__ = _onnxruntime.__version__
