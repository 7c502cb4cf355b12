"""EPContext models: ONNX models whose compiled partitions are ``EPContext`` nodes.

An EPContext model (ONNX Runtime's "EP Context Design"; ``docs/epcontext.md``) is the source
model with each partition an EP compiled replaced by one node ``com.microsoft::EPContext``
carrying what the EP needs to run it without compiling again: the context payload itself
(``embed_mode=1``) or the path of a context binary relative to the model (``embed_mode=0``).
Nodes left to the CPU provider stay as they are. The split of work follows ONNX Runtime:

* the **EP** makes its EPContext nodes (and writes its context binary) when it compiles; this
  module gives it :func:`make_ep_context_node`, :func:`generation_settings` (the resolved output
  path, embed mode, name prefix) and :func:`~ep.framework.files.atomic_write`;
* the **framework** builds the model from the partition plan and those nodes and writes it
  (:mod:`ep.framework.context_writer`);
* when loading, the EP reads its nodes back with :func:`parse_ep_context_node` and resolves
  context file paths with :func:`resolve_context_file`, which rejects every unsafe or broken path
  as ``InvalidGraph`` with ONNX Runtime's ``Failed to load from EpContext model.`` prefix.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import helper

from ..errors import EPFail, Fail, InvalidArgument, InvalidGraph
from .options import (
    EP_CONTEXT_EMBED_MODE,
    EP_CONTEXT_FILE_PATH,
    EP_CONTEXT_NODE_NAME_PREFIX,
)
from .provider import ProviderContext

EP_CONTEXT_OP = "EPContext"
MS_DOMAIN = "com.microsoft"
LOAD_ERROR = "Failed to load from EpContext model."


def is_ep_context_node(node: onnx.NodeProto) -> bool:
    """True for a ``com.microsoft::EPContext`` node."""
    return node.op_type == EP_CONTEXT_OP and node.domain == MS_DOMAIN


def load_error(what: str) -> InvalidGraph:
    """The ``InvalidGraph`` every EPContext loading failure raises, saying what was wrong."""
    return InvalidGraph(f"{LOAD_ERROR} {what}")


@dataclass(frozen=True)
class EpContextNode:
    """The attributes of one EPContext node, with the schema's defaults filled in."""

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    main_context: int = 1
    embed_mode: int = 1
    ep_cache_context: bytes = b""
    ep_sdk_version: str | None = None
    onnx_model_filename: str | None = None
    hardware_architecture: str | None = None
    partition_name: str | None = None
    source: str | None = None
    notes: str | None = None
    max_size: int = 0

    @property
    def graph_name(self) -> str:
        """The graph this node runs: ``partition_name`` if set, else the node name."""
        return self.partition_name or self.name


_INT_ATTRS = ("main_context", "embed_mode", "max_size")
_STR_ATTRS = ("ep_sdk_version", "onnx_model_filename", "hardware_architecture",
              "partition_name", "source", "notes")


def parse_ep_context_node(node: onnx.NodeProto) -> EpContextNode:
    """Read an EPContext node's attributes; a wrongly typed or out-of-range one is
    ``InvalidGraph`` (``Failed to load from EpContext model. ...``)."""
    values: dict[str, object] = {}
    for attr in node.attribute:
        if attr.name in _INT_ATTRS:
            if attr.type != onnx.AttributeProto.INT:
                raise load_error(f"EPContext node {node.name!r}: attribute {attr.name} must be "
                                 f"an int, got {_attr_type(attr)}")
            values[attr.name] = int(attr.i)
        elif attr.name in _STR_ATTRS or attr.name == "ep_cache_context":
            if attr.type != onnx.AttributeProto.STRING:
                raise load_error(f"EPContext node {node.name!r}: attribute {attr.name} must be "
                                 f"a string, got {_attr_type(attr)}")
            if attr.name == "ep_cache_context":
                values[attr.name] = bytes(attr.s)
            else:
                values[attr.name] = attr.s.decode("utf-8", errors="replace")
    for key in ("main_context", "embed_mode"):
        if key in values and values[key] not in (0, 1):
            raise load_error(f"EPContext node {node.name!r}: {key}={values[key]} is invalid; "
                             "expected 0 or 1")
    return EpContextNode(name=node.name, inputs=tuple(node.input), outputs=tuple(node.output),
                         **values)  # type: ignore[arg-type]


