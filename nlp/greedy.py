"""Greedy search with the KV cache (`greedy_search`) and without it
(`greedy_search_uncached`, the reference). Conventions: `nlp.decoding`."""

from __future__ import annotations

from keras import ops

from nlp.decode_steps import (
    _cached_loop,
    _caches,
    _cross_caches,
    _decode_step,
    _penalty,
    _prepare,
    _restrict,
    _start_tokens,
)

__all__ = ["greedy_search", "greedy_search_uncached"]


def greedy_search(model, source, max_length=None, extra_length: int = 50,
                  return_scores: bool = False, length_penalty: float = 0.0,
                  convention: str = "gnmt", renormalize: bool = True,
                  forced_bos_id: int | None = None):
    """Greedy decoding with the KV cache.

    Args:
        model: a ``Seq2SeqTransformer``.
        source: ``(B, S)`` int ids (pad 0, eos-terminated).
        max_length: most tokens to generate for every sentence; default: each sentence's
            source length (non-pad ids) + ``extra_length``.
        extra_length: see ``max_length``.
        return_scores: also return each translation's score ``(B,)``: its log-probability
            (of the tokens allowed at each step, as beam search scores them) divided by the
            GNMT length penalty.
        length_penalty: the exponent of that penalty (the search itself ignores it).
        convention: how the score is made (`nlp.decoding.DecodingSettings`): ``"gnmt"``, or
            ``"transformers"`` (log-probabilities over the whole vocabulary, length **
            ``length_penalty``).
        renormalize: the score's log-probabilities are normalized over the ids that may be
            generated (`nlp.decoding.DecodingSettings`).
        forced_bos_id: the id every translation starts with (`nlp.decoding.DecodingSettings`).

    Returns:
        ``(B, N)`` int32 ids, ``N = max_length`` or ``S + extra_length`` (and the scores
        ``(B,)`` with ``return_scores``).
    """
    source, batch, max_length, limit, first_width, memory, memory_mask = _prepare(
        model, source, max_length, extra_length
    )
    cross = _cross_caches(model, memory)
    caches = _caches(model, batch, first_width)

    def cond(width, i, tokens, logp, finished, *caches):
        return ops.logical_and(i < width, ops.logical_not(ops.all(finished)))

    def body(i, tokens, logp, finished, *caches):
        current = ops.slice(tokens, [0, i], [batch, 1])  # (B, 1)
        logits, caches = _decode_step(model, current, i, caches, cross, memory_mask)
        hf = convention == "transformers"
        logits = _restrict(model, logits, i, limit, log_softmax_first=hf or not renormalize,
                           forced_bos_id=forced_bos_id)
        nxt = ops.cast(ops.argmax(logits, axis=-1), "int32")
        if return_scores:
            step_logp = ops.log_softmax(logits, axis=-1) if renormalize else logits
            chosen = ops.take_along_axis(step_logp, nxt[:, None], axis=1)
            logp = logp + ops.where(finished, 0.0, chosen[:, 0])
        nxt = ops.where(finished, model.pad_id, nxt)
        tokens = ops.slice_update(tokens, [0, i + 1], nxt[:, None])
        return i + 1, tokens, logp, finished | (nxt == model.eos_id), *caches

    state = (ops.convert_to_tensor(0, "int32"), _start_tokens(model, batch, max_length),
             ops.zeros((batch,), "float32"), ops.zeros((batch,), "bool"), *caches)
    _, tokens, logp = _cached_loop(cond, body, state, len(caches), first_width, max_length)[:3]
    tokens = tokens[:, 1:]
    if return_scores:
        length = ops.sum(ops.cast(ops.not_equal(tokens, model.pad_id), "int32"), axis=1)
        return tokens, logp / _penalty(length, length_penalty, convention)
    return tokens


def greedy_search_uncached(model, source, max_length=None, extra_length: int = 50,
                           forced_bos_id: int | None = None):
    """Greedy decoding that re-runs the decoder over the whole prefix at every step.

    The usual tutorial way; kept as the reference that cached decoding must equal, and as the
    baseline of ``benchmarks/nmt.py``. Same arguments and result as ``greedy_search``.
    """
    source, batch, max_length, limit, _, memory, memory_mask = _prepare(
        model, source, max_length, extra_length
    )

    def cond(i, tokens, finished):
        return ops.logical_and(i < max_length, ops.logical_not(ops.all(finished)))

    def body(i, tokens, finished):
        prefix = ops.slice(tokens, [0, 0], [batch, i + 1])  # (B, i + 1)
        logits = model.decode(prefix, memory, memory_mask)[:, -1]
        logits = _restrict(model, logits, i, limit, forced_bos_id=forced_bos_id)
        nxt = ops.cast(ops.argmax(logits, axis=-1), "int32")
        nxt = ops.where(finished, model.pad_id, nxt)
        tokens = ops.slice_update(tokens, [0, i + 1], nxt[:, None])
        return i + 1, tokens, finished | (nxt == model.eos_id)

    state = (ops.convert_to_tensor(0, "int32"), _start_tokens(model, batch, max_length),
             ops.zeros((batch,), "bool"))
    _, tokens, _ = ops.while_loop(cond, body, state)
    return tokens[:, 1:]
