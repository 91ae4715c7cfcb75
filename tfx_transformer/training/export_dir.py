"""Writing an export directory so that a failure never costs the previous export.

`write_export_dir` is how both applications write ``DIR/export``: the new export is written
into a temporary directory beside the target and swapped in only once it is complete. A
writer that fails (or is interrupted) leaves the earlier export as it was and no temporary
directory behind; a swap that fails puts the earlier export back.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable

from tfx_transformer.training.h5files import NEW_DIR_MODE

__all__ = ["write_export_dir"]

TMP_PREFIX = ".export-"  # the new export while it is written
OLD_PREFIX = ".export-old-"  # the previous export while the new one is moved in


def write_export_dir(path: str | os.PathLike, write: Callable[[str], object]) -> str:
    """Calls ``write(tmp)`` with an empty directory beside ``path``, then moves it to ``path``.

    An existing ``path`` (directory or file) is replaced as a whole, never merged into, and
    only after ``write`` has returned.

    Args:
        path: the export directory; its parent is created if needed.
        write: writes the export into the directory it is given.

    Returns:
        ``path`` as a string.

    Raises:
        Whatever ``write`` or the move raises; ``path`` then holds what it held before. Should
        putting the previous export back fail too, it is left in a ``.export-old-*``
        directory beside ``path``: never deleted.
    """
    path = os.fspath(path)
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=TMP_PREFIX, dir=parent)
    os.chmod(tmp, NEW_DIR_MODE)
    try:
        write(tmp)
        _swap_in(tmp, path, parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def _swap_in(tmp: str, path: str, parent: str) -> None:
    """Moves ``tmp`` to ``path``; what was at ``path`` is put back if that fails."""
    old = None
    if os.path.lexists(path):
        old = tempfile.mkdtemp(prefix=OLD_PREFIX, dir=parent)
        try:
            os.replace(path, os.path.join(old, "export"))
        except OSError:  # nothing moved: the previous export is still at `path`
            os.rmdir(old)
            raise
    try:
        os.replace(tmp, path)
    except BaseException:
        if old is not None:
            os.replace(os.path.join(old, "export"), path)
            shutil.rmtree(old, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
