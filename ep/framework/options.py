"""Session options, in the shape of ``onnxruntime.SessionOptions``.

ONNX Runtime configures a session two ways: typed attributes (``intra_op_num_threads``,
``enable_profiling``...) and a flat table of string config entries set with
:meth:`SessionOptions.add_session_config_entry` (``"ep.context_enable"``, ``"ep.context_file_path"``
...). Both are kept here with ONNX Runtime's names, so code written for onnxruntime ports by
changing the import. The config keys this package reads are named as constants below.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import InvalidArgument, RuntimeException
from .provider import ExecutionProvider, ProviderContext

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
INTRA_OP_THREADS = "session.intra_op.num_threads"

_BOOLEAN_KEYS = (EP_CONTEXT_ENABLE, SHARE_EP_CONTEXTS, STOP_SHARE_EP_CONTEXTS,
                 DISABLE_MODEL_COMPILE)


class GraphOptimizationLevel(enum.IntEnum):
    """ONNX Runtime's optimization levels; accepted for compatibility (the EP compiler runs its
    own rewrites whatever the level)."""

    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99


class ExecutionMode(enum.IntEnum):
    """ONNX Runtime's execution modes; accepted for compatibility (partitions run in order)."""

    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


class SessionOptions:
    """Options for :class:`~ep.framework.session.InferenceSession` and
    :class:`~ep.framework.model_compiler.ModelCompiler`.

    Attributes mirror onnxruntime's: ``enable_profiling`` (write a profile JSON on
    ``end_profiling``), ``profile_file_prefix``, ``intra_op_num_threads`` /
    ``inter_op_num_threads`` (0 = default; intra-op threads go to the CPU fallback),
    ``graph_optimization_level``, ``execution_mode``, ``log_severity_level``.
    """

    def __init__(self) -> None:
        self.enable_profiling = False
        self.profile_file_prefix = "onnxruntime_profile_"
        self.intra_op_num_threads = 0
        self.inter_op_num_threads = 0
        self.graph_optimization_level = GraphOptimizationLevel.ORT_ENABLE_ALL
        self.execution_mode = ExecutionMode.ORT_SEQUENTIAL
        self.log_severity_level = 2
        self._config: dict[str, str] = {}
        self._providers: list[tuple[str, dict[str, str]]] = []

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
        try:
            return self._config[key]
        except KeyError:
            raise RuntimeException(
                f"SessionOptions does not have configuration with key: {key}"
            ) from None

    def has_session_config_entry(self, key: str) -> bool:
        """Whether config entry ``key`` was set."""
        return key in self._config

    def config_entries(self) -> dict[str, str]:
        """A copy of every config entry, with the typed thread count folded in."""
        entries = dict(self._config)
        if self.intra_op_num_threads and INTRA_OP_THREADS not in entries:
            entries[INTRA_OP_THREADS] = str(int(self.intra_op_num_threads))
        return entries

    def add_provider(self, provider_type: str, provider_options: Mapping[str, Any]) -> None:
        """Append a provider and its options (what ``ModelCompiler`` compiles for), like
        ``onnxruntime.SessionOptions.add_provider``."""
        if not isinstance(provider_type, str) or not provider_type:
            raise InvalidArgument(f"provider name must be a non-empty string, got "
                                  f"{provider_type!r}")
        self._providers.append((provider_type, {str(k): str(v)
                                                for k, v in dict(provider_options).items()}))

    @property
    def providers(self) -> list[tuple[str, dict[str, str]]]:
        """The providers added with :meth:`add_provider`, in order."""
        return [(name, dict(opts)) for name, opts in self._providers]


def config_flag(config: Mapping[str, str], key: str) -> bool:
    """Whether boolean config entry ``key`` is ``"1"`` (absent or ``"0"``: False)."""
    return config.get(key, "0") == "1"


ProviderSpec = str | tuple[str, Mapping[str, Any]] | ExecutionProvider
"""How a provider is named in ``InferenceSession(providers=...)``."""


def _provider_classes() -> dict[str, Callable[[ProviderContext], ExecutionProvider]]:
    """The providers this package builds by name (the NPU provider is imported on demand)."""
    from .cpu import CPUExecutionProvider

    def npu(context: ProviderContext) -> ExecutionProvider:
        from ..npusim.provider import NpuSimExecutionProvider
        return NpuSimExecutionProvider(context)

    return {"NpuSimExecutionProvider": npu, "CPUExecutionProvider": CPUExecutionProvider}


def make_providers(
    providers: Sequence[Any],
    provider_options: Sequence[Mapping[str, Any]] | None,
    config: Mapping[str, str],
    model_path: str | None,
) -> list[ExecutionProvider]:
    """Build the session's providers from onnxruntime's three spellings: ``["Name", ...]``,
    ``[("Name", {options}), ...]``, or names plus a ``provider_options`` list of the same
    length. An :class:`ExecutionProvider` instance is taken as is, keeping its provider options
    and getting the session's config and model path.
    ``CPUExecutionProvider`` is appended when absent and always runs last."""
    specs = list(providers)
    if provider_options is not None:
        options_list = list(provider_options)
        if len(options_list) != len(specs):
            raise InvalidArgument(
                f"'providers' and 'provider_options' should be the same length if both are "
                f"given; got {len(specs)} providers and {len(options_list)} options")
        if any(isinstance(s, tuple) for s in specs):
            raise InvalidArgument("Only one of 'providers' as (name, options) tuples and "
                                  "'provider_options' should be used")
        specs = list(zip(specs, options_list, strict=True))
    known = _provider_classes()
    built: list[ExecutionProvider] = []
    for spec in specs:
        if isinstance(spec, ExecutionProvider):
            spec.context = ProviderContext(provider_options=dict(spec.context.provider_options),
                                           session_config=dict(config), model_path=model_path)
            built.append(spec)
            continue
        name, opts = spec if isinstance(spec, tuple) else (spec, {})
        if not isinstance(name, str) or name not in known:
            raise InvalidArgument(f"Unknown Provider Type: {name!r}; available providers are "
                                  f"{list(known)} (or pass an ExecutionProvider instance)")
        if not isinstance(opts, Mapping):
            raise InvalidArgument(f"options of provider {name} must be a dict, got "
                                  f"{type(opts).__name__}")
        context = ProviderContext(provider_options={str(k): str(v) for k, v in opts.items()},
                                  session_config=dict(config), model_path=model_path)
        built.append(known[name](context))
    names = [p.type for p in built]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise InvalidArgument(f"providers listed more than once: {repeated}")
    if "CPUExecutionProvider" not in names:
        built.append(known["CPUExecutionProvider"](
            ProviderContext(session_config=dict(config), model_path=model_path)))
    else:
        built.sort(key=lambda p: p.type == "CPUExecutionProvider")
    return built
