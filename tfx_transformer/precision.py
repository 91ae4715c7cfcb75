"""The global Keras dtype policy of a run (``--mixed-precision``)."""

from __future__ import annotations

import keras

__all__ = ["MIXED_PRECISION", "set_mixed_precision"]

# ``--mixed-precision`` value -> Keras dtype policy name.
MIXED_PRECISION = {"none": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}


def set_mixed_precision(name: str) -> str:
    """Sets the global Keras dtype policy for ``--mixed-precision none|bfloat16|float16``.

    Returns:
        The policy name set: ``float32``, ``mixed_bfloat16`` or ``mixed_float16``.

    Raises:
        ValueError: unknown ``name``.
    """
    if name not in MIXED_PRECISION:
        raise ValueError(
            f"`--mixed-precision` must be one of {tuple(MIXED_PRECISION)}. Received: {name!r}"
        )
    keras.config.set_dtype_policy(MIXED_PRECISION[name])
    return MIXED_PRECISION[name]
