"""Every file a training run writes, and the one way each is written: whole or not at all.

Work directory ``DIR``::

    DIR/checkpoints/epoch-NNN.weights.h5   the weights after an epoch (no optimizer state):
                                           as many as the export's averaging needs
    DIR/backup/latest.weights.h5           weights and optimizer state of the last epoch, and
    DIR/backup/training_metadata.json      its epoch and optimizer step (what a rerun resumes)
    DIR/export/                            the SavedModel (swapped in whole: `write_export_dir`)
    DIR/model.keras                        the exported weights in Keras's format
    DIR/logs/                              TensorBoard
    DIR/metrics.json                       the history and the scores, merged
    DIR/run.json                           phase, epochs, steps, request, data (`read_state`)
    DIR/.lock                              the PID of the process running in DIR
    DIR/**/.tmp-*                          something being written (renamed when complete)

Every file goes through `write_atomically` and every export through `write_export_dir`: both
write beside the target under the one prefix `TMP_PREFIX` and rename, so a kill or a full disk
leaves the earlier file, or none, never a truncated one; `remove_leftovers` clears what a kill
left. No Keras and no TensorFlow.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["CHECKPOINT_NAME", "NEW_DIR_MODE", "PHASES", "TMP_PREFIX", "NoSpaceError", "Workdir",
           "checkpoint_files", "lock_workdir", "move_aside",
           "read_metrics", "read_object", "read_state", "remove_leftovers", "to_json",
           "write_atomically", "write_export_dir", "write_metrics", "write_state"]

# The phases of a run, in order (`run.json` "phase"): fit running or to resume, fit done,
# export written, evaluated and recorded.
PHASES = ("training", "trained", "exported", "finished")
TMP_PREFIX = ".tmp-"  # a file or export being written; one a kill left is removed at start
PREVIOUS_PREFIX = TMP_PREFIX + "previous-"  # the export a swap set aside, until it is done
CHECKPOINT_NAME = "epoch-{epoch:03d}.weights.h5"  # an epoch checkpoint (1-based epoch)
_CHECKPOINT = re.compile(r"epoch-(\d+)\.weights\.h5$")
_FIX = "fix it, move it away, or rerun with --restart"


def _new_file_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


# What ``open`` gives a new file under the umask (read once: setting the umask to read it is
# not thread-safe); ``mkstemp`` files are 0o600 and ``mkdtemp`` directories 0o700.
NEW_FILE_MODE = _new_file_mode()
NEW_DIR_MODE = NEW_FILE_MODE | (NEW_FILE_MODE & 0o444) >> 2  # readable -> listable


class NoSpaceError(ValueError):
    """The disk of the work directory has too little free space for what a run writes next."""


class Workdir:
    """Paths of a work directory; creating one makes ``checkpoints/`` and ``logs/`` and
    deletes nothing.

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
    backup_weights = property(lambda self: self.root / "backup" / "latest.weights.h5")
    backup_metadata = property(lambda self: self.root / "backup" / "training_metadata.json")
    metrics = property(lambda self: self.root / "metrics.json")
    state = property(lambda self: self.root / "run.json")

    def latest_checkpoint(self) -> Path | None:
        """The epoch checkpoint with the highest epoch, or None."""
        found = checkpoint_files(self.checkpoints)
        return found[max(found)] if found else None

    def __repr__(self) -> str:
        return f"Workdir({str(self.root)!r})"


def _root(workdir: Workdir | str | os.PathLike) -> Path:
    return workdir.root if isinstance(workdir, Workdir) else Path(workdir)


def write_atomically(path: str | os.PathLike, write: Callable[[str], object]) -> Path:
    """Calls ``write(tmp)`` with a new path beside ``path``, then renames it to ``path``.

    Raises:
        NoSpaceError: the disk filled up during the write (``path`` keeps what it held).
        Whatever else ``write`` raises; ``path`` then holds what it held before and no
        temporary file is left.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # The name ends as ``path``'s does: Keras writes ``.weights.h5`` and ``.keras`` files only.
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, suffix="-" + path.name, dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, NEW_FILE_MODE)
        os.replace(tmp, path)
    except Exception as error:
        if _disk_full(error):
            raise NoSpaceError(f"the disk of {path.parent} is full: {path.name} could not be "
                               f"written, {path.name} keeps what it held; free some space and "
                               "rerun the same command") from None
        raise
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def _disk_full(error: BaseException | None) -> bool:
    """ENOSPC, also when h5py or Keras wrapped it into another error's message."""
    while error is not None:
        if getattr(error, "errno", None) == errno.ENOSPC or "No space left" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def write_export_dir(path: str | os.PathLike, write: Callable[[str], object]) -> str:
    """Calls ``write(tmp)`` with an empty directory beside ``path``, then swaps it in.

    What was at ``path`` is replaced as a whole, never merged into, and only after ``write``
    returned. A failure leaves ``path`` as it was; should putting the previous export back
    fail too, it stays in a ``.tmp-*`` directory beside ``path``, which `remove_leftovers`
    moves back.
    """
    path = os.fspath(path)
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=TMP_PREFIX, dir=parent)
    os.chmod(tmp, NEW_DIR_MODE)
    old = None
    try:
        write(tmp)
        if os.path.lexists(path):
            old = tempfile.mkdtemp(prefix=PREVIOUS_PREFIX, dir=parent)
            os.replace(path, os.path.join(old, os.path.basename(path)))
        os.replace(tmp, path)
    except BaseException:
        if old is not None and os.path.lexists(os.path.join(old, os.path.basename(path))):
            os.replace(os.path.join(old, os.path.basename(path)), path)
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return path


