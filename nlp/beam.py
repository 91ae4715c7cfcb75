"""Beam search with the KV cache (`beam_search`, also n-best lists) and without it
(`beam_search_uncached`, the reference). The algorithm and conventions: `nlp.decoding`."""

from __future__ import annotations

import functools

from keras import ops

from nlp.decode_steps import (
    NEG,
    _cached_loop,
    _caches,
    _cross_caches,
    _decode_step,
    _penalty,
    _prepare,
    _restrict,
    _start_tokens,
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


def _beam(model, source, beam_size, length_penalty, max_length, extra_length, return_scores,
          nbest, cached, convention="gnmt", renormalize=True, forced_bos_id=None):
    """Beam search (see `beam_search`); ``cached=False`` re-runs the decoder over each prefix."""
    _check_beam_size(beam_size)
    if convention not in ("gnmt", "transformers"):
        raise ValueError("`convention` must be 'gnmt' or 'transformers'. Received: "
                         f"convention={convention!r}")
    hf = convention == "transformers"
    source, batch, max_length, limit, first_width, memory, memory_mask = _prepare(
        model, source, max_length, extra_length
    )
    memory_mask = ops.repeat(memory_mask, beam_size, axis=0)  # (B·K, S)
    if cached:
        cross = tuple(ops.repeat(c, beam_size, axis=1)  # (2, B·K, H, S, D) per layer
                      for c in _cross_caches(model, memory))
        cache = _caches(model, batch * beam_size, first_width)  # (2, B·K, H, W, D) per layer
    else:
        memory = ops.repeat(memory, beam_size, axis=0)  # (B·K, S, d)
        cache = ()
    vocab = model.target_vocab_size
    eos = model.eos_id
    max_penalty = _penalty(limit, length_penalty, convention)  # (B,): the GNMT bound
    beam_limit = ops.repeat(limit, beam_size, axis=0)  # (B·K,)
    rows = ops.arange(batch, dtype="int32")[:, None] * beam_size  # (B, 1)
    # The finished hypothesis that must beat the bound (transformers: the K-th).
    decided = beam_size - 1 if nbest or hf else 0

    def pick(x, parent, axis=0):  # x (B·K, ...) on `axis`; parent (B, K') index in [0, K)
        return ops.take(x, ops.reshape(parent + rows, (-1,)), axis=axis)

    def cond(width, i, alive_seq, alive_logp, fin_seq, fin_score, is_open, *cache):
        return ops.logical_and(i < width, ops.any(is_open))

    def step(i, alive_seq, cache):
        """Logits ``(B·K, V)`` of the next token of every live hypothesis."""
        if cached:
            current = ops.slice(alive_seq, [0, 0, i], [batch, beam_size, 1])  # (B, K, 1)
            current = ops.reshape(current, (-1, 1))  # (B·K, 1)
            return _decode_step(model, current, i, cache, cross, memory_mask)
        prefix = ops.slice(alive_seq, [0, 0, 0], [batch, beam_size, i + 1])  # (B, K, i + 1)
        prefix = ops.reshape(prefix, (batch * beam_size, -1))
        return model.decode(prefix, memory, memory_mask)[:, -1], ()

    def body(i, alive_seq, alive_logp, fin_seq, fin_score, is_open, *cache):
        n = max_length + 1
        logits, cache = step(i, alive_seq, cache)
        logp = _restrict(model, logits, i, beam_limit,
                         log_softmax_first=hf or not renormalize,
                         forced_bos_id=forced_bos_id)  # (B·K, V)
        if renormalize:
            logp = ops.log_softmax(logp, axis=-1)
        cand = alive_logp[..., None] + ops.reshape(logp, (batch, beam_size, vocab))  # (B, K, V)
        flat = ops.reshape(cand, (batch, beam_size * vocab))

        # One top-k of 2K over all K·V extensions: each hypothesis has one eos extension, so
        # at most K of the 2K end in eos, and the 2K hold both the top K of all extensions and
        # the K best that do not end in eos (in the order of their scores).
        best, best_index = ops.top_k(flat, 2 * beam_size)  # (B, 2K)

        def extend(position):  # (B, K) positions in the 2K best
            score = ops.take_along_axis(best, position, axis=1)
            index = ops.take_along_axis(best_index, position, axis=1)
            parent, token = index // vocab, index % vocab
            seq = pick(ops.reshape(alive_seq, (batch * beam_size, n)), parent)
            seq = ops.reshape(seq, (batch, beam_size, n))
            seq = ops.slice_update(seq, [0, 0, i + 1], token[..., None])
            return score, parent, token, seq

        # Finished: eos extensions among the top K of all extensions.
        rank = ops.arange(2 * beam_size, dtype="int32")[None, :]  # (1, 2K)
        top, _, token, seq = extend(ops.tile(rank[:, :beam_size], (batch, 1)))
        is_new = (token == eos) & (top > NEG / 2)
        if hf:  # a sentence found done keeps its finished hypotheses
            is_new = is_new & is_open[:, None]
        new_score = ops.where(is_new, top / _penalty(i + 1, length_penalty, convention), NEG)
        all_score = ops.concatenate([fin_score, new_score], axis=1)  # (B, 2K)
        all_seq = ops.concatenate([fin_seq, seq], axis=1)  # (B, 2K, N + 1)
        fin_score, keep = ops.top_k(all_score, beam_size)
        fin_seq = ops.take_along_axis(all_seq, keep[..., None], axis=1)

        # Live: the K best extensions that do not end in eos: the first K non-eos positions.
        key = ops.where(best_index % vocab == eos, -2 * beam_size - rank, -rank)  # (B, 2K)
        alive_logp, parent, _, alive_seq = extend(ops.top_k(key, beam_size)[1])
        cache = tuple(pick(c, parent, axis=1) for c in cache)  # one gather per cache

        worst = fin_score[:, decided]
        if hf:  # transformers' early_stopping=False: the best live one at its current length
            best = alive_logp[:, 0] / _penalty(i + 1, length_penalty, convention)
            is_open = is_open & ((worst <= NEG / 2) | (best > worst))
        else:  # exact: log p only falls, so log p / lp(limit) bounds every live hypothesis
            is_open = worst < alive_logp[:, 0] / max_penalty
        return i + 1, alive_seq, alive_logp, fin_seq, fin_score, is_open, *cache

    first = ops.where(ops.arange(beam_size) == 0, 0.0, NEG)  # only beam 0 is live at the start
    state = (
        ops.convert_to_tensor(0, "int32"),
        _start_tokens(model, batch, max_length, beam_size),
        ops.tile(first[None, :], (batch, 1)),
        _start_tokens(model, batch, max_length, beam_size),
        ops.full((batch, beam_size), NEG, "float32"),
        ops.ones((batch,), "bool"),  # the sentences whose search goes on
        *cache,
    )
    if cached:
        state = _cached_loop(cond, body, state, len(cache), first_width, max_length)
    else:
        state = ops.while_loop(functools.partial(cond, max_length), body, state)
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
                forced_bos_id: int | None = None):
    """Beam search with a length penalty and the KV cache (see `nlp.decoding`).

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
            and stopping rule of transformers' ``generate`` (`nlp.decoding.DecodingSettings`).
        renormalize: normalize each step's log-probabilities over the ids that may be
            generated (`nlp.decoding.DecodingSettings`).
        forced_bos_id: the id every hypothesis starts with, at log-probability 0
            (`nlp.decoding.DecodingSettings`).

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
                 renormalize=renormalize, forced_bos_id=forced_bos_id)


def beam_search_uncached(model, source, beam_size: int = 4, length_penalty: float = 0.6,
                         max_length=None, extra_length: int = 50, return_scores: bool = False,
                         nbest: bool = False, convention: str = "gnmt", renormalize: bool = True,
                         forced_bos_id: int | None = None):
    """Beam search that re-runs the decoder over every hypothesis's whole prefix at each step.

    The reference that cached beam search must equal, and a baseline of
    ``benchmarks/nmt_decode.py``. Same arguments and result as ``beam_search``.
    """
    return _beam(model, source, beam_size, length_penalty, max_length, extra_length,
                 return_scores, nbest, cached=False, convention=convention,
                 renormalize=renormalize, forced_bos_id=forced_bos_id)
