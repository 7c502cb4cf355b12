"""``ModelCompiler``: compile a model ahead of time into an EPContext model.

Mirrors ``onnxruntime.ModelCompiler``: the providers come from the session options
(:meth:`~ep.framework.options.SessionOptions.add_provider`), the input model from a path or
bytes, and :meth:`ModelCompiler.compile_to_file` / :meth:`ModelCompiler.compile_to_bytes` run the
same partition-compile-write path as a session created with ``ep.context_enable=1``, without
keeping anything to run. Differences from a session, as in ONNX Runtime: the output is written
even when nothing was compiled (unless ``ERROR_IF_NO_NODES_COMPILED``), and an existing output
file is replaced (unless ``ERROR_IF_OUTPUT_FILE_EXISTS``). Initializers of the nodes left to the
CPU go to ``external_initializers_file_path`` when they are at least
``external_initializers_size_threshold`` bytes.
"""

from __future__ import annotations

import enum
import os
import tempfile
from pathlib import Path
from typing import Any

from ..errors import InvalidArgument
from .context_writer import ContextWriter
from .epcontext import is_folder_path, output_exists_error, planned_output_path
from .graph import GraphView
from .options import (
    EP_CONTEXT_EMBED_MODE,
    EP_CONTEXT_ENABLE,
    EP_CONTEXT_FILE_PATH,
    SessionOptions,
    make_providers,
)
from .partitioner import partition
from .session import check_ep_context_taken, compile_plan, load_model


class OrtCompileApiFlags(enum.IntFlag):
    """onnxruntime's ``OrtCompileApiFlags``."""

    NONE = 0
    ERROR_IF_NO_NODES_COMPILED = 1
    ERROR_IF_OUTPUT_FILE_EXISTS = 2


class ModelCompiler:
    """Compiles a model for the providers in ``sess_options`` into an EPContext model."""

    def __init__(
        self,
        sess_options: SessionOptions,
        input_model_path_or_bytes: str | os.PathLike[str] | bytes,
        embed_compiled_data_into_model: bool = False,
        external_initializers_file_path: str | os.PathLike[str] | None = None,
        external_initializers_size_threshold: int = 1024,
        flags: int = OrtCompileApiFlags.NONE,
        graph_optimization_level: Any = None,
        get_initializer_location_func: Any = None,
    ) -> None:
        if isinstance(input_model_path_or_bytes, (str, os.PathLike)):
            if not os.fspath(input_model_path_or_bytes):
                raise InvalidArgument("Input model path is empty")
        elif isinstance(input_model_path_or_bytes, (bytes, bytearray)):
            if not input_model_path_or_bytes:
                raise InvalidArgument("Input model bytes array is empty")
        else:
            raise InvalidArgument(
                f"Unable to load from type '{type(input_model_path_or_bytes)}'")
        if get_initializer_location_func is not None:
            raise InvalidArgument("get_initializer_location_func is not supported; use "
                                  "external_initializers_file_path")
        if not isinstance(flags, int) or flags < 0 or flags & ~int(
                OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED
                | OrtCompileApiFlags.ERROR_IF_OUTPUT_FILE_EXISTS):
            raise InvalidArgument(f"flags={flags!r} is invalid; expected a bitwise OR of "
                                  f"{[f.name for f in OrtCompileApiFlags]}")
        if not isinstance(external_initializers_size_threshold, int) or \
                external_initializers_size_threshold < 0:
            raise InvalidArgument(f"external_initializers_size_threshold="
                                  f"{external_initializers_size_threshold!r} is invalid; "
                                  "expected an integer >= 0")
        self._options = sess_options
        self._input = input_model_path_or_bytes
        self._embed = bool(embed_compiled_data_into_model)
        ext = os.fspath(external_initializers_file_path) if external_initializers_file_path \
            else None
        self._external = ext
        self._threshold = external_initializers_size_threshold
        self._flags = OrtCompileApiFlags(flags)

    def compile_to_file(self, output_model_path: str | os.PathLike[str]) -> None:
        """Compile and write the EPContext model to ``output_model_path`` (atomically)."""
        path = os.fspath(output_model_path)
        if not path or is_folder_path(path):
            raise InvalidArgument("context_file_path should not point to a folder.")
        if self._flags & OrtCompileApiFlags.ERROR_IF_OUTPUT_FILE_EXISTS and Path(path).exists():
            raise output_exists_error(path)
        self._compile(Path(path))

    def compile_to_bytes(self) -> bytes:
        """Compile and return the EPContext model's bytes (initializers embedded). With
        ``embed_compiled_data_into_model=False`` the context binary is written beside the input
        model (or beside ``ep.context_file_path`` for a model given as bytes)."""
        if self._external:
            raise InvalidArgument("external_initializers_file_path cannot be used with "
                                  "compile_to_bytes; compile_to_file instead")
        if self._embed:  # nothing goes beside the model: compile into a scratch folder
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / "model_ctx.onnx"
                self._compile(out)
                return out.read_bytes()
        model_path = os.fspath(self._input) if isinstance(self._input, (str, os.PathLike)) \
            else None
        anchor = planned_output_path(self._options.config_entries(), model_path)
        with tempfile.TemporaryDirectory(dir=anchor.parent) as tmp:
            out = Path(tmp) / anchor.name
            self._compile(out, binary_anchor=anchor)
            return out.read_bytes()

    def _compile(self, output: Path, binary_anchor: Path | None = None) -> None:
        config = self._options.config_entries()
        config[EP_CONTEXT_ENABLE] = "1"
        config[EP_CONTEXT_EMBED_MODE] = "1" if self._embed else "0"
        model, model_path = load_model(self._input, config)
        writer = ContextWriter(config, model_path, output_path=output,
                               external_file=self._external, size_threshold=self._threshold,
                               binary_folder=binary_anchor.parent if binary_anchor else None)
        provider_config = writer.provider_config()
        if binary_anchor is not None:
            provider_config[EP_CONTEXT_FILE_PATH] = str(binary_anchor)
        providers = make_providers([*self._options.providers], None, provider_config,
                                   model_path)
        graph = GraphView.from_model(model)
        writer.check_source(graph)
        plan = partition(graph, providers)
        check_ep_context_taken(graph, plan, providers)
        try:
            compile_plan(plan, providers, writer)
        except BaseException:
            writer.cleanup(providers)
            raise
        writer.write(model, graph, plan, providers, always=True, require_nodes=bool(
            self._flags & OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED))
