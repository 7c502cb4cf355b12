"""Sweeping one trace over a grid of device configs, on a local process pool or on Ray.

A grid file (JSON or TOML) names the base config and the values each field takes; the sweep is
their cartesian product::

    base = "npu-m"                 # a preset, or a table of fields (default: the trace's config)
    mode = "elastic"               # or "recorded"
    [grid]
    hbm_gbps = [230, 460, 920]
    dma_channels = [2, 4, 8]

``configs = [{...}, ...]`` lists configs explicitly instead (or as well). Every config is
validated before anything runs. :func:`sweep` replays the trace under each and returns one row
per config: the fields that vary, ``makespan``, ``microseconds``, mean utilization of the cores
and of the DMA channels, energy by component when the cost model reports it, and the replay's
flags. :func:`write_table` writes the rows as CSV and JSON. Workers load the trace once each.
"""

from __future__ import annotations

import csv
import gc
import io
import itertools
import json
import os
import tomllib
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from ..config import DeviceConfig
from ..errors import ConfigError, TraceError
from ..files import write_atomic
from .format import Trace, load
from .retime import SplitRule


def read_grid(path: str | os.PathLike[str], base: DeviceConfig) -> tuple[list[DeviceConfig],
                                                                          str]:
    """The configs of a grid file (see the module docstring) and its replay mode."""
    path = Path(path)
    where = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceError(where, f"cannot read the grid ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise TraceError(where, f"not a UTF-8 text grid ({exc.reason} at byte {exc.start})"
                         ) from None
    try:
        data = tomllib.loads(text) if path.suffix.lower() == ".toml" else json.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise TraceError(where, f"not valid {path.suffix[1:].upper() or 'JSON'} ({exc})") from None
    return grid_configs(data, base, where)


def grid_configs(data: Any, base: DeviceConfig, where: str = "grid") -> tuple[
        list[DeviceConfig], str]:
    """The configs and mode described by a grid object (already parsed)."""
    if not isinstance(data, dict):
        raise TraceError(where, "expected an object with 'grid' and/or 'configs'")
    unknown = set(data) - {"base", "grid", "configs", "mode"}
    if unknown:
        raise TraceError(where, f"unknown keys {sorted(unknown)}; expected base, grid, "
                                "configs, mode")
    mode = data.get("mode", "elastic")
    if mode not in ("elastic", "recorded"):
        raise TraceError(where, f"mode={mode!r}; expected 'elastic' or 'recorded'")
    try:
        start = base
        if isinstance(data.get("base"), str):
            start = DeviceConfig.preset(data["base"])
        elif isinstance(data.get("base"), dict):
            start = DeviceConfig.from_dict({**base.to_dict(), **data["base"]})
        configs: list[DeviceConfig] = []
        grid = data.get("grid", {})
        if not isinstance(grid, dict) or not all(isinstance(v, list) and v
                                                 for v in grid.values()):
            raise TraceError(where, "grid: expected a table of field -> non-empty list")
        if grid:
            names = list(grid)
            for values in itertools.product(*(grid[n] for n in names)):
                configs.append(start.replace(**dict(zip(names, values, strict=True))))
        for entry in data.get("configs", []):
            if not isinstance(entry, dict):
                raise TraceError(where, f"configs: {entry!r}; expected a table of fields")
            configs.append(start.replace(**entry))
    except ConfigError as exc:
        raise TraceError(where, exc.message) from None
    if not configs:
        raise TraceError(where, "no configs: give a 'grid' of values or a 'configs' list")
    return configs, mode


_TRACE: Trace | None = None


_SPLIT: SplitRule | None = None


def _init_worker(trace: Trace, split: SplitRule | None = None) -> None:
    global _TRACE, _SPLIT
    _TRACE, _SPLIT = trace, split


def _pool_init(trace: Trace, split: SplitRule | None) -> None:
    """A pool worker's setup: the trace, frozen out of the garbage collector's sight (it lives
    as long as the worker, and replay allocates many short-lived objects)."""
    _init_worker(trace, split)
    gc.freeze()


def _rows(configs: list[dict[str, Any]], mode: str) -> list[dict[str, Any]]:
    assert _TRACE is not None
    return [row(_TRACE, DeviceConfig(**c), mode, _SPLIT) for c in configs]