def _attr_type(attr: onnx.AttributeProto) -> str:
    return onnx.AttributeProto.AttributeType.Name(attr.type)


def make_ep_context_node(
    name: str,
    inputs: Sequence[str],
    outputs: Sequence[str],
    *,
    source: str,
    main_context: bool,
    embed_mode: int,
    ep_cache_context: bytes | str,
    ep_sdk_version: str,
    hardware_architecture: str,
    onnx_model_filename: str,
    max_size: int = 0,
    notes: str | None = None,
) -> onnx.NodeProto:
    """An EPContext node named ``name`` (which is also its ``partition_name``).

    ``ep_cache_context`` is the payload (bytes) when ``embed_mode`` is 1, or the context
    binary's path relative to the model (str) when it is 0; it is stored in the string
    attribute either way.
    """
    if embed_mode not in (0, 1):
        raise InvalidArgument(f"embed_mode={embed_mode!r} is invalid; expected 0 or 1")
    cache = ep_cache_context.encode("utf-8") if isinstance(ep_cache_context, str) \
        else bytes(ep_cache_context)
    attrs: dict[str, object] = {
        "main_context": int(bool(main_context)),
        "ep_cache_context": cache,
        "embed_mode": embed_mode,
        "ep_sdk_version": ep_sdk_version,
        "hardware_architecture": hardware_architecture,
        "partition_name": name,
        "source": source,
        "onnx_model_filename": onnx_model_filename,
        "max_size": int(max_size),
    }
    if notes is not None:
        attrs["notes"] = notes
    return helper.make_node(EP_CONTEXT_OP, list(inputs), list(outputs), name=name,
                            domain=MS_DOMAIN, **attrs)


@dataclass(frozen=True)
class GenerationSettings:
    """What an EP needs to make its EPContext nodes, resolved from the session config."""

    output_path: Path
    embed_mode: int
    node_name_prefix: str
    model_name: str

    def binary_path(self, ep_short_name: str) -> Path:
        """``[model_name]_[ep].bin`` beside the output model."""
        return self.output_path.parent / f"{self.model_name}_{ep_short_name.lower()}.bin"


def is_folder_path(path: str) -> bool:
    """True if ``path`` names a folder (ends with a separator, has no suffix, or is one)."""
    return path.endswith(("/", os.sep)) or not Path(path).suffix or Path(path).is_dir()


def planned_output_path(config: Mapping[str, str], model_path: str | None) -> Path:
    """``ep.context_file_path``, or the model path with ``.onnx`` replaced by ``_ctx.onnx``;
    ``InvalidArgument`` (ONNX Runtime's) when there is neither (a model from bytes)."""
    given = config.get(EP_CONTEXT_FILE_PATH, "")
    if given:
        return Path(given)
    if model_path:
        source = Path(model_path)
        stem = source.name[:-5] if source.name.endswith(".onnx") else source.name
        return source.with_name(f"{stem}_ctx.onnx")
    raise InvalidArgument("Both ep_context_path and model_path are empty.")


def output_exists_error(path: str | os.PathLike[str]) -> Fail:
    """ONNX Runtime's error for an EPContext model that would overwrite ``path``."""
    return Fail(f"Failed to generate EP context model since the file '\"{os.fspath(path)}\"' "
                "exists already. Please remove the EP context model if you want to re-generate "
                "it.")


def context_output_path(config: Mapping[str, str], model_path: str | None) -> Path:
    """Where a session's EPContext model goes (:func:`planned_output_path`). Errors are ONNX
    Runtime's: a folder is ``InvalidArgument``, no path at all (model from bytes) is
    ``InvalidArgument``, an existing file is ``Fail``."""
    given = config.get(EP_CONTEXT_FILE_PATH, "")
    if given and is_folder_path(given):
        raise InvalidArgument("context_file_path should not point to a folder.")
    path = planned_output_path(config, model_path)
    if path.exists():
        raise output_exists_error(path)
    return path


