"""Session options, in the shape of ``onnxruntime.SessionOptions``.

ONNX Runtime configures a session two ways: typed attributes (``intra_op_num_threads``,
``enable_profiling``...) and a flat table of string config entries set with
:meth:`SessionOptions.add_session_config_entry` (``"ep.context_enable"``, ``"ep.context_file_path"``
...). Both are kept here with ONNX Runtime's names, so code written for onnxruntime ports by
changing the import. The config keys this package reads are named as constants below.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnxruntime

from ..errors import InvalidArgument, RuntimeException
from . import initializers
from .context_data import ContextDataFunctions, check_function
from .registry import is_registered, known_elsewhere, unknown_provider
from .typed_options import Option, TypedOptions, boolean, int32, member, text

# EPContext generation and loading (shared/reference/ort-ep-context-design.md).
EP_CONTEXT_ENABLE = "ep.context_enable"
EP_CONTEXT_FILE_PATH = "ep.context_file_path"
EP_CONTEXT_EMBED_MODE = "ep.context_embed_mode"
EP_CONTEXT_NODE_NAME_PREFIX = "ep.context_node_name_prefix"
EP_CONTEXT_EXTERNAL_INITIALIZERS = "ep.context_model_external_initializers_file_name"
EXTERNAL_INITIALIZERS_FOLDER = "session.model_external_initializers_file_folder_path"
SHARE_EP_CONTEXTS = "ep.share_ep_contexts"
STOP_SHARE_EP_CONTEXTS = "ep.stop_share_ep_contexts"
DISABLE_MODEL_COMPILE = "session.disable_model_compile"
DISABLE_CPU_EP_FALLBACK = "session.disable_cpu_ep_fallback"
INTRA_OP_THREADS = "session.intra_op.num_threads"

_BOOLEAN_KEYS = (EP_CONTEXT_ENABLE, SHARE_EP_CONTEXTS, STOP_SHARE_EP_CONTEXTS,
                 DISABLE_MODEL_COMPILE)


class _OrtEnum(enum.IntEnum):
    """An ``IntEnum`` printed as onnxruntime's enums print, ``ExecutionMode.ORT_PARALLEL``
    (an ``IntEnum`` prints its number from Python 3.11 on)."""

    def __str__(self) -> str:
        return f"{type(self).__name__}.{self.name}"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


class GraphOptimizationLevel(_OrtEnum):
    """ONNX Runtime's optimization levels. As in ONNX Runtime, the basic level's rewrites
    (constant folding, redundant-node elimination, shape simplification) run on the whole graph
    before partitioning whenever the level is ``ORT_ENABLE_BASIC`` or higher; higher levels'
    rewrites are each provider's own (the NPU compiler fuses, onnxruntime optimizes the CPU
    partitions)."""

    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99


class ExecutionMode(_OrtEnum):
    """ONNX Runtime's execution modes; accepted for compatibility (partitions run in order)."""

    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


class ExecutionOrder(_OrtEnum):
    """ONNX Runtime's node execution orders; accepted for compatibility (partitions run in
    their topological order)."""

    DEFAULT = 0
    PRIORITY_BASED = 1
    MEMORY_EFFICIENT = 2


_ORT_DEFAULTS = onnxruntime.SessionOptions()
"""The installed onnxruntime's defaults, which the plain attributes below start from."""


