"""The provider registry: how the framework finds execution providers by name.

ONNX Runtime builds providers from names (``"CUDAExecutionProvider"``) through factories its
build registered; the session never names a concrete provider class. The same here: an EP
package registers a factory under its name with :func:`register_provider` when it is imported
(``ep.npusim`` registers ``NpuSimExecutionProvider``, this framework registers
``CPUExecutionProvider``), and the framework creates providers through :func:`create_provider`.
The framework imports no concrete EP, so a provider written elsewhere joins by registering
itself, exactly as the NPU's does.

``priority`` orders :func:`available_providers`, which is the default provider list of a
session given none (ONNX Runtime: "all available providers with the default precedence").
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import onnxruntime

from ..errors import InvalidArgument, UnknownProvider
from .context_data import ContextDataFunctions
from .provider import ExecutionProvider, ProviderContext

ProviderFactory = Callable[[ProviderContext], ExecutionProvider]
"""Builds a provider from its context (provider options, session config, model path)."""


@dataclass(frozen=True)
class _Registration:
    name: str
    factory: ProviderFactory
    priority: int


_registry: dict[str, _Registration] = {}
_lock = threading.Lock()


def register_provider(name: str, factory: ProviderFactory, *, priority: int = 100) -> None:
    """Make provider ``name`` available; ``factory(context)`` builds one. A higher ``priority``
    comes earlier in :func:`available_providers`. Registering a name again replaces it."""
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"provider name must be a non-empty string, got {name!r}")
    if not callable(factory):
        raise InvalidArgument(f"provider {name!r}: factory must be callable, got "
                              f"{type(factory).__name__}")
    with _lock:
        _registry[name] = _Registration(name, factory, int(priority))


def unregister_provider(name: str) -> None:
    """Forget provider ``name`` (nothing happens if it is not registered)."""
    with _lock:
        _registry.pop(name, None)


def available_providers() -> list[str]:
    """Registered provider names, highest priority first (ties: in registration order)."""
    with _lock:
        entries = list(_registry.values())
    return [r.name for r in sorted(entries, key=lambda r: -r.priority)]


def is_registered(name: object) -> bool:
    """Whether ``name`` is a registered provider name."""
    return isinstance(name, str) and name in _registry


def known_elsewhere(name: object) -> bool:
    """Whether ``name`` is a provider onnxruntime knows (``get_all_providers``) that is not
    registered here: a session leaves it out, as an onnxruntime build without it does."""
    return isinstance(name, str) and not is_registered(name) and \
        name in onnxruntime.get_all_providers()


def unknown_provider(name: object) -> UnknownProvider:
    """onnxruntime's error for a provider name it does not know at all."""
    return UnknownProvider(f"Unknown Provider Type: {name}")


def create_provider(name: str, context: ProviderContext) -> ExecutionProvider:
    """A new provider ``name``, bound to ``context``."""
    with _lock:
        registration = _registry.get(name) if isinstance(name, str) else None
    if registration is None:
        raise unknown_provider(name)
    return registration.factory(context)


ProviderSpec = str | tuple[str, Mapping[str, Any]] | ExecutionProvider
"""How a provider is named in ``InferenceSession(providers=...)``: a name, a ``(name,
options)`` pair, or an :class:`ExecutionProvider` instance (how a Python EP joins a session)."""

CPU_PROVIDER = "CPUExecutionProvider"


def normalize_provider_args(
    providers: Sequence[ProviderSpec] | None,
    provider_options: Sequence[Mapping[str, Any]] | None,
) -> list[tuple[str, dict[str, str]] | ExecutionProvider]:
    """onnxruntime's ``check_and_normalize_provider_args``: the same checks, the same
    ``ValueError`` texts and the same warnings (a repeated provider is ignored), extended to
    accept provider instances."""
    if providers is None:
        return []
    if not isinstance(providers, Iterable):  # onnxruntime iterates it first: a TypeError
        raise TypeError(f"'{type(providers).__name__}' object is not iterable: 'providers' "
                        "should be a sequence.")
    if not isinstance(providers, Sequence):
        raise ValueError("'providers' should be a sequence.")
    pairs: list[tuple[Any, Any]] = []
    if provider_options is not None:
        if not isinstance(provider_options, Sequence):
            raise ValueError("'provider_options' should be a sequence.")
        if len(providers) != len(provider_options):
            raise ValueError("'providers' and 'provider_options' should be the same length if "
                             "both are given.")
        if not all(isinstance(p, str) for p in providers):
            raise ValueError("Only string values for 'providers' are supported if "
                             "'provider_options' is given.")
        if not all(isinstance(o, dict) for o in provider_options):
            raise ValueError("'provider_options' values must be dicts.")
        pairs = list(zip(providers, provider_options, strict=True))
    else:
        for spec in providers:
            if isinstance(spec, (str, ExecutionProvider)):
                pairs.append((spec, None))
            elif isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[0], str) \
                    and isinstance(spec[1], dict):
                pairs.append(spec)
            else:
                raise ValueError("'providers' values must be either strings or (string, dict) "
                                 "tuples.")
    normalized: list[tuple[str, dict[str, str]] | ExecutionProvider] = []
    seen: set[str] = set()
    for spec, options in pairs:
        name = spec.type if isinstance(spec, ExecutionProvider) else spec
        if not isinstance(spec, ExecutionProvider) and not is_registered(name):
            warnings.warn(f"Specified provider '{name}' is not in available provider names."
                          f"Available providers: '{', '.join(available_providers())}'",
                          stacklevel=3)
        if name in seen:
            warnings.warn(f"Duplicate provider '{name}' encountered, ignoring.", stacklevel=3)
            continue
        seen.add(name)
        normalized.append(spec if isinstance(spec, ExecutionProvider)
                          else (name, {str(k): str(v) for k, v in (options or {}).items()}))
    return normalized


def spec_names(specs: Sequence[tuple[str, dict[str, str]] | ExecutionProvider]) -> list[str]:
    """The provider names of :func:`normalize_provider_args`' specs."""
    return [spec.type if isinstance(spec, ExecutionProvider) else spec[0] for spec in specs]


def build_providers(
    specs: Sequence[tuple[str, dict[str, str]] | ExecutionProvider],
    config: Mapping[str, str],
    model_path: str | None,
    context_data: ContextDataFunctions | None = None,
) -> list[ExecutionProvider]:
    """Create (or, for instances, bind) the session's providers, in priority order, with
    ``CPUExecutionProvider`` last, appended when absent. A provider onnxruntime knows but this
    process has not registered (``CUDAExecutionProvider``) is left out, as onnxruntime leaves
    out the providers its build lacks; a name it does not know is :class:`UnknownProvider`.
    Every provider is bound to the session's config in one step before anything reads it."""
    data = context_data or ContextDataFunctions()
    built: list[ExecutionProvider] = []
    for spec in specs:
        if isinstance(spec, ExecutionProvider):
            spec.bind(ProviderContext(provider_options=dict(spec.context.provider_options),
                                      session_config=dict(config), model_path=model_path,
                                      context_data=data))
            built.append(spec)
        elif not known_elsewhere(spec[0]):  # normalize_provider_args warned of those
            name, options = spec
            built.append(create_provider(name, ProviderContext(
                provider_options=options, session_config=dict(config), model_path=model_path,
                context_data=data)))
    if not any(p.type == CPU_PROVIDER for p in built):
        built.append(create_provider(CPU_PROVIDER, ProviderContext(
            session_config=dict(config), model_path=model_path, context_data=data)))
    built.sort(key=lambda p: p.type == CPU_PROVIDER)
    return built
