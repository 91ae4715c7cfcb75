"""Attention masks. Convention everywhere: boolean, ``True`` = may attend / valid."""

from __future__ import annotations

from keras import ops

__all__ = ["causal_mask", "padding_mask", "merge_masks"]


def causal_mask(query_length: int, key_length: int | None = None, offset=0):
    """Lower-triangular mask: query position ``i`` may attend key positions ``j <= i + offset``.

    Args:
        query_length: number of query positions ``T``.
        key_length: number of key positions ``S`` (defaults to ``query_length``).
        offset: absolute position of the first query (an int or scalar tensor), e.g. the
            ``cache_index`` during incremental decoding.

    Returns:
        Boolean tensor of shape ``(T, S)``.
    """
    key_length = query_length if key_length is None else key_length
    rows = ops.expand_dims(ops.arange(query_length, dtype="int32"), 1) + ops.cast(offset, "int32")
    cols = ops.expand_dims(ops.arange(key_length, dtype="int32"), 0)
    return ops.greater_equal(rows, cols)  # (T, S)


def padding_mask(ids, pad_id: int = 0):
    """Validity mask of a batch of token ids: ``True`` where ``ids != pad_id``.

    Args:
        ids: integer tensor ``(B, S)``.
        pad_id: the padding id.

    Returns:
        Boolean tensor ``(B, S)``.
    """
    return ops.not_equal(ids, pad_id)


def merge_masks(*masks):
    """Logical AND of masks that broadcast against each other; ``None`` entries are skipped.

    Args:
        *masks: boolean tensors (or ``None``), broadcastable to one shape.

    Returns:
        The combined boolean mask, or ``None`` when every mask is ``None``.
    """
    result = None
    for mask in masks:
        if mask is None:
            continue
        mask = ops.cast(mask, "bool")
        result = mask if result is None else ops.logical_and(result, mask)
    return result
