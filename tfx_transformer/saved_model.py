"""Writing a Keras model's SavedModel with each endpoint traced once.

`write_saved_model` writes what ``keras.export.ExportArchive`` writes for ``track(model)``,
``track(resource)`` and ``add_endpoint(name, fn, input_signature)`` (the model's variable
lists, the endpoints as functions and signatures, the first one also as ``serving_default``),
at half the cost for search loops and detectors: the archive traces every endpoint once
outside TensorFlow's save context (to list the variables it uses) and once more inside it,
because a function's trace cache is keyed on the save context's variable policy. Here each
endpoint is traced only by ``tf.saved_model.save``; the saved functions read the model's
variables, so nothing needs listing beforehand.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import tensorflow as tf


def write_saved_model(directory: str | os.PathLike, model,
                      endpoints: Sequence[tuple[str, Callable, Sequence]],
                      resources: Sequence = ()) -> None:
    """Saves ``model``'s variables, ``resources`` and ``endpoints`` to ``directory``.

    Args:
        directory: where the SavedModel goes.
        model: a built Keras model (the TensorFlow backend's variables).
        endpoints: ``(name, fn, input_signature)`` each; ``fn`` is traced with
            ``input_signature`` (a list of ``tf.TensorSpec``; None: ``fn`` is a `tf.function`
            that has one) and saved as the function and the signature ``name``; the first one
            is ``serving_default`` too. The same ``fn`` under several names is traced once.
        resources: TensorFlow resources the endpoints use that the model does not hold
            (lookup tables).
    """
    if not model.built:
        raise ValueError("The model must be built before it is saved")
    if not endpoints:
        raise ValueError("`endpoints` must name at least one function")
    root = tf.train.Checkpoint()  # a plain trackable that takes any attribute
    root.variables = list(model.variables)
    root.trainable_variables = list(model.trainable_variables)
    root.non_trainable_variables = list(model.non_trainable_variables)
    # The TensorFlow variables themselves too, as the functions capture them (the LiteRT
    # converter freezes only these).
    root.tf_variables = [v.value for v in model.variables]
    root.resources = list(resources)
    signatures, functions = {}, {}
    for name, fn, input_signature in endpoints:
        if id(fn) not in functions:  # an endpoint under two names is traced once
            functions[id(fn)] = fn if input_signature is None else tf.function(
                fn, input_signature=list(input_signature), autograph=False)
        function = functions[id(fn)]
        setattr(root, name, function)
        signatures[name] = function
    signatures.setdefault("serving_default", signatures[endpoints[0][0]])
    tf.saved_model.save(root, os.fspath(directory), signatures=signatures)