def generation_settings(context: ProviderContext) -> GenerationSettings:
    """The generation settings for an EP, from its :class:`ProviderContext` (the framework puts
    the resolved output path in ``ep.context_file_path`` before compiling)."""
    config = context.session_config
    output = config.get(EP_CONTEXT_FILE_PATH, "")
    if not output:
        raise EPFail("EPContext generation is on but the framework gave no output path")
    embed = config.get(EP_CONTEXT_EMBED_MODE, "0")
    if embed not in ("0", "1"):
        raise InvalidArgument(f"{EP_CONTEXT_EMBED_MODE}={embed!r} is invalid; expected 0 or 1")
    path = Path(output)
    return GenerationSettings(output_path=path, embed_mode=int(embed),
                              node_name_prefix=config.get(EP_CONTEXT_NODE_NAME_PREFIX, ""),
                              model_name=context_model_name(path))


def context_model_name(output_path: Path) -> str:
    """The model name of an EPContext model path: ``m_ctx.onnx`` -> ``m`` (else the stem)."""
    name = output_path.name
    return name[:-9] if name.endswith("_ctx.onnx") else output_path.stem


def context_folder(context: ProviderContext) -> Path:
    """The folder ``embed_mode=0`` paths are relative to: the model's, or, for a model loaded
    from bytes, the folder of ``ep.context_file_path``."""
    if context.model_path:  # realpath, not Path.resolve: that adds a stat (9 vs 17 us)
        return Path(os.path.realpath(context.model_path)).parent
    given = context.session_config.get(EP_CONTEXT_FILE_PATH, "")
    if given:
        return Path(os.path.realpath(given)).parent
    raise load_error("The model was loaded from bytes and its EPContext nodes reference a "
                     f"context binary file; set the session option {EP_CONTEXT_FILE_PATH} to the "
                     "model's path so the binary can be found.")


_MISSING = (errno.ENOENT, errno.ENOTDIR, errno.EBADF)
"""The ``os.stat`` errors reported as a context binary that does not exist; any other error is
reported with its own reason ("cannot be opened")."""


def resolve_context_file(relative: bytes | str, folder: Path, *, node: str) -> Path:
    """The context binary ``relative`` (an ``ep_cache_context`` path) inside ``folder``.

    Rejected as ``InvalidGraph``: empty, absolute, escaping ``folder`` (also via a symlink),
    missing, a folder, or an empty file.
    """
    text = relative.decode("utf-8", errors="replace") if isinstance(relative, bytes) else relative
    where = f"EPContext node {node!r}: ep_cache_context"
    if not text:
        raise load_error(f"{where} is empty; expected the context binary's path relative to the "
                         "model")
    if os.path.isabs(text) or Path(text).drive:
        raise load_error(f"{where} {text!r} is an absolute path; it must be relative to the "
                         f"model folder {str(folder)!r}")
    if "\0" in text:
        raise load_error(f"{where} {text!r} contains a NUL byte; expected a file path")
    try:
        # Strings and realpath, not Path.resolve and is_relative_to: resolve adds a stat to
        # each path (to report a symlink loop, which the stat below reports as it did); a load
        # spent ~55 us here.
        root = os.path.realpath(folder)
        target = os.path.realpath(os.path.join(root, text))
        if os.path.commonpath((root, target)) != root:
            raise load_error(f"{where} {text!r} resolves to {target!r}, outside the model "
                             f"folder {root!r}")
        try:
            found = os.stat(target)  # one call where exists(), is_file() and stat() made three
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # what Path.resolve raised
                raise RuntimeError(f"Symlink loop from {exc.filename!r}") from None
            if exc.errno not in _MISSING:
                raise
            raise load_error(f"{where}: context binary {target!r} does not exist") from None
        if not stat.S_ISREG(found.st_mode):
            raise load_error(f"{where}: {target!r} is not a file")
        if found.st_size == 0:
            raise load_error(f"{where}: context binary {target!r} is empty")
    except InvalidGraph:  # a RuntimeError too: said above, not to be wrapped again
        raise
    except (OSError, RuntimeError, ValueError) as exc:  # too long, symlink loop, ...
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise load_error(f"{where} {text[:200]!r} cannot be opened: {reason}") from None
    return Path(target)