def row(trace: Trace, config: DeviceConfig, mode: str = "elastic",
        split: SplitRule | None = None) -> dict[str, Any]:
    """One table row: ``trace`` replayed under ``config``."""
    from .retime import replay

    result = replay(trace, config, mode, split=split)
    util = result.utilization
    cores = [u for e, u in util.items() if e.startswith("core")]
    dmas = [u for e, u in util.items() if e.startswith("dma")]
    out: dict[str, Any] = {
        "config_digest": config.digest[:16], "makespan": result.makespan,
        "microseconds": round(result.microseconds, 4),
        "core_utilization": round(sum(cores) / config.cores, 4),
        "dma_utilization": round(sum(dmas) / config.dma_channels, 4),
        "flags": len(result.flags),
    }
    for part, value in sorted(result.energy.items()):
        out[f"energy.{part}"] = value
    return out


def sweep(trace: Trace | str | os.PathLike[str], configs: Sequence[DeviceConfig],
          mode: str = "elastic", *, workers: int | None = None, ray: str | bool | None = None,
          chunk: int = 25, split: SplitRule | None = None,
          progress: Callable[[int], None] | None = None) -> list[dict[str, Any]]:
    """Replay ``trace`` under every config; one row per config, in order. ``split`` is the
    core-split rule of :func:`~npu_sim.trace.retime.replay` (a module-level function, so
    workers can receive it).

    ``workers``: local processes (default: the CPU count; 1 runs in this process). ``ray``:
    run on Ray instead (True: a local instance or the one ``RAY_ADDRESS`` names; a string: that
    cluster's address); needs the ``npu-sim[ray]`` extra. ``progress(n)`` is called as each
    batch of ``n`` configs completes (the command line's progress bar).
    """
    trace = load(trace)
    done = progress or (lambda n: None)
    varying = _varying(configs)
    plain = [c.to_dict() for c in configs]
    batches = [plain[i:i + chunk] for i in range(0, len(plain), chunk)]
    if ray:
        results = _on_ray(trace, batches, mode, None if ray is True else str(ray), split)
        done(len(plain))
    elif (workers or os.cpu_count() or 1) <= 1 or len(batches) == 1:
        _init_worker(trace, split)
        results = []
        for b in batches:
            results.append(_rows(b, mode))
            done(len(b))
    else:
        with ProcessPoolExecutor(max_workers=workers, initializer=_pool_init,
                                 initargs=(trace, split)) as pool:
            results = []
            for batch, rows in zip(batches, pool.map(_rows, batches, itertools.repeat(mode)),
                                   strict=True):
                results.append(rows)
                done(len(batch))
    rows = [r for batch in results for r in batch]
    return [{**{k: c.to_dict()[k] for k in varying}, **r}
            for c, r in zip(configs, rows, strict=True)]


def _varying(configs: Sequence[DeviceConfig]) -> list[str]:
    dicts = [c.to_dict() for c in configs]
    return [k for k in dicts[0] if len({repr(d[k]) for d in dicts}) > 1] if dicts else []


def _on_ray(trace: Trace, batches: list, mode: str, address: str | None,
            split: SplitRule | None) -> list:
    try:
        import ray
    except ImportError:
        raise TraceError("sweep", "--ray needs Ray: pip install 'npu-sim[ray]'") from None
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    try:
        ref = ray.put(trace)
        task = ray.remote(_ray_batch)
        return ray.get([task.remote(ref, b, mode, split) for b in batches])
    finally:
        if started:
            ray.shutdown()


def _ray_batch(trace: Trace, batch: list[dict[str, Any]], mode: str,
               split: SplitRule | None) -> list[dict[str, Any]]:
    _init_worker(trace, split)
    return _rows(batch, mode)


def write_table(rows: Iterable[dict[str, Any]], stem: str | os.PathLike[str]) -> tuple[Path,
                                                                                       Path]:
    """Write ``<stem>.csv`` and ``<stem>.json`` (atomically); returns both paths."""
    rows = list(rows)
    columns: list[str] = []
    for r in rows:
        columns.extend(k for k in r if k not in columns)
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    stem = Path(stem)
    csv_path = write_atomic(stem.with_suffix(".csv"), [text.getvalue().encode("utf-8")])
    json_path = write_atomic(stem.with_suffix(".json"),
                             [json.dumps(rows, indent=1).encode("utf-8")])
    return csv_path, json_path
