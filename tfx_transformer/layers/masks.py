"""Attention masks. Convention everywhere: boolean, ``True`` = may attend / valid."""

from __future__ import annotations

from keras import ops

__all__ = [
    "causal_mask", "padding_mask", "merge_masks", "key_padding_mask", "to_attention_mask",
    "check_mask_rank",
]


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


def key_padding_mask(valid):
    """Attention mask over keys from a per-position validity mask.

    Args:
        valid: boolean ``(B, S)``, ``True`` = valid key (token or pixel); or ``None``.

    Returns:
        Boolean ``(B, 1, S)``, broadcastable to ``(B, T, S)`` attention masks; ``None`` when
        ``valid`` is ``None``.
    """
    return None if valid is None else ops.cast(valid, "bool")[:, None, :]  # (B, 1, S)


def to_attention_mask(mask, name: str = "mask"):
    """Turns a per-key or a per-query-and-key validity mask into an attention mask.

    Args:
        mask: boolean ``(B, S)`` key validity, ``(B, T, S)`` per query position, or ``None``.
        name: the argument's name, for the error message.

    Returns:
        Boolean ``(B, 1, S)`` (from ``(B, S)``, see ``key_padding_mask``) or ``(B, T, S)``
        unchanged; ``None`` when ``mask`` is ``None``.

    Raises:
        ValueError: if ``mask`` has another rank.
    """
    if mask is None:
        return None
    if len(mask.shape) == 2:
        return key_padding_mask(mask)
    if len(mask.shape) == 3:
        return ops.cast(mask, "bool")
    raise ValueError(
        f"`{name}` must have shape (B, S) or (B, T, S). Received: {name}.shape={tuple(mask.shape)}"
    )


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


def check_mask_rank(mask, name: str = "mask", max_rank: int = 4) -> None:
    """Raises ``ValueError`` unless ``mask`` is ``None`` or has rank 2 to ``max_rank``.

    Args:
        mask: an attention mask ``(T, S)``, ``(B, T, S)`` or ``(B, H, T, S)``, or ``None``.
        name: the argument's name, for the error message.
        max_rank: the highest rank accepted.
    """
    if mask is not None and (len(mask.shape) < 2 or len(mask.shape) > max_rank):
        raise ValueError(
            f"`{name}` must have rank 2 to {max_rank} (shape (T, S), (B, T, S) or "
            f"(B, H, T, S)). Received: {name}.shape={tuple(mask.shape)}"
        )
