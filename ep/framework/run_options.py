"""``RunOptions`` and the checks onnxruntime's Python API makes of a run's arguments.

onnxruntime's ``run`` is a pybind11 function: arguments of the wrong type are a ``TypeError``
before anything runs (``output_names`` a string rather than a list of them, ``run_options``
not a ``RunOptions``), and a ``RunOptions`` with ``terminate`` set, or a run log severity
outside onnxruntime's levels, fails the run with ``Fail``. :func:`check_run` makes those
checks, with the same classes, before a session or instance runs. One difference, on purpose:
a feed that is not a mapping is a ``TypeError`` naming its type here, where onnxruntime lets
the ``AttributeError`` of its own ``input_feed.keys()`` through.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import onnxruntime

from ..errors import Fail, OrtError
from .options import config_entry
from .typed_options import Option, TypedOptions, boolean, int32, text

#: onnxruntime's logging severities: verbose, info, warning, error, fatal; -1 is the session's.
SEVERITIES = range(0, 5)


class RunOptions(TypedOptions):
    """Options of one run, with onnxruntime's attributes and defaults: ``log_severity_level``
    (-1: the session's), ``log_verbosity_level``, ``logid``, ``only_execute_path_to_fetches``
    (a run here only ever executes the partitions its outputs need) and ``terminate`` (a run
    started with it set fails at once, as onnxruntime's does). Any other attribute is an
    ``AttributeError``, as on onnxruntime's."""

    __slots__ = ("_config",)

    log_severity_level = Option(int32, -1)
    log_verbosity_level = Option(int32, 0)
    logid = Option(text, "")
    only_execute_path_to_fetches = Option(boolean, False)
    terminate = Option(boolean, False)

    def __init__(self) -> None:
        super().__init__()
        self._config: dict[str, str] = {}

    def add_run_config_entry(self, key: str, value: str) -> None:
        """Set run config entry ``key`` to ``value`` (both strings)."""
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError("add_run_config_entry(): incompatible function arguments: "
                            f"key={key!r}, value={value!r}; expected two strings")
        self._config[key] = value

    def get_run_config_entry(self, key: str) -> str:
        """The value of run config entry ``key``; raises (like onnxruntime) if never set."""
        return config_entry(self._config, key, "RunOptions")


def check_severity(level: int, scope: str, error: type[OrtError]) -> None:
    """onnxruntime's refusal (``error``) of a ``scope`` ("run", "session") log severity that
    is neither -1 (the default) nor one of :data:`SEVERITIES`."""
    if level != -1 and level not in SEVERITIES:
        raise error(f"Invalid {scope} log severity level. Not a valid "
                    f"onnxruntime::logging::Severity value: {level}")


def check_run(output_names: Any, input_feed: Any, run_options: Any) -> list[str] | None:
    """The output names a run asked for (None: every output), after onnxruntime's checks of
    its three arguments (see the module doc); raises ``TypeError`` or ``Fail`` as it does."""
    if run_options is not None:
        if not isinstance(run_options, (RunOptions, onnxruntime.RunOptions)):
            raise TypeError(f"run(): run_options must be an ep.RunOptions or None, got "
                            f"{type(run_options).__name__}")
        check_severity(run_options.log_severity_level, "run", Fail)
        if run_options.terminate:
            raise Fail("Exiting due to terminate flag being set to true.")
    check_mapping(input_feed)
    if output_names is None:
        return None
    if isinstance(output_names, (str, bytes)) or not isinstance(output_names, Sequence) or \
            not all(isinstance(name, str) for name in output_names):
        raise TypeError(f"run(): output_names must be a list of output names (strings) or "
                        f"None, got {output_names!r}")
    return list(output_names) or None


def check_mapping(input_feed: Any) -> Mapping[str, Any]:
    """``input_feed``, which must be a mapping of input names to values (a ``TypeError``)."""
    if not isinstance(input_feed, Mapping):
        raise TypeError(f"run(): input_feed must be a dict of input names to values, got "
                        f"{type(input_feed).__name__}")
    return input_feed
