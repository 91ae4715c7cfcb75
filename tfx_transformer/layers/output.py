"""``AttentionOutput``, what every attention layer returns, and the call-argument helper the
layers' ``compute_output_spec`` use."""

from __future__ import annotations

import inspect
import warnings
from typing import Any, NamedTuple

import keras
import optree

__all__ = ["AttentionOutput", "call_arguments"]


class AttentionOutput(NamedTuple):
    """What ``MultiHeadAttention``, ``TransformerDecoderLayer`` and ``TransformerDecoder`` return.

    Always these three fields in this order, whatever the call arguments; a field that was not
    asked for is ``None``.

    Attributes:
        output: ``(B, T, d_out)``; a ``TransformerDecoder`` with ``return_intermediate``
            gives ``(L, B, T, d)``.
        attention: attention weights ``(B, H, T, S)`` when asked for
            (``return_attention_scores`` / ``return_cross_attention``), else ``None``. The
            decoder layer returns its cross-attention weights, the decoder stack every
            layer's, ``(L, B, H, T, S)``.
        cache: the updated self-attention cache when a ``cache`` was passed, else ``None``:
            ``(2, B, H, S_max, D)``; the decoder stack's ``(L, 2, B, H, T_max, D)``.
    """

    output: Any
    attention: Any | None = None
    cache: Any | None = None


def call_arguments(layer: keras.layers.Layer, args, kwargs) -> dict:
    """The arguments of ``layer.call(*args, **kwargs)`` by name, defaults filled in.

    Keras calls ``compute_output_spec`` with the arguments of ``call``; the layers here take
    them as ``*args, **kwargs`` and read them with this, so ``call``'s signature is the only
    one written.
    """
    bound = inspect.signature(layer.call).bind(*args, **kwargs)
    bound.apply_defaults()
    return bound.arguments


def _flatten_output(result: AttentionOutput):
    present = tuple(field is not None for field in result)
    children = [field for field in result if field is not None]
    names = [name for name, field in zip(result._fields, result) if field is not None]
    return children, present, names


def _unflatten_output(present, children) -> AttentionOutput:
    children = iter(children)
    return AttentionOutput(*(next(children) if p else None for p in present))


# Keras flattens layer outputs with `None` as a leaf, and its functional API rejects a
# non-tensor leaf, so a symbolic call returning `AttentionOutput(x, None, None)` would fail.
# Registered in Keras's tree namespace (optree is a Keras dependency), the `None` fields are
# empty subtrees instead, as in JAX's and optree's own default: `keras.tree.flatten` gives
# only the tensors, and the structure (with its `None` fields) is rebuilt around them.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)  # "a namedtuple is already registered"
    try:
        optree.register_pytree_node(
            AttentionOutput, _flatten_output, _unflatten_output, namespace="keras"
        )
    except ValueError:  # already registered (module imported twice)
        pass
