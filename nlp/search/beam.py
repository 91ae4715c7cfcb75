"""Beam search with the KV cache (`beam_search`, also n-best lists) and without it
(`beam_search_uncached`, the reference). The algorithm and conventions: `nlp.search.decoding`."""

from __future__ import annotations

import functools

from keras import ops

from nlp.search.steps import (
    NEG,
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

__all__ = ["beam_search", "beam_search_uncached"]


def _check_beam_size(beam_size) -> None:
    if isinstance(beam_size, bool) or not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"`beam_size` must be an integer >= 1. Received: beam_size={beam_size!r}")


def _ranked(alive_seq, alive_logp, fin_seq, fin_score, max_penalty):
    """Every sentence's ``K`` hypotheses, best first: the finished ones by score, then live ones
    (by ``log p / lp(limit)``, where the search ran out of steps); ``NEG`` scores a slot that
    holds no hypothesis. Returns ids ``(B, K, N + 1)`` (with the leading bos) and scores."""
    beam_size = ops.shape(fin_score)[1]
    finished = ops.sum(ops.cast(fin_score > NEG / 2, "int32"), axis=1, keepdims=True)  # (B, 1)
    slot = ops.arange(beam_size, dtype="int32")[None, :]  # (1, K)
    index = ops.where(slot < finished, slot, beam_size + slot - finished)  # into [fin, alive]
    alive_score = ops.where(alive_logp > NEG / 2, alive_logp / max_penalty[:, None], NEG)
    seq = ops.take_along_axis(ops.concatenate([fin_seq, alive_seq], axis=1), index[..., None],
                              axis=1)
    score = ops.take_along_axis(ops.concatenate([fin_score, alive_score], axis=1), index, axis=1)
    return seq, score


def _best_extensions(alive_logp, logp, beam_size):
    """The ``2K`` best of all ``K·V`` extensions ``alive_logp[b, k] + logp[b·K + k, v]``, best
    first, ties by hypothesis then id (the order of one top-k over the ``K·V``): the ``2K``
    best of each hypothesis's ``V``, then the ``2K`` best of those ``K·2K``.

    Each hypothesis has one eos extension, so at most ``K`` of the ``2K`` end in eos: they
    hold both the top ``K`` of all extensions and the ``K`` best that do not end in eos.

    Args:
        alive_logp: ``(B, K)`` the live hypotheses' log-probabilities.
        logp: ``(B·K, V)`` their next tokens' log-probabilities.
        beam_size: ``K``.

    Returns:
        Scores, parents (in ``[0, K)``) and tokens, each ``(B, 2K)``.
    """
    batch = ops.shape(alive_logp)[0]
    per_row = min(2 * beam_size, ops.shape(logp)[-1])
    row_best, row_token = ops.top_k(logp, per_row)  # (B·K, 2K), each row best first
    cand = alive_logp[..., None] + ops.reshape(row_best, (batch, beam_size, per_row))
    best, index = ops.top_k(ops.reshape(cand, (batch, beam_size * per_row)), 2 * beam_size)
    token = ops.take_along_axis(ops.reshape(row_token, (batch, beam_size * per_row)), index,
                                axis=1)
    return best, index // per_row, token


