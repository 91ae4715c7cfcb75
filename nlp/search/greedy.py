"""Greedy search with the KV cache (`greedy_search`) and without it
(`greedy_search_uncached`, the reference). Conventions: `nlp.search.decoding`."""

from __future__ import annotations

from keras import ops

from nlp.search.steps import (
    _restrict,
    cached_decoder_step,
    cross_attention_caches,
    empty_caches,
    finished_dropper,
    initial_tokens,
    length_normalizer,
    next_log_probs,
    prepare_source,
    run_cached_loop,
)

__all__ = ["greedy_search", "greedy_search_uncached"]


def greedy_search(model, source, max_length=None, extra_length: int = 50,
                  return_scores: bool = False, length_penalty: float = 0.0,
                  convention: str = "gnmt", renormalize: bool = True,
                  forced_bos_id: int | None = None, drop_finished: bool | None = None):
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
        convention: how the score is made (`nlp.search.decoding.DecodingSettings`): ``"gnmt"``, or
            ``"transformers"`` (log-probabilities over the whole vocabulary, length **
            ``length_penalty``).
        renormalize: the score's log-probabilities are normalized over the ids that may be
            generated (`nlp.search.decoding.DecodingSettings`).
        forced_bos_id: the id every translation starts with
        (`nlp.search.decoding.DecodingSettings`).
        drop_finished: decode only the sentences still open: a finished sentence's rows
            leave the caches (the same tokens; CTranslate2 does this). Default: on with the
            TensorFlow backend; off under XLA (its shapes are static).

    Returns:
        ``(B, N)`` int32 ids, ``N = max_length`` or ``S + extra_length`` (and the scores
        ``(B,)`` with ``return_scores``).
    """
    source, batch, max_length, limit, first_width, memory, memory_mask = prepare_source(
        model, source, max_length, extra_length
    )
    cross = cross_attention_caches(model, memory)
    caches = empty_caches(model, batch, first_width)
    drop_finished = finished_dropper(drop_finished)
    num_cross = len(cross)

    def cond(width, i, tokens, logp, finished, *rest):  # (drop_finished: R > 0)
        return ops.logical_and(i < width, ops.logical_not(ops.all(finished)))

    def step(i, tokens, logp, row_limit, row_mask, row_cross, caches):
        """One token of ``R`` sentences: their tokens, scores and updated caches."""
        current = ops.slice(tokens, [0, i], [ops.shape(tokens)[0], 1])  # (R, 1)
        logits, caches = cached_decoder_step(model, current, i, caches, row_cross, row_mask)
        # The argmax needs no log-softmax (one row's shift keeps its order).
        nxt = ops.cast(ops.argmax(_restrict(model, logits, i, row_limit, forced_bos_id),
                                  axis=-1), "int32")
        chosen = 0.0
        if return_scores:
            step_logp = next_log_probs(model, logits, i, row_limit, renormalize, forced_bos_id,
                                   convention)
            chosen = ops.take_along_axis(step_logp, nxt[:, None], axis=1)[:, 0]
        return nxt, chosen, caches

    def body(i, tokens, logp, finished, *caches):
        nxt, chosen, caches = step(i, tokens, logp, limit, memory_mask, cross, caches)
        if return_scores:
            logp = logp + ops.where(finished, 0.0, chosen)
        nxt = ops.where(finished, model.pad_id, nxt)
        tokens = ops.slice_update(tokens, [0, i + 1], nxt[:, None])
        return i + 1, tokens, logp, finished | (nxt == model.eos_id), *caches

    def drop_body(i, tokens, logp, finished, active, row_limit, row_mask, *state):
        """The open sentences ``active`` ``(R,)``: their tokens, scores, (all false) finished
        flags, limits, memory mask and cross caches; the whole batch's tokens and scores as
        the sentences left them; the caches."""
        row_cross, out, caches = (state[:num_cross], state[num_cross:num_cross + 2],
                                  state[num_cross + 2:])
        nxt, chosen, caches = step(i, tokens, logp, row_limit, row_mask, row_cross, caches)
        logp = logp + chosen
        tokens = ops.slice_update(tokens, [0, i + 1], nxt[:, None])
        done = nxt == model.eos_id

        def drop():  # finished sentences: their tokens written out, their rows dropped
            closed = ops.cast(ops.nonzero(done)[0], "int32")
            still = ops.cast(ops.nonzero(ops.logical_not(done))[0], "int32")
            at = ops.take(active, closed)[:, None]
            written = (ops.scatter_update(out[0], at, ops.take(tokens, closed, axis=0)),
                       ops.scatter_update(out[1], at, ops.take(logp, closed)))
            return (ops.take(tokens, still, axis=0), ops.take(logp, still),
                    ops.take(done, still), ops.take(active, still), ops.take(row_limit, still),
                    ops.take(row_mask, still, axis=0),
                    *(ops.take(c, still, axis=1) for c in row_cross), *written,
                    *(ops.take(c, still, axis=1) for c in caches))

        def same():
            return (tokens, logp, done, active, row_limit, row_mask, *row_cross, *out, *caches)

        return i + 1, *ops.cond(ops.any(done), drop, same)

    start = (ops.convert_to_tensor(0, "int32"), initial_tokens(model, batch, max_length),
             ops.zeros((batch,), "float32"), ops.zeros((batch,), "bool"))
    if drop_finished:
        state = (*start, ops.arange(batch, dtype="int32"), limit, memory_mask, *cross,
                 *start[1:3], *caches)
        # The open sentences' tensors shrink (rows on axis 0, the caches' on axis 1).
        shrinking = {k: 0 for k in range(1, 7)}
        shrinking.update({k: 1 for k in range(7, 7 + num_cross)})
        shrinking.update({k: 1 for k in range(9 + num_cross, len(state))})
        state = run_cached_loop(cond, drop_body, state, len(caches), first_width, max_length,
                             shrinking)
        active, out = state[4], state[7 + num_cross:9 + num_cross]
        tokens, logp = (ops.scatter_update(o, active[:, None], w)  # the undecided
                        for o, w in zip(out, state[1:3]))
    else:
        state = run_cached_loop(cond, body, (*start, *caches), len(caches), first_width,
                             max_length)
        tokens, logp = state[1:3]
    tokens = tokens[:, 1:]
    if return_scores:
        length = ops.sum(ops.cast(ops.not_equal(tokens, model.pad_id), "int32"), axis=1)
        return tokens, logp / length_normalizer(length, length_penalty, convention)
    return tokens


def greedy_search_uncached(model, source, max_length=None, extra_length: int = 50,
                           forced_bos_id: int | None = None):
    """Greedy decoding that re-runs the decoder over the whole prefix at every step.

    The usual tutorial way; kept as the reference that cached decoding must equal, and as the
    baseline of ``benchmarks/cases/nmt.py``. Same arguments and result as ``greedy_search``.
    """
    source, batch, max_length, limit, _, memory, memory_mask = prepare_source(
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

    state = (ops.convert_to_tensor(0, "int32"), initial_tokens(model, batch, max_length),
             ops.zeros((batch,), "bool"))
    _, tokens, _ = ops.while_loop(cond, body, state)
    return tokens[:, 1:]
