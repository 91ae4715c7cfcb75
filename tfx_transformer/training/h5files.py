"""Keras ``.weights.h5`` files on disk: written whole or not at all, checked, stripped.

A weights file Keras writes (``model.save_weights``) holds the model's variables under
``layers/`` and ``vars/`` and, once the model is compiled, the optimizer's under
``optimizer/`` (for Adam, two slots per trainable variable: about twice the weights).
`write_atomically` writes any file through a temporary file in the same directory and
``os.replace``, so a kill or a full disk during the write leaves the earlier file, or none, and
never a truncated one; `opens` says whether a file reads back; `copy_weights_only` writes
a copy without the optimizer (what averaging needs). h5py only: no Keras, no TensorFlow.
"""

from __future__ import annotations

import errno
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["CHECKPOINT_NAME", "NEW_DIR_MODE", "NEW_FILE_MODE", "TMP_PREFIX", "NoSpaceError",
           "checkpoint_files", "copy_weights_only", "opens", "remove_leftovers", "write_atomically"]

TMP_PREFIX = ".tmp-"  # a file being written; one left behind by a kill is deleted at start
CHECKPOINT_NAME = "epoch-{epoch:03d}.weights.h5"  # an epoch checkpoint (1-based epoch)
_CHECKPOINT = re.compile(r"epoch-(\d+)\.weights\.h5$")


def checkpoint_files(directory: str | os.PathLike) -> dict[int, Path]:
    """``{epoch (1-based): path}`` of the epoch checkpoints (`CHECKPOINT_NAME`) in
    ``directory``, by epoch."""
    found = {}
    for path in Path(directory).glob("epoch-*.weights.h5"):
        match = _CHECKPOINT.fullmatch(path.name)
        if match:
            found[int(match.group(1))] = path
    return dict(sorted(found.items()))


def _new_file_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


# What ``open`` gives a new file under the process's umask (read once, at import: setting the
# umask to read it is not thread-safe); ``tempfile.mkstemp`` files are 0o600.
NEW_FILE_MODE = _new_file_mode()
# The same for ``os.mkdir`` (``tempfile.mkdtemp`` directories are 0o700): readable -> listable.
NEW_DIR_MODE = NEW_FILE_MODE | (NEW_FILE_MODE & 0o444) >> 2


class NoSpaceError(ValueError):
    """The disk of the work directory has too little free space for what a run writes next."""


def write_atomically(path: str | os.PathLike, write: Callable[[str], object]) -> Path:
    """Calls ``write(tmp)`` with a new path beside ``path``, then renames it to ``path``.

    Raises:
        NoSpaceError: the disk filled up during the write (``path`` keeps what it held).
        Whatever else ``write`` raises; ``path`` then holds what it held before and no
        temporary file is left.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # The name ends as ``path``'s does: Keras writes ``.weights.h5`` files only.
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


def _disk_full(error: BaseException) -> bool:
    """ENOSPC, also when h5py or Keras wrapped it into another error's message."""
    while error is not None:
        if getattr(error, "errno", None) == errno.ENOSPC or "No space left" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def remove_leftovers(directory: str | os.PathLike) -> list[Path]:
    """Deletes the temporary files (`TMP_PREFIX`) a killed write left in ``directory``."""
    found = sorted(Path(directory).glob(TMP_PREFIX + "*")) if os.path.isdir(directory) else []
    for path in found:
        path.unlink(missing_ok=True)
    return found


def opens(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an HDF5 file that opens and whose objects are all listed."""
    import h5py  # Keras's own dependency

    if not os.path.exists(path):
        return False
    try:
        with h5py.File(path, "r") as f:
            f.visit(lambda name: None)  # a truncated file fails on open (HDF5 checks its end)
        return True
    except Exception:  # any failure to read it means "broken"
        return False


def copy_weights_only(source: str | os.PathLike, target: str | os.PathLike) -> Path:
    """Writes ``target`` (atomically): the weights file ``source`` without its optimizer.

    ``model.load_weights(target)`` sets the model's weights and leaves its optimizer as it is.
    """
    import h5py

    def write(tmp: str) -> None:
        with h5py.File(source, "r") as src, h5py.File(tmp, "w") as dst:
            for key, value in src.attrs.items():
                dst.attrs[key] = value
            for name in src:
                if name != "optimizer":
                    src.copy(src[name], dst, name=name)

    return write_atomically(target, write)
