"""Keras finds this project's classes by name once a package is imported, Keras or not.

``keras.saving.load_model`` rebuilds a saved object from its registered name
(``"nlp>Seq2SeqTransformer"``), so the class must be registered before the file is read. The
packages (`tfx_transformer`, `nlp`, `vision`) cannot import their Keras modules when they are
imported: the commands silence TensorFlow before it loads, and a serving process loads an
export without Keras. So each package hands `register_lazily` the names it saves and the
module that defines each; as soon as Keras is imported (at once, if it already is), every name
is entered in Keras's registry as a stand-in that imports its module on first use, and the
module's own ``register_keras_serializable`` then replaces the stand-in with the class.

Importing this module imports neither Keras nor TensorFlow.
"""

from __future__ import annotations

import importlib

__all__ = ["register_lazily"]

_NAMES: dict[str, str] = {}  # registered name -> module that registers it
_HOOKED = False


def register_lazily(names: dict[str, str]) -> None:
    """Makes each registered name (``"package>Class"``) loadable by Keras, importing its
    module (the value) only when Keras first asks for it."""
    global _HOOKED
    _NAMES.update(names)
    if not _HOOKED:
        import wrapt  # its post-import hook runs at once if Keras is loaded already

        _HOOKED = True
        wrapt.register_post_import_hook(_enter, "keras")
    else:
        import sys

        if sys.modules.get("keras") is not None:
            _enter(sys.modules["keras"])


def _enter(keras) -> None:
    """Enters every name not registered yet as a `_Deferred` stand-in."""
    registry = keras.saving.get_custom_objects()
    for name, module in _NAMES.items():
        registry.setdefault(name, _Deferred(name, module))


class _Deferred:
    """Stands for a registered class until its module is imported (by the first use)."""

    def __init__(self, name: str, module: str):
        self.name, self.module = name, module

    def resolve(self):
        """The registered class: its module imported, which registers it."""
        import keras

        importlib.import_module(self.module)
        found = keras.saving.get_custom_objects().get(self.name)
        if found is None or isinstance(found, _Deferred):
            raise LookupError(f"{self.module} does not register {self.name!r}")
        return found

    def from_config(self, config):
        return self.resolve().from_config(config)

    def __call__(self, *args, **kwargs):
        return self.resolve()(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<{self.name}, registered when {self.module} is imported>"