def remove_leftovers(directory: str | os.PathLike) -> list[Path]:
    """Deletes what killed writes left in ``directory`` (`TMP_PREFIX`); an earlier export
    that a killed swap left there goes back to its place first."""
    directory = Path(directory)
    found = sorted(directory.glob(TMP_PREFIX + "*")) if directory.is_dir() else []
    for path in found:
        if path.is_dir():
            for kept in path.iterdir() if path.name.startswith(PREVIOUS_PREFIX) else ():
                if not (directory / kept.name).exists():  # a swap was killed half-way
                    kept.replace(directory / kept.name)
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return found


def checkpoint_files(directory: str | os.PathLike) -> dict[int, Path]:
    """``{epoch (1-based): path}`` of the epoch checkpoints in ``directory``, by epoch."""
    found = {}
    for path in Path(directory).glob("epoch-*.weights.h5"):
        match = _CHECKPOINT.fullmatch(path.name)
        if match:
            found[int(match.group(1))] = path
    return dict(sorted(found.items()))


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


def read_object(path: Path) -> dict:
    """The JSON object in ``path`` ({} when the file does not exist).

    Raises:
        ValueError: not valid JSON, or not an object; names the file.
    """
    if not path.exists():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON ({error}); {_FIX}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} must hold a JSON object, not {type(value).__name__} "
                         f"{json.dumps(value)[:40]}; {_FIX}")
    return value


def _write_object(path: Path, value: Mapping) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(value, f, indent=2, sort_keys=True, allow_nan=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())

    write_atomically(path, write)


def read_metrics(workdir: Workdir | str | os.PathLike) -> dict:
    """``DIR/metrics.json`` ({} when it does not exist); ValueError when it is broken."""
    return read_object(_root(workdir) / "metrics.json")


def write_metrics(workdir: Workdir | str | os.PathLike, metrics: Mapping[str, Any]) -> dict:
    """Merges ``metrics`` into ``DIR/metrics.json`` (nested dicts key by key, so no key is
    lost; NumPy values become JSON, NaN/inf null); returns what it wrote."""

    def merge(old: dict, new: Mapping) -> dict:
        merged = dict(old)
        for key, value in new.items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                value = merge(merged[key], value)
            merged[key] = value
        return merged

    root = _root(workdir)
    merged = merge(read_metrics(root), to_json(dict(metrics)))
    _write_object(root / "metrics.json", merged)
    return merged


def read_state(workdir: Workdir | str | os.PathLike) -> dict:
    """``DIR/run.json`` ({} for a new run): ``phase`` (one of `PHASES`), ``epochs`` and
    ``steps`` done, the ``request`` that set them, ``training_seconds``, ``run_seconds``.

    Raises:
        ValueError: the file is not valid JSON, not an object, or has an unknown phase.
    """
    path = _root(workdir) / "run.json"
    state = read_object(path)
    if state and state.get("phase") not in PHASES:
        raise ValueError(f"{path}: unknown phase {state.get('phase')!r} (one of {PHASES}); "
                         f"{_FIX}")
    return state


def write_state(workdir: Workdir | str | os.PathLike, **fields: Any) -> dict:
    """Merges ``fields`` into ``DIR/run.json``; returns the new state."""
    path = _root(workdir) / "run.json"
    state = {**read_object(path), **to_json(fields)}
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
    kept = " (export/ stays until the new export replaces it)" if workdir.export.exists() else ""
    log(f"restart: moved the earlier run's {', '.join(found)} to {target}{kept}")


@contextlib.contextmanager
def lock_workdir(workdir: Workdir | str | os.PathLike) -> Iterator[None]:
    """Holds an exclusive ``fcntl.flock`` on the directory while the block runs: a second run
    in it fails at once instead of interleaving its files. The lock goes with the process;
    while it is held, ``DIR/.lock`` names the holder's PID.

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
