"""ep.npusim: the NPU execution provider (capability, compiler, context binary, runtime)."""

from .compiler import CompiledPartition, CompileReport, compile_partition
from .provider import NpuSimExecutionProvider
from .runtime import NpuRuntime, NpuSimCompiledNode

__all__ = [
    "CompileReport",
    "CompiledPartition",
    "NpuRuntime",
    "NpuSimCompiledNode",
    "NpuSimExecutionProvider",
    "compile_partition",
]
