"""Greedy and beam-search decoding with the KV cache, each one compiled loop (no Python loop
per token).

Both searches run in ``keras.ops.while_loop``; ``compile_search`` wraps one in
``tf.function`` (TensorFlow backend) or ``jax.jit`` (JAX backend). ``DecodingSettings`` holds
what a translator decodes with, and ``search`` runs the search those settings ask for.

Conventions shared by both:

* ``pad``, ``bos`` and ``unk`` are never generated;
* each sentence gets at most its own limit of tokens, eos included: its source length (the
  non-pad ids, eos included) + ``extra_length``, or ``max_length`` when one is given; its last
  step may only be eos. So a sentence decodes the same alone and in a batch with longer ones
  (padding is masked and changes no limit);
* the output is ``(B, N)`` ids without the leading bos, eos then pad after the end, where
  ``N = S + extra_length`` (``S`` the padded source width) or ``max_length``;
* the loop ends as soon as every sentence of the batch is decided;
* the self-attention caches (one tensor per decoder layer, so no step copies them into one
  and back) start ``min(N, S + S // 4 + 8)`` positions wide and are padded to ``N`` only when
  a batch decodes past that. Every step rewrites the caches (beam search reorders them), so
  caches no wider than the translations are most of the speed; the tokens are the same, since
  positions not yet decoded are masked.

Beam search keeps ``K = beam_size`` live hypotheses. Every step scores all ``K·V`` extensions
by total log-probability; extensions ending in eos that rank in the top ``K`` become finished
hypotheses, scored with the GNMT length penalty ``log p / ((5 + n) / 6) ** length_penalty``
(``n`` tokens, eos included); the ``K`` best extensions not ending in eos stay live. The search
stops for a sentence once no live hypothesis can beat its best finished one (``log p`` only
falls, so ``log p / lp(limit)`` bounds it), or, for an n-best list (``nbest=True``), its
``K``-th best one. With ``beam_size=1`` and ``length_penalty=0`` this is exactly greedy
search; with a beam at least as wide as the number of hypotheses it is exact.
"""

from __future__ import annotations

import dataclasses
import functools

import keras
from keras import ops

from nlp.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from nlp.validation import check_int, check_number

__all__ = [
    "DecodingSettings",
    "beam_search",
    "beam_search_uncached",
    "compile_search",
    "greedy_search",
    "greedy_search_uncached",
    "search",
]

NEG = -1e9  # "minus infinity" that keeps arithmetic finite; also the score of no hypothesis
FIRST_WIDTH_EXTRA = 8  # the cache starts min(N, S + S // 4 + FIRST_WIDTH_EXTRA) wide


@dataclasses.dataclass(frozen=True)
class DecodingSettings:
    """How a translator decodes (validated on construction).

    Attributes:
        beam_size: beam width ``K``; 1 means greedy search.
        length_penalty: GNMT exponent: score = ``log p / ((5 + len) / 6) ** length_penalty``
            (0 = plain log-probability).
        extra_length: decode at most source length + this many tokens.
    """

    beam_size: int = 4
    length_penalty: float = 0.6
    extra_length: int = 50

    def __post_init__(self):
        owner = type(self).__name__
        check_int(owner, "beam_size", self.beam_size, 1)
        check_number(owner, "length_penalty", self.length_penalty, 0.0)
        check_int(owner, "extra_length", self.extra_length, 0)

    def greedy(self) -> DecodingSettings:
        """The same settings with ``beam_size=1``."""
        return dataclasses.replace(self, beam_size=1)


def _penalty(length, length_penalty: float):
    """The GNMT length penalty ``((5 + length) / 6) ** length_penalty``."""
    return ops.power((5.0 + ops.cast(length, "float32")) / 6.0, length_penalty)


def _restrict(logits, step, limit):
    """Forbids pad/bos/unk everywhere, and all but eos from a row's last step on.

    ``logits`` ``(R, V)``; ``limit`` ``(R,)``: each row's most tokens, eos included.
    """
    vocab = ops.arange(ops.shape(logits)[-1])
    banned = (vocab == PAD_ID) | (vocab == BOS_ID) | (vocab == UNK_ID)
    last = ops.greater_equal(step, limit - 1)[:, None]  # (R, 1)
    banned = banned | (last & (vocab != EOS_ID))
    return ops.where(banned, NEG, ops.cast(logits, "float32"))


def _minimum(a, b):
    """``min(a, b)`` of two ints, either of which may be a scalar tensor."""
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    return ops.minimum(a, b)


