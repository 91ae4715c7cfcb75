"""What the applications lend the shared commands: each registers itself by entry points.

`tfx_transformer` imports neither application. The quick start (`tfx_transformer.quickstart`)
and the server (`tfx_transformer.serving.command`) find them through two entry-point groups
of the installed package (``pyproject.toml``):

- ``tfx_transformer.quickstart``: ``run(root, minutes)`` trains, evaluates and tries one
  application's tiny model under ``root`` within ``minutes``;
- ``tfx_transformer.exports``: by export kind (``translator``, ``detector``),
  ``describe(path) -> dict``, what the server's page shows of that export (ValueError naming
  the path when it is not one).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points

__all__ = ["EXPORTS", "QUICKSTART", "registered"]

QUICKSTART = "tfx_transformer.quickstart"
EXPORTS = "tfx_transformer.exports"


def registered(group: str) -> dict[str, Callable]:
    """The functions registered in ``group``, by entry-point name, in the order of the names.

    Raises:
        RuntimeError: nothing is registered (the package is not installed).
    """
    found = {point.name: point for point in sorted(entry_points(group=group),
                                                   key=lambda point: point.name)}
    if not found:
        raise RuntimeError(f"no application registers {group!r}: install the package "
                           "(`make install` or `pip install -e .`)")
    return {name: point.load() for name, point in found.items()}
