"""What the applications lend the shared commands: each registers itself by entry points.

`tfx_transformer` imports neither application. The quick start
(`tfx_transformer.commands.quickstart`) and the server (`tfx_transformer.commands.serve`) find them
through two entry-point groups of the installed package (``pyproject.toml``):

- ``tfx_transformer.quickstart``: ``run(root, minutes)`` trains, evaluates and tries one
  application's tiny model under ``root`` within ``minutes``;
- ``tfx_transformer.exports``: by export kind (``translator``, ``detector``),
  ``describe(path) -> dict``, what the server's page shows of that export (ValueError naming
  the path when it is not one);
- ``tfx_transformer.formats``: by format name (``litert``, ``onnx``, ``ctranslate2``),
  ``write(model, out, precision, input_size) -> dict``, what ``tfx-export`` calls: writes
  the artefact of ``model`` to ``out`` (which must not exist) and returns its settings
  (ValueError naming what the format cannot take).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points

__all__ = ["EXPORTS", "FORMATS", "QUICKSTART", "load", "names", "registered"]

QUICKSTART = "tfx_transformer.quickstart"
EXPORTS = "tfx_transformer.exports"
FORMATS = "tfx_transformer.formats"


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


def names(group: str) -> list[str]:
    """The entry-point names registered in ``group``, sorted (none loaded)."""
    return sorted({point.name for point in entry_points(group=group)})


def load(group: str, name: str) -> Callable:
    """The function registered as ``name`` in ``group``; only its module is imported.

    Raises:
        ValueError: nothing is registered under ``name`` (the message lists the names).
    """
    points = [point for point in entry_points(group=group) if point.name == name]
    if not points:
        raise ValueError(f"{name!r} is not registered in {group!r}; registered: "
                         f"{', '.join(names(group)) or 'none (install the package)'}")
    return points[0].load()