def _prepare(model, source, max_length, extra_length):
    """The source as int32, the batch size, the buffer length ``N``, each sentence's limit
    ``(B,)`` (its own length + ``extra_length``, or ``max_length``), the first cache width
    (see the module docstring) and the encoder output."""
    source = ops.cast(source, "int32")
    batch, width = ops.shape(source)[0], ops.shape(source)[1]
    if max_length is None:
        lengths = ops.sum(ops.cast(ops.not_equal(source, PAD_ID), "int32"), axis=1)
        limit = lengths + extra_length
        max_length = width + extra_length
    else:
        limit = ops.full((batch,), max_length, "int32")
    first_width = _minimum(max_length, width + width // 4 + FIRST_WIDTH_EXTRA)
    memory, memory_mask = model.encode(source)
    return source, batch, max_length, limit, first_width, memory, memory_mask


def _start_tokens(batch, max_length, beam_size=None):
    """bos then zeros: ``(B, max_length + 1)``, or ``(B, K, max_length + 1)`` for a beam."""
    if beam_size is None:
        shape = (batch, max_length + 1)
    else:
        shape = (batch, beam_size, max_length + 1)
    tokens = ops.zeros(shape, "int32")
    bos = ops.full((*shape[:-1], 1), BOS_ID, "int32")
    return ops.concatenate([bos, tokens[..., 1:]], axis=-1)


def _caches(model, batch, width):
    """Empty self-attention caches, one ``(R, 2, width, H, D)`` per decoder layer."""
    return tuple(layer.empty_cache(batch, width) for layer in model.decoder.layers)


def _cross_caches(model, memory):
    """Cross-attention keys/values of ``memory``, one ``(R, 2, S, H, D)`` per decoder layer."""
    return tuple(layer.compute_cross_attention_cache(memory) for layer in model.decoder.layers)


def _decode_step(model, tokens, index, caches, cross, memory_mask):
    """``model.decode_step`` with one cache per decoder layer (`_caches`, `_cross_caches`):
    the same layers, in the same order, without stacking the caches at every step.

    Returns:
        Logits ``(R, V)`` (float32) and the updated caches.
    """
    x = model.embed_target(tokens, start_index=index)
    updated = []
    for layer, cache, cross_cache in zip(model.decoder.layers, caches, cross):
        out = layer(x, None, memory_mask=memory_mask, use_causal_mask=True, cache=cache,
                    cache_index=index, cross_attention_cache=cross_cache)
        x = out.output
        updated.append(out.cache)
    return model.project(model.decoder.normalize(x))[:, 0], tuple(updated)


def _cached_loop(cond, body, state, num_caches, first_width, max_length):
    """``ops.while_loop`` whose state ends with ``num_caches`` self-attention caches
    ``(R, 2, W, H, D)``.

    Runs while ``cond(W, *state)`` with the caches ``first_width`` wide, then pads them with
    zeros to ``max_length`` and runs on while ``cond(max_length, *state)`` (no step at all
    when the batch was decided within ``first_width``).
    """
    state = ops.while_loop(functools.partial(cond, first_width), body, state)
    rest, caches = state[:-num_caches], state[-num_caches:]
    padding = [[0, 0], [0, 0], [0, max_length - first_width], [0, 0], [0, 0]]
    caches = tuple(ops.pad(cache, padding) for cache in caches)
    return ops.while_loop(functools.partial(cond, max_length), body, (*rest, *caches))


def greedy_search(model, source, max_length=None, extra_length: int = 50,
                  return_scores: bool = False, length_penalty: float = 0.0):
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
        logits = _restrict(logits, i, limit)
        nxt = ops.cast(ops.argmax(logits, axis=-1), "int32")
        if return_scores:
            chosen = ops.take_along_axis(ops.log_softmax(logits, axis=-1), nxt[:, None], axis=1)
            logp = logp + ops.where(finished, 0.0, chosen[:, 0])
        nxt = ops.where(finished, PAD_ID, nxt)
        tokens = ops.slice_update(tokens, [0, i + 1], nxt[:, None])
        return i + 1, tokens, logp, finished | (nxt == EOS_ID), *caches

    state = (ops.convert_to_tensor(0, "int32"), _start_tokens(batch, max_length),
             ops.zeros((batch,), "float32"), ops.zeros((batch,), "bool"), *caches)
    _, tokens, logp = _cached_loop(cond, body, state, len(caches), first_width, max_length)[:3]
    tokens = tokens[:, 1:]
    if return_scores:
        length = ops.sum(ops.cast(ops.not_equal(tokens, PAD_ID), "int32"), axis=1)
        return tokens, logp / _penalty(length, length_penalty)
    return tokens


def greedy_search_uncached(model, source, max_length=None, extra_length: int = 50):
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
        nxt = ops.cast(ops.argmax(_restrict(logits, i, limit), axis=-1), "int32")
        nxt = ops.where(finished, PAD_ID, nxt)
        tokens = ops.slice_update(tokens, [0, i + 1], nxt[:, None])
        return i + 1, tokens, finished | (nxt == EOS_ID)

    state = (ops.convert_to_tensor(0, "int32"), _start_tokens(batch, max_length),
             ops.zeros((batch,), "bool"))
    _, tokens, _ = ops.while_loop(cond, body, state)
    return tokens[:, 1:]


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
          nbest, cached):
    """Beam search (see `beam_search`); ``cached=False`` re-runs the decoder over each prefix."""
    _check_beam_size(beam_size)
    source, batch, max_length, limit, first_width, memory, memory_mask = _prepare(
        model, source, max_length, extra_length
    )
    memory_mask = ops.repeat(memory_mask, beam_size, axis=0)  # (B·K, S)
    if cached:
        cross = tuple(ops.repeat(c, beam_size, axis=0)  # (B·K, 2, S, H, D) per layer
                      for c in _cross_caches(model, memory))
        cache = _caches(model, batch * beam_size, first_width)  # (B·K, 2, W, H, D) per layer
    else:
        memory = ops.repeat(memory, beam_size, axis=0)  # (B·K, S, d)
        cache = ()
    vocab = model.vocab_size
    max_penalty = _penalty(limit, length_penalty)  # (B,): the bound of each sentence
    beam_limit = ops.repeat(limit, beam_size, axis=0)  # (B·K,)
    rows = ops.arange(batch, dtype="int32")[:, None] * beam_size  # (B, 1)
    decided = beam_size - 1 if nbest else 0  # the finished hypothesis that must beat the bound

    def pick(x, parent):  # x (B·K, ...); parent (B, K') beam index in [0, K)
        return ops.take(x, ops.reshape(parent + rows, (-1,)), axis=0)

    def cond(width, i, alive_seq, alive_logp, fin_seq, fin_score, *cache):
        bound = alive_logp[:, 0] / max_penalty
        done = fin_score[:, decided] >= bound
        return ops.logical_and(i < width, ops.logical_not(ops.all(done)))

    def step(i, alive_seq, cache):
        """Logits ``(B·K, V)`` of the next token of every live hypothesis."""
        if cached:
            current = ops.slice(alive_seq, [0, 0, i], [batch, beam_size, 1])  # (B, K, 1)
            current = ops.reshape(current, (-1, 1))  # (B·K, 1)
            return _decode_step(model, current, i, cache, cross, memory_mask)
        prefix = ops.slice(alive_seq, [0, 0, 0], [batch, beam_size, i + 1])  # (B, K, i + 1)
        prefix = ops.reshape(prefix, (batch * beam_size, -1))
        return model.decode(prefix, memory, memory_mask)[:, -1], ()

    def body(i, alive_seq, alive_logp, fin_seq, fin_score, *cache):
        n = max_length + 1
        logits, cache = step(i, alive_seq, cache)
        logp = ops.log_softmax(_restrict(logits, i, beam_limit), axis=-1)  # (B·K, V)
        cand = alive_logp[..., None] + ops.reshape(logp, (batch, beam_size, vocab))  # (B, K, V)
        flat = ops.reshape(cand, (batch, beam_size * vocab))

        def extend(score_flat):
            score, index = ops.top_k(score_flat, beam_size)  # (B, K)
            parent, token = index // vocab, index % vocab
            seq = pick(ops.reshape(alive_seq, (batch * beam_size, n)), parent)
            seq = ops.reshape(seq, (batch, beam_size, n))
            seq = ops.slice_update(seq, [0, 0, i + 1], token[..., None])
            return score, parent, token, seq

        # Finished: eos extensions among the top K of all extensions.
        top, _, token, seq = extend(flat)
        is_new = (token == EOS_ID) & (top > NEG / 2)
        new_score = ops.where(is_new, top / _penalty(i + 1, length_penalty), NEG)
        all_score = ops.concatenate([fin_score, new_score], axis=1)  # (B, 2K)
        all_seq = ops.concatenate([fin_seq, seq], axis=1)  # (B, 2K, N + 1)
        fin_score, keep = ops.top_k(all_score, beam_size)
        fin_seq = ops.take_along_axis(all_seq, keep[..., None], axis=1)

        # Live: the K best extensions that do not end in eos.
        eos_column = ops.arange(beam_size * vocab) % vocab == EOS_ID
        alive_logp, parent, _, alive_seq = extend(ops.where(eos_column, NEG, flat))
        cache = tuple(pick(c, parent) for c in cache)
        return i + 1, alive_seq, alive_logp, fin_seq, fin_score, *cache

    first = ops.where(ops.arange(beam_size) == 0, 0.0, NEG)  # only beam 0 is live at the start
    state = (
        ops.convert_to_tensor(0, "int32"),
        _start_tokens(batch, max_length, beam_size),
        ops.tile(first[None, :], (batch, 1)),
        _start_tokens(batch, max_length, beam_size),
        ops.full((batch, beam_size), NEG, "float32"),
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
                nbest: bool = False):
    """Beam search with the GNMT length penalty and the KV cache (see the module docstring).

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

    Returns:
        ``(B, N)`` int32 ids (``N = max_length`` or ``S + extra_length``) of the best
        hypothesis per sentence (and the scores ``(B,)`` with ``return_scores``). With
        ``nbest``: ids ``(B, K, N)`` and float32 scores ``(B, K)``, best first: finished
        hypotheses by score (``log p / lp(length)``), then, where fewer than ``K`` finished,
        live ones scored ``log p / lp(limit)``; ``-1e9`` scores a slot with no hypothesis
        (a vocabulary too small to fill the beam).
    """
    return _beam(model, source, beam_size, length_penalty, max_length, extra_length,
                 return_scores, nbest, cached=True)


