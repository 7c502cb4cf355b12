"""ep.npusim: the NPU execution provider (capability, compiler, context binary, runtime).

Importing it registers ``NpuSimExecutionProvider`` with the framework's provider registry, ahead
of the CPU provider: the framework never imports this package.
"""

from ..framework.registry import register_provider
from .compiler import CompiledPartition, CompileReport, compile_partition
from .provider import NpuSimExecutionProvider
from .runtime import NpuRuntime, NpuSimCompiledNode

register_provider(NpuSimExecutionProvider.type, NpuSimExecutionProvider, priority=100)

__all__ = [
    "CompileReport",
    "CompiledPartition",
    "NpuRuntime",
    "NpuSimCompiledNode",
    "NpuSimExecutionProvider",
    "compile_partition",
]