class SessionOptions(TypedOptions):
    """Options for :class:`~ep.framework.session.InferenceSession` and
    :class:`~ep.framework.model_compiler.ModelCompiler`.

    Attributes mirror onnxruntime's: ``enable_profiling`` (write a profile JSON on
    ``end_profiling``), ``profile_file_prefix``, ``intra_op_num_threads`` /
    ``inter_op_num_threads`` (0 = default; intra-op threads go to the CPU fallback),
    ``graph_optimization_level``, ``optimized_model_filepath`` (onnxruntime writes the
    optimized model there, and fails a session with compiled nodes: an NPU partition is one).
    The others (``execution_mode``, ``execution_order``, the memory arena and pattern
    switches, logging, determinism, per-session threads) start at the installed onnxruntime's
    defaults and are accepted for compatibility. Any other attribute is an ``AttributeError``,
    as on onnxruntime's: a misspelt option is refused, not silently ignored; a value of the
    wrong type is a ``TypeError`` when it is set (:mod:`.typed_options`).
    """

    __slots__ = ("_config", "_providers", "_free_dims", "_free_denotations", "_initializers",
                 "_external_initializers", "_context_data")

    enable_profiling = Option(boolean, False)
    profile_file_prefix = Option(text, "onnxruntime_profile_")
    intra_op_num_threads = Option(int32, 0)
    inter_op_num_threads = Option(int32, 0)
    graph_optimization_level = Option(member(GraphOptimizationLevel),
                                      GraphOptimizationLevel.ORT_ENABLE_ALL)
    execution_mode = Option(member(ExecutionMode), ExecutionMode.ORT_SEQUENTIAL)
    execution_order = Option(member(ExecutionOrder), ExecutionOrder.DEFAULT)
    optimized_model_filepath = Option(text, "")
    log_severity_level = Option(int32, _ORT_DEFAULTS.log_severity_level)
    log_verbosity_level = Option(int32, _ORT_DEFAULTS.log_verbosity_level)
    logid = Option(text, _ORT_DEFAULTS.logid)
    enable_cpu_mem_arena = Option(boolean, _ORT_DEFAULTS.enable_cpu_mem_arena)
    enable_mem_pattern = Option(boolean, _ORT_DEFAULTS.enable_mem_pattern)
    enable_mem_reuse = Option(boolean, _ORT_DEFAULTS.enable_mem_reuse)
    use_deterministic_compute = Option(boolean, _ORT_DEFAULTS.use_deterministic_compute)
    use_per_session_threads = Option(boolean, _ORT_DEFAULTS.use_per_session_threads)

    def __init__(self) -> None:
        super().__init__()
        self._config: dict[str, str] = {}
        self._providers: list[tuple[str, dict[str, str]]] = []
        self._free_dims: dict[str, int] = {}
        self._free_denotations: dict[str, int] = {}
        self._initializers: dict[str, Any] = {}
        self._external_initializers: dict[str, Any] = {}
        self._context_data = ContextDataFunctions()

    def add_session_config_entry(self, key: str, value: str) -> None:
        """Set config entry ``key`` to ``value`` (both strings), replacing an earlier value.

        Boolean entries this package reads (``ep.context_enable``, ``ep.share_ep_contexts``...)
        must be ``"0"`` or ``"1"``, as in ONNX Runtime.
        """
        if not isinstance(key, str) or not key:
            raise InvalidArgument(f"config key must be a non-empty string, got {key!r}")
        if not isinstance(value, str):
            raise InvalidArgument(
                f"config value for {key!r} must be a string, got {type(value).__name__} {value!r}"
            )
        if key in _BOOLEAN_KEYS and value not in ("0", "1"):
            raise InvalidArgument(f"{key}={value!r} is invalid; expected '0' or '1'")
        if key == EP_CONTEXT_EMBED_MODE and value not in ("0", "1"):
            raise InvalidArgument(
                f"{key}={value!r} is invalid; expected '0' (context binary file) or "
                "'1' (payload embedded in the model)"
            )
        self._config[key] = value

    def get_session_config_entry(self, key: str) -> str:
        """The value of config entry ``key``; raises (like onnxruntime) if it was never set."""
        return config_entry(self._config, key, "SessionOptions")

    def has_session_config_entry(self, key: str) -> bool:
        """Whether config entry ``key`` was set."""
        return key in self._config

    def config_entries(self) -> dict[str, str]:
        """A copy of every config entry, with the typed thread count folded in (a count of 0 or
        less is onnxruntime's default, as it takes it)."""
        entries = dict(self._config)
        if self.intra_op_num_threads > 0 and INTRA_OP_THREADS not in entries:
            entries[INTRA_OP_THREADS] = str(self.intra_op_num_threads)
        return entries

    def add_provider(self, provider_type: str, provider_options: Mapping[str, Any]) -> None:
        """Append a provider and its options, like ``onnxruntime.SessionOptions.add_provider``:
        an ``InferenceSession`` created with these options and ``providers=None`` uses them, and
        so does ``ModelCompiler``. A name that is not registered fails here as in onnxruntime:
        ``InvalidArgument`` for a provider onnxruntime knows (its build lacks it),
        :class:`~ep.errors.UnknownProvider` for any other."""
        if known_elsewhere(provider_type):
            raise InvalidArgument(f"Failed to add provider of type '{provider_type}' to "
                                  "SessionOptions. Provider configuration is not supported.")
        if not is_registered(provider_type):
            raise unknown_provider(provider_type)
        if not isinstance(provider_options, Mapping):
            raise TypeError(f"add_provider(): provider_options must be a dict, got "
                            f"{type(provider_options).__name__}")
        self._providers.append((provider_type, {str(k): str(v)
                                                for k, v in provider_options.items()}))

    def has_providers(self) -> bool:
        """Whether :meth:`add_provider` added any provider."""
        return bool(self._providers)

    @property
    def providers(self) -> list[tuple[str, dict[str, str]]]:
        """The providers added with :meth:`add_provider`, in order."""
        return [(name, dict(opts)) for name, opts in self._providers]

    def add_free_dimension_override_by_name(self, dim_name: str, dim_value: int) -> None:
        """Fix symbolic dimension ``dim_name`` to ``dim_value`` for the whole session, before
        partitioning and shape inference, as onnxruntime does."""
        self._free_dims[dim_name] = _override("add_free_dimension_override_by_name", dim_name,
                                              dim_value)

    def add_free_dimension_override_by_denotation(self, dim_denotation: str,
                                                  dim_value: int) -> None:
        """Fix every free dimension of the model's inputs whose denotation is
        ``dim_denotation`` (``"DATA_BATCH"``...) to ``dim_value``, named or not, as onnxruntime
        does; one also fixed by name to another value is ``InvalidArgument``."""
        self._free_denotations[dim_denotation] = _override(
            "add_free_dimension_override_by_denotation", dim_denotation, dim_value)

    def add_initializer(self, name: str, val: Any) -> None:
        """Use ``val``, an ``OrtValue``, for the model's initializer ``name`` in every session
        made with these options, as onnxruntime's ``add_initializer`` (a name the model does
        not hold changes nothing; see :mod:`.initializers`). Another value for the same name is
        ``InvalidArgument``; a value that is not an ``OrtValue`` is onnxruntime's
        ``RuntimeError`` (``RuntimeException``)."""
        if not isinstance(name, str):
            raise TypeError(f"add_initializer(): incompatible function arguments ("
                            f"{type(name).__name__}, {type(val).__name__}); expected (str, "
                            "OrtValue)")
        initializers.add(self._initializers, initializers.check_value(name, val), val)

    def add_external_initializers(self, names: list[str], ort_values: list[Any]) -> None:
        """Supply the data of initializers the model keeps in external files, one ``OrtValue``
        per name, as onnxruntime's ``add_external_initializers``: a session reads them from
        these values instead of the files (:mod:`.initializers`)."""
        if not isinstance(names, list) or not isinstance(ort_values, list):
            raise TypeError(f"add_external_initializers(): incompatible function arguments ("
                            f"{type(names).__name__}, {type(ort_values).__name__}); expected "
                            "(list, list)")
        if len(names) != len(ort_values):
            raise InvalidArgument(f"Expecting names and ort_values lists to have equal length "
                                  f"({len(names)} names, {len(ort_values)} values)")
        checked = [initializers.check_value(n, v) for n, v in zip(names, ort_values,
                                                                   strict=True)]
        for name, value in zip(checked, ort_values, strict=True):
            initializers.add(self._external_initializers, name, value)

    def set_ep_context_data_read_func(self, read_func: Any, max_data_size: int) -> None:
        """Have providers read their context binaries (``embed_mode=0``) through
        ``read_func(name, buffer)`` instead of files, each at most ``max_data_size`` bytes
        (:mod:`.context_data`)."""
        check_function(read_func, "set_ep_context_data_read_func")
        if isinstance(max_data_size, bool) or not isinstance(max_data_size, (int, np.integer)) \
                or max_data_size < 0:
            raise TypeError(f"set_ep_context_data_read_func(): max_data_size must be an "
                            f"integer >= 0, got {max_data_size!r}")
        self._context_data = ContextDataFunctions(read=read_func, max_read_size=int(max_data_size))

    def clear_ep_context_data_read_func(self) -> None:
        """Read context binaries from files again."""
        self._context_data = ContextDataFunctions()

    @property
    def context_data(self) -> ContextDataFunctions:
        """The read function of :meth:`set_ep_context_data_read_func` (none by default)."""
        return self._context_data

    @property
    def initializers(self) -> dict[str, Any]:
        """Name -> ``OrtValue``, from :meth:`add_initializer`."""
        return dict(self._initializers)

    @property
    def external_initializers(self) -> dict[str, Any]:
        """Name -> ``OrtValue``, from :meth:`add_external_initializers`."""
        return dict(self._external_initializers)

    @property
    def free_dimension_overrides(self) -> dict[str, int]:
        """Dimension name -> value, from :meth:`add_free_dimension_override_by_name`."""
        return dict(self._free_dims)

    @property
    def free_dimension_denotations(self) -> dict[str, int]:
        """Denotation -> value, from :meth:`add_free_dimension_override_by_denotation`."""
        return dict(self._free_denotations)


def _override(method: str, key: Any, value: Any) -> int:
    """A free-dimension override's value, after onnxruntime's argument checks."""
    if not isinstance(key, str) or isinstance(value, bool) or \
            not isinstance(value, (int, np.integer)):
        raise TypeError(f"{method}(): incompatible function arguments ({type(key).__name__}, "
                        f"{type(value).__name__}); expected (str, int)")
    if value < 0:
        raise InvalidArgument(f"free dimension override {key!r}={value} is invalid; expected "
                              "an integer >= 0")
    return int(value)


def config_entry(config: Mapping[str, str], key: str, owner: str) -> str:
    """``config[key]``, or onnxruntime's ``RuntimeError`` for a key ``owner``
    (``SessionOptions``, ``RunOptions``) never set."""
    try:
        return config[key]
    except KeyError:
        raise RuntimeException(f"{owner} does not have configuration with key: {key}") from None


def config_flag(config: Mapping[str, str], key: str) -> bool:
    """Whether boolean config entry ``key`` is ``"1"`` (absent or ``"0"``: False)."""
    return config.get(key, "0") == "1"
