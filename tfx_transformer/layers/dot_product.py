"""Scaled dot-product attention: the one place attention weights are computed."""

from __future__ import annotations

import math

import keras
from keras import ops

from tfx_transformer.layers.masks import check_mask_rank

__all__ = ["scaled_dot_product_attention"]

# Filled into masked logits. The logits are float32 whatever the compute dtype, so this is
# safe under float16/bfloat16 policies; it only has to dominate any real score.
_MASKED_LOGIT = -1e9


def _masked_softmax(scores, mask):
    """Softmax over the last axis in float32; rows with every key masked give zeros.

    Args:
        scores: logits ``(..., T, S)`` of any float dtype.
        mask: boolean, broadcastable to ``scores``, ``True`` = attend; or ``None``.

    Returns:
        float32 weights with the shape of ``scores`` broadcast with ``mask``.
    """
    scores = ops.cast(scores, "float32")
    if scores.shape[-1] == 1:  # a single key: weight 1 where it may be attended
        ones = ops.ones_like(scores)
        return ones if mask is None else ops.where(ops.cast(mask, "bool"), ones, 0.0)
    if mask is None:
        return ops.softmax(scores, axis=-1)
    mask = ops.cast(mask, "bool")
    scores = ops.where(mask, scores, _MASKED_LOGIT)
    weights = ops.softmax(scores, axis=-1)
    # A fully masked row would otherwise be uniform over the masked keys.
    any_valid = ops.any(mask, axis=-1, keepdims=True)
    return ops.where(any_valid, weights, 0.0)


def scaled_dot_product_attention(
    q,
    k,
    v,
    mask=None,
    dropout_rate: float = 0.0,
    training=None,
    return_weights: bool = False,
    seed=None,
):
    """``softmax(q·kᵀ/√d_k, masked) · v``.

    The scores and the softmax are computed in float32 when the inputs are float16 (whose
    range ends at 65504, below real attention logits); bfloat16 has float32's range and
    keeps its own dtype for the product.

    Args:
        q: queries ``(B, H, T, D)``.
        k: keys ``(B, H, S, D)``.
        v: values ``(B, H, S, Dv)``.
        mask: boolean, broadcastable to ``(B, H, T, S)``, ``True`` = may attend. A query row
            whose keys are all masked returns zeros.
        dropout_rate: dropout on the attention weights, applied only when ``training``.
        training: Python bool or ``None`` (no dropout).
        return_weights: also return the attention weights ``(B, H, T, S)``.
        seed: optional ``keras.random.SeedGenerator`` (or int) for the dropout.

    Returns:
        ``(B, H, T, Dv)`` in the dtype of ``v``, and the weights ``(B, H, T, S)`` in the dtype
        of ``q`` (before dropout) if ``return_weights``.
    """
    if len(q.shape) != 4 or len(k.shape) != 4 or len(v.shape) != 4:
        raise ValueError(
            "`q`, `k` and `v` must have rank 4 (B, H, T, D). Received: "
            f"q.shape={tuple(q.shape)}, k.shape={tuple(k.shape)}, v.shape={tuple(v.shape)}"
        )
    if k.shape[2] is not None and v.shape[2] is not None and k.shape[2] != v.shape[2]:
        raise ValueError(
            "`k` and `v` must have the same length. Received: "
            f"k.shape={tuple(k.shape)} and v.shape={tuple(v.shape)}"
        )
    check_mask_rank(mask, "mask")
    weights_dtype = q.dtype
    if keras.backend.standardize_dtype(q.dtype) == "float16":
        q, k = ops.cast(q, "float32"), ops.cast(k, "float32")
    scale = ops.cast(1.0 / math.sqrt(q.shape[-1]), q.dtype)
    scores = ops.einsum("bhtd,bhsd->bhts", q * scale, ops.cast(k, q.dtype))  # (B, H, T, S)
    weights = _masked_softmax(scores, mask)  # float32
    dropped = ops.cast(weights, v.dtype)
    if training and dropout_rate > 0.0:
        dropped = keras.random.dropout(dropped, dropout_rate, seed=seed)
    out = ops.einsum("bhts,bhsd->bhtd", dropped, v)  # (B, H, T, Dv)
    if return_weights:
        return out, ops.cast(weights, weights_dtype)
    return out