def _beam(model, source, beam_size, length_penalty, max_length, extra_length, return_scores,
          nbest, cached, convention="gnmt", renormalize=True, forced_bos_id=None,
          drop_finished=False):
    """Beam search (see `beam_search`); ``cached=False`` re-runs the decoder over each prefix.

    With ``drop_finished`` (cached only) the decoder runs on the open sentences alone: the
    search's own state stays ``(B, ...)`` (each step gathers the open rows and scatters them
    back), while the caches, memory mask and limits hold the open sentences' rows only; the
    step that closes sentences drops theirs, in the gather that reorders the beams.
    """
    _check_beam_size(beam_size)
    if convention not in ("gnmt", "transformers"):
        raise ValueError("`convention` must be 'gnmt' or 'transformers'. Received: "
                         f"convention={convention!r}")
    hf = convention == "transformers"
    drop_finished = drop_finished and cached
    source, batch, max_length, limit, first_width, memory, memory_mask = prepare_source(
        model, source, max_length, extra_length
    )
    memory_mask = ops.repeat(memory_mask, beam_size, axis=0)  # (B·K, S)
    if cached:
        cross = tuple(ops.repeat(c, beam_size, axis=1)  # (2, B·K, H, S, D) per layer
                      for c in cross_attention_caches(model, memory))
        cache = empty_caches(model, batch * beam_size, first_width)  # (2, B·K, H, W, D) per layer
    else:
        memory = ops.repeat(memory, beam_size, axis=0)  # (B·K, S, d)
        cross, cache = (), ()
    eos = model.eos_id
    n = max_length + 1
    max_penalty = length_normalizer(limit, length_penalty, convention)  # (B,): the GNMT bound
    beam_limit = ops.repeat(limit, beam_size, axis=0)  # (B·K,): each row's limit
    # The finished hypothesis that must beat the bound (transformers: the K-th).
    decided = beam_size - 1 if nbest or hf else 0
    beams = ops.arange(beam_size, dtype="int32")[None, :]  # (1, K)

    def pick(x, parent, axis=0):  # x (R·K, ...) on `axis`; parent (R, K') index in [0, K)
        rows = ops.arange(ops.shape(parent)[0], dtype="int32")[:, None] * beam_size
        return ops.take(x, ops.reshape(parent + rows, (-1,)), axis=axis)

    def cond(width, i, alive_seq, alive_logp, fin_seq, fin_score, is_open, *rest):
        return ops.logical_and(i < width, ops.any(is_open))  # (drop_finished: R > 0)

    def step(i, alive_seq, rows, cache):
        """Logits ``(R·K, V)`` of the next token of every live hypothesis of ``R`` sentences."""
        _, row_mask, row_cross = rows
        if cached:
            current = ops.reshape(alive_seq[:, :, i], (-1, 1))  # (R·K, 1)
            return cached_decoder_step(model, current, i, cache, row_cross, row_mask)
        prefix = ops.slice(alive_seq, [0, 0, 0], [batch, beam_size, i + 1])  # (B, K, i + 1)
        prefix = ops.reshape(prefix, (batch * beam_size, -1))
        return model.decode(prefix, memory, row_mask)[:, -1], ()

    def search_step(i, alive_seq, alive_logp, fin_seq, fin_score, is_open, penalty, rows,
                    cache):
        """One step of ``R`` sentences' search; also returns each new live one's parent."""
        logits, cache = step(i, alive_seq, rows, cache)
        logp = next_log_probs(model, logits, i, rows[0], renormalize, forced_bos_id,
                          convention)  # (R·K, V)
        best, best_parent, best_token = _best_extensions(alive_logp, logp, beam_size)

        def extend(position):  # (R, K) positions in the 2K best
            score = ops.take_along_axis(best, position, axis=1)
            parent = ops.take_along_axis(best_parent, position, axis=1)
            token = ops.take_along_axis(best_token, position, axis=1)
            seq = ops.reshape(pick(ops.reshape(alive_seq, (-1, n)), parent),
                              (-1, beam_size, n))
            seq = ops.slice_update(seq, [0, 0, i + 1], token[..., None])
            return score, parent, token, seq

        # Finished: eos extensions among the top K of all extensions.
        rank = ops.arange(2 * beam_size, dtype="int32")[None, :]  # (1, 2K)
        top, _, token, seq = extend(ops.zeros_like(best_token[:, :beam_size]) + beams)
        is_new = (token == eos) & (top > NEG / 2)
        if hf:  # a sentence found done keeps its finished hypotheses
            is_new = is_new & is_open[:, None]
        norm = length_normalizer(i + 1, length_penalty, convention)
        new_score = ops.where(is_new, top / norm, NEG)
        all_score = ops.concatenate([fin_score, new_score], axis=1)  # (R, 2K)
        all_seq = ops.concatenate([fin_seq, seq], axis=1)  # (R, 2K, N + 1)
        fin_score, keep = ops.top_k(all_score, beam_size)
        fin_seq = ops.take_along_axis(all_seq, keep[..., None], axis=1)

        # Live: the K best extensions that do not end in eos: the first K non-eos positions.
        key = ops.where(best_token == eos, -2 * beam_size - rank, -rank)  # (R, 2K)
        alive_logp, parent, _, alive_seq = extend(ops.top_k(key, beam_size)[1])

        worst = fin_score[:, decided]
        if hf:  # transformers' early_stopping=False: the best live one at its current length
            best = alive_logp[:, 0] / length_normalizer(i + 1, length_penalty, convention)
            is_open = is_open & ((worst <= NEG / 2) | (best > worst))
        else:  # exact: log p only falls, so log p / lp(limit) bounds every live hypothesis
            is_open = worst < alive_logp[:, 0] / penalty
        return (alive_seq, alive_logp, fin_seq, fin_score, is_open), parent, cache

    def body(i, *state):
        """Non-dropping: ``state`` is the search's 5 tensors then the caches."""
        work, cache = state[:5], state[5:]
        rows = (beam_limit, memory_mask, cross)
        work, parent, cache = search_step(i, *work, max_penalty, rows, cache)
        cache = tuple(pick(c, parent, axis=1) for c in cache)  # one gather per cache
        return i + 1, *work, *cache

    num_cross = len(cross)

    def drop_body(i, *state):
        """``state``: the open sentences' search (5 tensors of ``R`` rows), their ids
        ``active`` ``(R,)``, GNMT bounds, row limits, memory mask and cross caches; the whole
        batch's search as the sentences left it (4 tensors of ``B`` rows); the caches."""
        work, (active, penalty, row_limit, row_mask) = state[:5], state[5:9]
        row_cross, out, cache = (state[9:9 + num_cross], state[9 + num_cross:13 + num_cross],
                                 state[13 + num_cross:])
        work, parent, cache = search_step(i, *work, penalty, (row_limit, row_mask, row_cross),
                                          cache)
        is_open = work[4]
        still = ops.cast(ops.nonzero(is_open)[0], "int32")  # (R',) of [0, R)
        # The caches' rows: the kept sentences' new live hypotheses (reorder and drop at once).
        index = ops.reshape(still[:, None] * beam_size + ops.take(parent, still, axis=0), (-1,))
        cache = tuple(ops.take(c, index, axis=1) for c in cache)

        def drop():  # decided sentences: their search written out, their rows dropped
            closed = ops.cast(ops.nonzero(ops.logical_not(is_open))[0], "int32")
            at = ops.take(active, closed)[:, None]
            written = tuple(ops.scatter_update(o, at, ops.take(w, closed, axis=0))
                            for o, w in zip(out, work))
            kept = ops.reshape(still[:, None] * beam_size + beams, (-1,))  # (R'·K,)
            return (*(ops.take(w, still, axis=0) for w in work), ops.take(active, still),
                    ops.take(penalty, still), ops.take(row_limit, kept),
                    ops.take(row_mask, kept, axis=0),
                    *(ops.take(c, kept, axis=1) for c in row_cross), *written)

        def same():
            return (*work, active, penalty, row_limit, row_mask, *row_cross, *out)

        state = ops.cond(ops.shape(still)[0] < ops.shape(active)[0], drop, same)
        return i + 1, *state, *cache

    first = ops.where(ops.arange(beam_size) == 0, 0.0, NEG)  # only beam 0 is live at the start
    search = (
        initial_tokens(model, batch, max_length, beam_size),
        ops.tile(first[None, :], (batch, 1)),
        initial_tokens(model, batch, max_length, beam_size),
        ops.full((batch, beam_size), NEG, "float32"),
        ops.ones((batch,), "bool"),  # the sentences whose search goes on
    )
    i = ops.convert_to_tensor(0, "int32")
    if drop_finished:
        state = (i, *search, ops.arange(batch, dtype="int32"), max_penalty, beam_limit,
                 memory_mask, *cross, *search[:4], *cache)
        # The open sentences' tensors shrink (rows on axis 0, the caches' on axis 1).
        shrinking = {k: 0 for k in range(1, 10)}
        shrinking.update({k: 1 for k in range(10, 10 + num_cross)})
        shrinking.update({k: 1 for k in range(14 + num_cross, len(state))})
        state = run_cached_loop(cond, drop_body, state, len(cache), first_width, max_length,
                             shrinking)
        work, active = state[1:5], state[6]
        out = state[10 + num_cross:14 + num_cross]
        state = (state[0], *(ops.scatter_update(o, active[:, None], w)  # the undecided
                             for o, w in zip(out, work)))
    elif cached:
        state = run_cached_loop(cond, body, (i, *search, *cache), len(cache), first_width,
                             max_length)
    else:
        state = ops.while_loop(functools.partial(cond, max_length), body, (i, *search))
    seq, score = _ranked(*state[1:5], max_penalty)
    seq = seq[..., 1:]
    if nbest:
        return seq, score
    if return_scores:
        return seq[:, 0], score[:, 0]
    return seq[:, 0]


