"""The work directory of a training run and its ``metrics.json``.

Work directory ``DIR``::

    DIR/checkpoints/epoch-NNN.weights.h5   weights + optimizer state after each epoch
    DIR/export/                            SavedModel (written by the application)
    DIR/logs/                              TensorBoard
    DIR/metrics.json                       merged, written atomically
    DIR/backup/                            BackupAndRestore state (removed after a finished fit)
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Workdir", "read_metrics", "to_json", "write_metrics"]


class Workdir:
    """Paths of a training work directory; creating one never deletes anything in it.

    Args:
        root: the directory. Created with ``checkpoints/`` and ``logs/`` if missing; ``export/``
            and ``backup/`` are created by their writers.

    Raises:
        ValueError: ``root`` exists and is not a directory.
    """

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        if self.root.exists() and not self.root.is_dir():
            raise ValueError(f"`workdir` must be a directory. Received: {str(root)!r} is a file")
        for path in (self.checkpoints, self.logs):
            path.mkdir(parents=True, exist_ok=True)

    checkpoints = property(lambda self: self.root / "checkpoints")
    export = property(lambda self: self.root / "export")
    logs = property(lambda self: self.root / "logs")
    backup = property(lambda self: self.root / "backup")
    metrics = property(lambda self: self.root / "metrics.json")

    def latest_checkpoint(self) -> Path | None:
        """The ``epoch-NNN.weights.h5`` file with the highest epoch, or None."""
        found = sorted(self.checkpoints.glob("epoch-*.weights.h5"))
        return found[-1] if found else None

    def __repr__(self) -> str:
        return f"Workdir({str(self.root)!r})"


def _root(workdir: Workdir | str | os.PathLike) -> Path:
    return workdir.root if isinstance(workdir, Workdir) else Path(workdir)


def to_json(value: Any) -> Any:
    """NumPy/TensorFlow values -> plain JSON values; NaN and infinities become None.

    Raises:
        TypeError: a value that has no JSON form.
    """
    if isinstance(value, Mapping):
        return {str(key): to_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(item) for item in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if hasattr(value, "numpy") or isinstance(value, (np.ndarray, np.generic)):
        return to_json(np.asarray(value).tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"metrics values must be JSON-like. Received: {type(value).__name__}")


def _merge(old: dict, new: Mapping) -> dict:
    merged = dict(old)
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            value = _merge(merged[key], value)
        merged[key] = value
    return merged


def read_metrics(workdir: Workdir | str | os.PathLike) -> dict:
    """Contents of ``DIR/metrics.json`` ({} when it does not exist).

    Raises:
        ValueError: the file is not valid JSON.
    """
    path = _root(workdir) / "metrics.json"
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON ({error}); fix or move it") from None


def write_metrics(workdir: Workdir | str | os.PathLike, metrics: Mapping[str, Any]) -> dict:
    """Merges ``metrics`` into ``DIR/metrics.json`` atomically (temp file + ``os.replace``).

    Nested dicts merge key by key, so no existing key is lost; NumPy scalars and arrays become
    plain JSON numbers and lists; NaN/inf become null.

    Returns:
        The merged contents written.
    """
    root = _root(workdir)
    root.mkdir(parents=True, exist_ok=True)
    merged = _merge(read_metrics(root), to_json(dict(metrics)))
    fd, tmp = tempfile.mkstemp(prefix=".metrics.", suffix=".tmp", dir=root)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(merged, f, indent=2, sort_keys=True, allow_nan=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, root / "metrics.json")
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return merged
