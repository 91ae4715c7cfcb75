"""The work directory of a training run and its ``metrics.json``.

Work directory ``DIR``::

    DIR/checkpoints/epoch-NNN.weights.h5   the weights after an epoch (no optimizer state):
                                           the last ones, as many as averaging needs
    DIR/export/                            SavedModel (written by the application)
    DIR/logs/                              TensorBoard
    DIR/metrics.json                       merged, written atomically
    DIR/run.json                           the run's state: phase, epochs, steps (`read_state`)
    DIR/backup/                            BackupAndRestore state: the latest epoch's weights and
                                           optimizer (kept, so a larger --epochs continues)
    DIR/**/.tmp-*                          a file being written (renamed when complete)
    DIR/.lock                              the PID of the process running in DIR (`lock_workdir`)

`check_workdir` reads what a rerun will read (``metrics.json``, ``run.json``, the backup, the
epoch checkpoints) and raises one clear `ValueError` naming the file, before any data is
loaded; a broken epoch checkpoint is rewritten from the backup or set aside, with a warning.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tfx_transformer.training.h5files import (
    CHECKPOINT_NAME,
    NEW_FILE_MODE,
    checkpoint_files,
    copy_weights_only,
    opens,
    remove_leftovers,
)

__all__ = ["PHASES", "Workdir", "check_workdir", "lock_workdir", "move_aside", "read_metrics",
           "read_state", "to_json", "write_metrics", "write_state"]

# The phases of a run, in order (`run.json` "phase"): fit running or to resume, fit done,
# export written, evaluated and recorded.
PHASES = ("training", "trained", "exported", "finished")


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
    model = property(lambda self: self.root / "model.keras")
    logs = property(lambda self: self.root / "logs")
    backup = property(lambda self: self.root / "backup")
    metrics = property(lambda self: self.root / "metrics.json")
    state = property(lambda self: self.root / "run.json")

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


def _read_object(path: Path) -> dict:
    """The JSON object in ``path`` ({} when the file does not exist)."""
    if not path.exists():
        return {}
    fix = "fix it, move it away, or rerun with --restart"
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON ({error}); {fix}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} must hold a JSON object, not {type(value).__name__} "
                         f"{json.dumps(value)[:40]}; {fix}")
    return value


def _write_object(path: Path, value: Mapping) -> None:
    """Writes ``value`` as JSON to ``path`` atomically (temp file + ``os.replace``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(value, f, indent=2, sort_keys=True, allow_nan=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, NEW_FILE_MODE)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def read_metrics(workdir: Workdir | str | os.PathLike) -> dict:
    """Contents of ``DIR/metrics.json`` ({} when it does not exist).

    Raises:
        ValueError: the file is not valid JSON, or holds something else than an object.
    """
    return _read_object(_root(workdir) / "metrics.json")


def read_state(workdir: Workdir | str | os.PathLike) -> dict:
    """Contents of ``DIR/run.json`` ({} for a new run): ``phase`` (one of `PHASES`),
    ``epochs`` and ``steps`` done, the ``request`` that set them, ``train_seconds``.

    Raises:
        ValueError: the file is not valid JSON, not an object, or has an unknown phase.
    """
    path = _root(workdir) / "run.json"
    state = _read_object(path)
    if state and state.get("phase") not in PHASES:
        raise ValueError(f"{path}: unknown phase {state.get('phase')!r} (one of {PHASES}); "
                         "fix it, move it away, or rerun with --restart")
    return state


def write_state(workdir: Workdir | str | os.PathLike, **fields: Any) -> dict:
    """Merges ``fields`` into ``DIR/run.json`` atomically; returns the new state."""
    path = _root(workdir) / "run.json"
    state = {**_read_object(path), **to_json(fields)}
    _write_object(path, state)
    return state


def move_aside(workdir: Workdir, names: list[str], log: Callable[..., None] = print) -> None:
    """Moves the ``names`` of ``DIR`` that exist (empty ``checkpoints/``, ``logs/`` aside) to a
    new ``DIR/previous-N/`` and says so; nothing is deleted, ``export/`` stays."""
    root = workdir.root
    found = [name for name in names if (root / name).exists()
             and not (name in ("checkpoints", "logs") and not any((root / name).iterdir()))]
    if not found:
        return
    number = 1
    while (root / f"previous-{number}").exists():
        number += 1
    target = root / f"previous-{number}"
    target.mkdir()
    for name in found:
        shutil.move(str(root / name), str(target / name))
    Workdir(root)  # recreates checkpoints/ and logs/
    kept = " (export/ stays until the new export replaces it)" if (
        workdir.export.exists()) else ""
    log(f"restart: moved the earlier run's {', '.join(found)} to {target}{kept}")


@contextlib.contextmanager
def lock_workdir(workdir: Workdir | str | os.PathLike) -> Iterator[None]:
    """Holds an exclusive lock on the directory (``fcntl.flock``) while the block runs.

    Two runs in one work directory would interleave ``run.json`` and ``metrics.json`` and
    overwrite each other's checkpoints; the second one fails at once instead. The lock goes
    with the process (a killed run leaves none behind); while it is held, ``DIR/.lock`` names
    the holder's PID.

    Raises:
        ValueError: another process holds the lock; names the directory and that process.
    """
    root = _root(workdir)
    pid_file = root / ".lock"
    fd = os.open(root, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = pid_file.read_text().strip() if pid_file.exists() else "unknown"
            raise ValueError(f"{root} is in use by process {holder}: wait for it to end, or "
                             "use another --workdir") from None
        pid_file.write_text(str(os.getpid()))
        try:
            yield
        finally:
            pid_file.unlink(missing_ok=True)
    finally:
        os.close(fd)  # releases the lock


def check_workdir(workdir: Workdir, log: Callable[..., None] = print) -> None:
    """Reads what a rerun reads, so a broken file is reported before any data is loaded.

    Checks ``metrics.json`` and ``run.json`` (JSON objects), the backup (its weights file
    opens, its epoch is an integer) and the epoch checkpoints; deletes the temporary files a
    killed write left. An epoch checkpoint that does not open (cut short by a kill or a full
    disk), or the backup's epoch without one, is rewritten from the backup when it is the
    backup's epoch; any other broken one is renamed ``epoch-NNN.weights.h5.broken`` (averaging
    then leaves that epoch out). Both say so on ``log``.

    Raises:
        ValueError: naming the broken file and what to do about it.
    """
    read_metrics(workdir)
    read_state(workdir)
    for directory in (workdir.root, workdir.checkpoints, workdir.backup):
        remove_leftovers(directory)
    weights = workdir.backup / "latest.weights.h5"
    if weights.exists() and not opens(weights) and not opens(Path(f"{weights}.bkp")):
        raise ValueError(
            f"{weights} is truncated or corrupt, so the run cannot resume from it; delete "
            f"{workdir.backup} to train again from epoch 1, or rerun with --restart")
    metadata = workdir.backup / "training_metadata.json"
    epoch = None
    if metadata.exists():
        epoch = _read_object(metadata).get("epoch")
        if not (isinstance(epoch, int) and epoch >= 0):
            raise ValueError(f"{metadata}: 'epoch' must be an integer >= 0, not {epoch!r}; "
                             f"delete {workdir.backup} to train again from epoch 1, or rerun "
                             "with --restart")
    checkpoints = checkpoint_files(workdir.checkpoints)
    if epoch and opens(weights) and epoch not in checkpoints:
        checkpoints[epoch] = workdir.checkpoints / CHECKPOINT_NAME.format(epoch=epoch)
    for number, path in checkpoints.items():
        if opens(path):
            continue
        state = "cut short or corrupt" if path.exists() else "missing"
        if number == epoch and opens(weights):
            copy_weights_only(weights, path)
            log(f"warning: {path} was {state}: rewritten from {weights} (epoch {epoch})")
        else:
            path.replace(f"{path}.broken")
            log(f"warning: {path} is {state}: moved to {path.name}.broken; checkpoint "
                f"averaging leaves epoch {number} out")


def write_metrics(workdir: Workdir | str | os.PathLike, metrics: Mapping[str, Any]) -> dict:
    """Merges ``metrics`` into ``DIR/metrics.json`` atomically (temp file + ``os.replace``).

    Nested dicts merge key by key, so no existing key is lost; NumPy scalars and arrays become
    plain JSON numbers and lists; NaN/inf become null.

    Returns:
        The merged contents written.
    """
    root = _root(workdir)
    merged = _merge(read_metrics(root), to_json(dict(metrics)))
    _write_object(root / "metrics.json", merged)
    return merged