def beam_search(model, source, beam_size: int = 4, length_penalty: float = 0.6,
                max_length=None, extra_length: int = 50, return_scores: bool = False,
                nbest: bool = False, convention: str = "gnmt", renormalize: bool = True,
                forced_bos_id: int | None = None, drop_finished: bool | None = None):
    """Beam search with a length penalty and the KV cache (see `nlp.search.decoding`).

    Args:
        model: a ``Seq2SeqTransformer``.
        source: ``(B, S)`` int ids.
        beam_size: ``K``.
        length_penalty: length-penalty exponent (0 = plain log-probability).
        max_length: most tokens to generate for every sentence; default: each sentence's
            source length (non-pad ids) + ``extra_length``.
        extra_length: see ``max_length``.
        return_scores: also return the best hypotheses' scores ``(B,)``.
        nbest: return all ``K`` hypotheses of every sentence and their scores. The search then
            runs until no live hypothesis can beat a sentence's ``K``-th finished one, so the
            list is final; its first entry is what ``nbest=False`` returns.
        convention: ``"gnmt"`` (this project's), or ``"transformers"``: the length penalty
            and stopping rule of transformers' ``generate``
            (`nlp.search.decoding.DecodingSettings`).
        renormalize: normalize each step's log-probabilities over the ids that may be
            generated (`nlp.search.decoding.DecodingSettings`).
        forced_bos_id: the id every hypothesis starts with, at log-probability 0
            (`nlp.search.decoding.DecodingSettings`).
        drop_finished: decode only the sentences still open: a sentence's rows leave the
            caches at the step that decides it (the same tokens; CTranslate2 does this).
            Default: on with the TensorFlow backend; off under XLA (its shapes are static).

    Returns:
        ``(B, N)`` int32 ids (``N = max_length`` or ``S + extra_length``) of the best
        hypothesis per sentence (and the scores ``(B,)`` with ``return_scores``). With
        ``nbest``: ids ``(B, K, N)`` and float32 scores ``(B, K)``, best first: finished
        hypotheses by score (``log p / lp(length)``), then, where fewer than ``K`` finished,
        live ones scored ``log p / lp(limit)``; ``-1e9`` scores a slot with no hypothesis
        (a vocabulary too small to fill the beam).
    """
    return _beam(model, source, beam_size, length_penalty, max_length, extra_length,
                 return_scores, nbest, cached=True, convention=convention,
                 renormalize=renormalize, forced_bos_id=forced_bos_id,
                 drop_finished=finished_dropper(drop_finished))


def beam_search_uncached(model, source, beam_size: int = 4, length_penalty: float = 0.6,
                         max_length=None, extra_length: int = 50, return_scores: bool = False,
                         nbest: bool = False, convention: str = "gnmt", renormalize: bool = True,
                         forced_bos_id: int | None = None):
    """Beam search that re-runs the decoder over every hypothesis's whole prefix at each step.

    The reference that cached beam search must equal, and a baseline of
    ``experiments/nmt_decode.py``. Same arguments and result as ``beam_search``.
    """
    return _beam(model, source, beam_size, length_penalty, max_length, extra_length,
                 return_scores, nbest, cached=False, convention=convention,
                 renormalize=renormalize, forced_bos_id=forced_bos_id)