def beam_search_uncached(model, source, beam_size: int = 4, length_penalty: float = 0.6,
                         max_length=None, extra_length: int = 50, return_scores: bool = False,
                         nbest: bool = False):
    """Beam search that re-runs the decoder over every hypothesis's whole prefix at each step.

    The reference that cached beam search must equal, and a baseline of
    ``benchmarks/nmt_decode.py``. Same arguments and result as ``beam_search``.
    """
    return _beam(model, source, beam_size, length_penalty, max_length, extra_length,
                 return_scores, nbest, cached=False)


def search(model, source, settings: DecodingSettings, max_length=None, nbest: bool = False):
    """Decodes ``source`` as ``settings`` say: beam search, or greedy for ``beam_size=1``.

    Args:
        model: a ``Seq2SeqTransformer``.
        source: ``(B, S)`` int ids.
        settings: the ``DecodingSettings``.
        max_length: most tokens to generate for every sentence; default: each sentence's
            source length (non-pad ids) + ``settings.extra_length``.
        nbest: return the ``K = beam_size`` best hypotheses of every sentence and their
            scores (`beam_search` with ``nbest``; for ``beam_size=1`` the greedy translation
            with its score).

    Returns:
        ``(B, N)`` int32 ids (``N = max_length`` or ``S + extra_length``); with ``nbest``,
        ids ``(B, K, N)`` and float32 scores ``(B, K)``, best first.
    """
    if not isinstance(settings, DecodingSettings):
        raise TypeError("`settings` must be a DecodingSettings. "
                        f"Received: type={type(settings).__name__}")
    if settings.beam_size > 1:
        return beam_search(model, source, beam_size=settings.beam_size,
                           length_penalty=settings.length_penalty, max_length=max_length,
                           extra_length=settings.extra_length, nbest=nbest)
    if nbest:
        ids, scores = greedy_search(model, source, max_length=max_length,
                                    extra_length=settings.extra_length, return_scores=True,
                                    length_penalty=settings.length_penalty)
        return ids[:, None], scores[:, None]
    return greedy_search(model, source, max_length=max_length,
                         extra_length=settings.extra_length)


def compile_search(model, method: str = "beam", jit_compile: bool = False, **kwargs):
    """One compiled function ``source (B, S) -> ids (B, N)`` for the current backend.

    Args:
        model: a ``Seq2SeqTransformer``.
        method: ``"beam"``, ``"beam_uncached"``, ``"greedy"`` or ``"greedy_uncached"``.
        jit_compile: compile with XLA (TensorFlow backend; JAX always compiles). The uncached
            searches cannot be: their prefix grows.
        **kwargs: passed to the search (``beam_size``, ``length_penalty``, ``extra_length``,
            ``max_length``, ``nbest``...).
    """
    searches = {"beam": beam_search, "beam_uncached": beam_search_uncached,
                "greedy": greedy_search, "greedy_uncached": greedy_search_uncached}
    if method not in searches:
        raise ValueError(f"`method` must be one of {sorted(searches)}. Received: {method!r}")
    fn = searches[method]

    def run(source):
        return fn(model, source, **kwargs)

    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function(run, jit_compile=jit_compile, reduce_retracing=True)
    if backend == "jax":
        import jax

        return jax.jit(run)
    return run
