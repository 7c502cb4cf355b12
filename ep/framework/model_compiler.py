"""``ModelCompiler``: compile a model ahead of time into an EPContext model.

Mirrors ``onnxruntime.ModelCompiler``: the providers come from the session options
(:meth:`~ep.framework.options.SessionOptions.add_provider`), the input model from a path or
bytes, and :meth:`ModelCompiler.compile_to_file`, :meth:`~ModelCompiler.compile_to_bytes` and
:meth:`~ModelCompiler.compile_to_stream` run the same construction pipeline as a session created
with ``ep.context_enable=1`` (:mod:`.pipeline`), without keeping anything to run.

Differences from a session, as in ONNX Runtime: the graph optimization level is the
constructor's (default ``ORT_DISABLE_ALL``), the output is written even when nothing was
compiled (unless ``ERROR_IF_NO_NODES_COMPILED``), an existing output file is replaced (unless
``ERROR_IF_OUTPUT_FILE_EXISTS``), and an already-compiled input is ``InvalidGraph``.
Initializers of the nodes left to the CPU go to ``external_initializers_file_path`` when they
are at least ``external_initializers_size_threshold`` bytes, or wherever
``get_initializer_location_func`` puts them. Argument errors are the Python exceptions
onnxruntime raises (``ValueError``, ``TypeError``) with its messages.
"""

from __future__ import annotations

import enum
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx

from ..errors import Fail, InvalidArgument, InvalidGraph
from .context_data import ContextDataFunctions, check_function
from .context_writer import ContextWriter, InitializerLocator
from .epcontext import is_folder_path, output_exists_error, planned_output_path
from .files import temp_prefix
from .graph import GraphView
from .options import (
    EP_CONTEXT_EMBED_MODE,
    EP_CONTEXT_ENABLE,
    EP_CONTEXT_FILE_PATH,
    GraphOptimizationLevel,
    SessionOptions,
)
from .partitioner import PartitionPlan
from .pipeline import construct
from .provider import ExecutionProvider
from .registry import normalize_provider_args

ALREADY_COMPILED = ("Encountered an invalid node while compiling a model. Please ensure the "
                    "input model is not already compiled.")
