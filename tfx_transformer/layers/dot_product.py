"""Scaled dot-product attention: the one place attention weights are computed."""

from __future__ import annotations

import math

import keras
from keras import ops

from tfx_transformer.layers.masks import check_mask_rank

__all__ = ["multi_head_attention", "scaled_dot_product_attention"]

# Filled into masked logits. The logits are float32 whatever the compute dtype, so this is
# safe under float16/bfloat16 policies; it only has to dominate any real score.
_MASKED_LOGIT = -1e9


def _masked_softmax(scores, mask, zero_empty_rows: bool = True):
    """Softmax over the last axis in float32; rows with every key masked give zeros.

    Args:
        scores: logits ``(..., T, S)`` of any float dtype.
        mask: boolean, broadcastable to ``scores``, ``True`` = attend; or ``None``.
        zero_empty_rows: set the fully masked rows to zero here; without it they are uniform
            and the caller zeroes what it makes of them (``_empty_rows``).

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
    if not zero_empty_rows:
        return weights
    # A fully masked row would otherwise be uniform over the masked keys.
    return ops.where(_empty_rows(mask), 0.0, weights)


def _empty_rows(mask):
    """``(..., T, 1)``: ``True`` for the query rows of ``mask`` ``(..., T, S)`` with no key."""
    return ops.logical_not(ops.any(mask, axis=-1, keepdims=True))


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
    _check_ranks(q, k, v, mask, time_axis=2)
    return _attention(q, k, v, mask, dropout_rate, training, return_weights, seed)


def multi_head_attention(
    q,
    k,
    v,
    mask=None,
    dropout_rate: float = 0.0,
    training=None,
    return_weights: bool = False,
    seed=None,
):
    """``scaled_dot_product_attention`` on heads laid out ``(B, T, H, D)``, as projected.

    When neither the weights nor dropout are needed, under JAX and PyTorch the product is
    ``keras.ops.dot_product_attention`` (cuDNN or flash attention on a GPU, the TPU kernel
    on a TPU), with the same contracts: float16 scores in float32, zeros for a query whose
    keys are all masked. Under TensorFlow that op is the same einsums as the explicit
    product below and no faster (``benchmarks/cases/layers.py``), so TensorFlow runs the
    explicit one.

    Args:
        q: ``(B, T, H, D)``; k: ``(B, S, H, D)``; v: ``(B, S, H, Dv)``.
        mask: boolean, broadcastable to ``(B, H, T, S)``, ``True`` = may attend.
        dropout_rate, training, return_weights, seed: as in ``scaled_dot_product_attention``.

    Returns:
        ``(B, T, H, Dv)`` in the dtype of ``v``, and the weights ``(B, H, T, S)`` in the dtype
        of ``q`` if ``return_weights``.
    """
    _check_ranks(q, k, v, mask, time_axis=1)
    if mask is not None:
        mask = ops.cast(mask, "bool")
        while len(mask.shape) < 4:
            mask = ops.expand_dims(mask, 0)
    dropout = bool(training) and dropout_rate > 0.0
    if return_weights or dropout or keras.backend.backend() == "tensorflow":
        heads = lambda x: ops.transpose(x, (0, 2, 1, 3))  # noqa: E731  (B, T, H, D) <-> (B, H, T, D)
        result = _attention(heads(q), heads(k), heads(v), mask, dropout_rate, training,
                            return_weights, seed)
        if return_weights:
            return heads(result[0]), result[1]
        return heads(result)
    dtype = v.dtype
    if keras.backend.standardize_dtype(q.dtype) == "float16":
        q, k, v = (ops.cast(x, "float32") for x in (q, k, v))
    out = ops.dot_product_attention(q, k, v, mask=mask, scale=1.0 / math.sqrt(q.shape[-1]))
    if mask is not None:  # a fully masked row is the mean of the values there
        out = ops.where(ops.transpose(_empty_rows(mask), (0, 2, 1, 3)), 0.0, out)
    return ops.cast(out, dtype)


def _check_ranks(q, k, v, mask, time_axis: int):
    check_mask_rank(mask, "mask")
    if len(q.shape) != 4 or len(k.shape) != 4 or len(v.shape) != 4:
        layout = "(B, H, T, D)" if time_axis == 2 else "(B, T, H, D)"
        raise ValueError(
            f"`q`, `k` and `v` must have rank 4 {layout}. Received: "
            f"q.shape={tuple(q.shape)}, k.shape={tuple(k.shape)}, v.shape={tuple(v.shape)}"
        )
    s_k, s_v = k.shape[time_axis], v.shape[time_axis]
    if s_k is not None and s_v is not None and s_k != s_v:
        raise ValueError(
            "`k` and `v` must have the same length. Received: "
            f"k.shape={tuple(k.shape)} and v.shape={tuple(v.shape)}"
        )


def _attention(q, k, v, mask, dropout_rate, training, return_weights, seed):
    """The explicit product on ``(B, H, T, D)`` heads: float32 softmax, dropout on the weights.

    Without the weights, a fully masked row is zeroed in the output ``(B, H, T, Dv)``, which
    is smaller than the weights ``(B, H, T, S)`` whenever ``S > Dv``.
    """
    weights_dtype = q.dtype
    if keras.backend.standardize_dtype(q.dtype) == "float16":
        q, k = ops.cast(q, "float32"), ops.cast(k, "float32")
    scale = ops.cast(1.0 / math.sqrt(q.shape[-1]), q.dtype)
    scores = ops.einsum("bhtd,bhsd->bhts", q * scale, ops.cast(k, q.dtype))  # (B, H, T, S)
    weights = _masked_softmax(scores, mask, zero_empty_rows=return_weights)  # float32
    dropped = ops.cast(weights, v.dtype)
    if training and dropout_rate > 0.0:
        dropped = keras.random.dropout(dropped, dropout_rate, seed=seed)
    out = ops.einsum("bhts,bhsd->bhtd", dropped, v)  # (B, H, T, Dv)
    if return_weights:
        return out, ops.cast(weights, weights_dtype)
    if mask is not None and scores.shape[-1] != 1:
        out = ops.where(_empty_rows(mask), ops.zeros((), out.dtype), out)
    return out