"""onnxruntime's message for compiling a model that has EPContext nodes."""


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
        graph_optimization_level: int = GraphOptimizationLevel.ORT_DISABLE_ALL,
        get_initializer_location_func: InitializerLocator | None = None,
    ) -> None:
        if isinstance(input_model_path_or_bytes, (str, os.PathLike)):
            if not os.fspath(input_model_path_or_bytes):
                raise ValueError("Input model path is empty")
        elif isinstance(input_model_path_or_bytes, bytes):
            if not input_model_path_or_bytes:
                raise ValueError("Input model bytes array is empty")
        else:
            raise TypeError(f"Unable to load from type '{type(input_model_path_or_bytes)}'")
        if external_initializers_file_path:
            if not isinstance(external_initializers_file_path, (str, os.PathLike)):
                raise TypeError("Output external initializer filepath is of unexpected type "
                                f"'{type(external_initializers_file_path)}'")
            external: str | None = os.fspath(external_initializers_file_path)
        else:
            external = None
        if get_initializer_location_func is not None:
            if external:
                raise ValueError("Cannot initialize ModelCompiler with both "
                                 "`external_initializers_file_path` and "
                                 "`get_initializer_location_func`")
            if not callable(get_initializer_location_func):
                raise TypeError("get_initializer_location_func must be callable, got "
                                f"{type(get_initializer_location_func).__name__}")
        if not isinstance(sess_options, SessionOptions):
            raise TypeError(f"sess_options must be an ep.SessionOptions, got "
                            f"{type(sess_options).__name__}")
        for name, value in (("flags", flags),
                            ("external_initializers_size_threshold",
                             external_initializers_size_threshold),
                            ("graph_optimization_level", graph_optimization_level)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise TypeError(f"__init__(): incompatible constructor arguments: {name}="
                                f"{value!r}; expected a non-negative integer")
        valid = OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED | \
            OrtCompileApiFlags.ERROR_IF_OUTPUT_FILE_EXISTS
        if flags & ~int(valid):
            raise InvalidArgument(f"flags={flags!r} is invalid; expected a bitwise OR of "
                                  f"{[f.name for f in OrtCompileApiFlags]}")
        if graph_optimization_level not in set(GraphOptimizationLevel):
            levels = [int(g) for g in GraphOptimizationLevel]
            raise InvalidArgument(f"graph_optimization_level={graph_optimization_level!r} is "
                                  f"invalid; expected one of {levels}")
        self._options = sess_options
        self._input = input_model_path_or_bytes
        self._embed = bool(embed_compiled_data_into_model)
        self._external = external
        self._threshold = external_initializers_size_threshold
        self._flags = OrtCompileApiFlags(flags)
        self._level = int(graph_optimization_level)
        self._locate = get_initializer_location_func
        self._binary_anchor: Path | None = None
        self._write_context_data: Callable[[str, Any], None] | None = None

    def set_ep_context_data_write_func(self, write_func: Callable[[str, Any], None]) -> None:
        """Hand each context binary a provider would write beside the model to
        ``write_func(name, data)`` instead, ``data`` an
        :class:`~.context_data.OrtEpContextData`; the EPContext node refers to ``name``
        (:mod:`.context_data`)."""
        check_function(write_func, "set_ep_context_data_write_func")
        self._write_context_data = write_func

    def clear_ep_context_data_write_func(self) -> None:
        """Write context binaries to files again."""
        self._write_context_data = None

    def set_ep_context_binary_information(self, output_directory: str | os.PathLike[str],
                                          model_name: str) -> None:
        """Where providers put their context binaries (``<model_name>_npusim.bin`` in
        ``output_directory``) when the compiled model itself goes to bytes or a stream."""
        folder = os.fspath(output_directory) if isinstance(output_directory,
                                                           (str, os.PathLike)) else ""
        if not folder or not isinstance(model_name, str) or not model_name:
            raise InvalidArgument("output_dir or model_name is empty.")
        path = Path(folder)
        if not (folder.endswith(("/", os.sep)) or path.is_dir()):
            if not path.suffix:
                raise InvalidArgument(f"output_directory {folder!r} is not a directory: give a "
                                      "folder (with a trailing separator) or a file path in it")
            path = path.parent
        if not path.is_dir():
            raise InvalidArgument(f"output_directory {str(path)!r} does not exist")
        self._binary_anchor = path / f"{model_name}_ctx.onnx"

    def compile_to_file(self, output_model_path: str | os.PathLike[str] | None = None) -> None:
        """Compile and write the EPContext model to ``output_model_path`` (atomically); by
        default beside the input model, ``.onnx`` replaced by ``_ctx.onnx``."""
        if output_model_path is None or output_model_path == "":
            path = str(planned_output_path({}, self._input_path()))
        elif isinstance(output_model_path, (str, os.PathLike)):
            path = os.fspath(output_model_path)
        else:
            raise TypeError(f"Output model's filepath is of unexpected type "
                            f"'{type(output_model_path)}'")
        if is_folder_path(path):
            raise InvalidArgument("context_file_path should not point to a folder.")
        if self._flags & OrtCompileApiFlags.ERROR_IF_OUTPUT_FILE_EXISTS and Path(path).exists():
            raise output_exists_error(path)
        self._compile(Path(path))

    def compile_to_bytes(self) -> bytes:
        """Compile and return the EPContext model's bytes. With
        ``embed_compiled_data_into_model=False`` the context binary is written beside the input
        model (or where :meth:`set_ep_context_binary_information` says), or handed to the
        write function (:meth:`set_ep_context_data_write_func`): then no file is needed."""
        written_elsewhere = self._embed or self._write_context_data is not None
        if written_elsewhere and self._external is None and self._locate is None:
            with tempfile.TemporaryDirectory() as tmp:  # nothing goes beside the model
                name = "model_ctx.onnx" if self._embed else self._output_name()
                out = Path(tmp) / name
                self._compile(out)
                return out.read_bytes()
        anchor = self._binary_anchor or planned_output_path(self._options.config_entries(),
                                                            self._input_path())
        with tempfile.TemporaryDirectory(dir=anchor.parent, prefix=temp_prefix()) as tmp:
            out = Path(tmp) / anchor.name
            self._compile(out, binary_anchor=anchor)
            if self._external is not None:  # the model's bytes refer to it beside the anchor
                target = anchor.parent / self._external
                os.replace(Path(tmp) / self._external, target)
            return out.read_bytes()

    def compile_to_stream(self, write_function: Callable[[bytes], Any]) -> None:
        """Compile and hand the EPContext model's bytes to ``write_function``; an exception it
        raises becomes ``Fail`` carrying its message, as in onnxruntime."""
        if not callable(write_function):
            raise TypeError("compile_to_stream(): incompatible function arguments: "
                            f"write_function must be callable, got {type(write_function).__name__}")
        data = self.compile_to_bytes()
        try:
            write_function(data)
        except Exception as exc:
            raise Fail(f"{type(exc).__name__}: {exc}") from None

    def _output_name(self) -> str:
        """The name the compiled model would have (its context binary is named after it):
        ``model_ctx.onnx`` for a model given as bytes with no other name set."""
        if self._binary_anchor is not None:
            return self._binary_anchor.name
        try:
            return planned_output_path(self._options.config_entries(), self._input_path()).name
        except InvalidArgument:
            return "model_ctx.onnx"

    def _input_path(self) -> str | None:
        return os.fspath(self._input) if isinstance(self._input, (str, os.PathLike)) else None

    def _compile(self, output: Path, binary_anchor: Path | None = None) -> None:
        model_path = self._input_path()
        if model_path is not None and not os.path.isfile(model_path):
            raise InvalidArgument(f'Input model path does not exist: "{model_path}"')
        config = self._options.config_entries()
        config[EP_CONTEXT_ENABLE] = "1"
        config[EP_CONTEXT_EMBED_MODE] = "1" if self._embed else "0"

        def make_writer(path: str | None) -> ContextWriter:
            writer = ContextWriter(config, path, output_path=output,
                                   external_file=self._external, size_threshold=self._threshold,
                                   binary_folder=binary_anchor.parent if binary_anchor else None,
                                   locate=self._locate)
            if binary_anchor is not None:
                writer.binary_anchor = binary_anchor
            return writer

        def write(writer: ContextWriter, model: onnx.ModelProto, graph: GraphView,
                  plan: PartitionPlan, providers: list[ExecutionProvider]) -> None:
            writer.write(model, graph, plan, providers, always=True, require_nodes=bool(
                self._flags & OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED))

        try:
            construct(self._input, config,
                      normalize_provider_args(self._options.providers, None),
                      optimization_level=self._level,
                      free_dims=self._options.free_dimension_overrides,
                      free_denotations=self._options.free_dimension_denotations,
                      make_writer=make_writer, require_compiled=False, write=write,
                      already_compiled=InvalidGraph(ALREADY_COMPILED),
                      initializers=self._options.initializers,
                      external_initializers=self._options.external_initializers,
                      context_data=ContextDataFunctions(write=self._write_context_data))
        finally:
            config.pop(EP_CONTEXT_FILE_PATH, None)
