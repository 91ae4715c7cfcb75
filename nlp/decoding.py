"""Greedy and beam-search decoding with the KV cache, each one compiled loop (no Python loop
per token).

Both searches run in ``keras.ops.while_loop``; ``compile_search`` wraps one in
``tf.function`` (TensorFlow backend) or ``jax.jit`` (JAX backend).

Conventions shared by both:

* ``pad``, ``bos`` and ``unk`` are never generated;
* at most ``max_length`` tokens are generated, eos included: the last step may only be eos;
* the output is ``(B, max_length)`` ids without the leading bos, eos then pad after the end.

Beam search keeps ``K`` live hypotheses. Every step scores all ``K·V`` extensions by total
log-probability; extensions ending in eos that rank in the top ``K`` become finished
hypotheses, scored with the GNMT length penalty ``log p / ((5 + n) / 6) ** alpha`` (``n``
tokens, eos included); the ``K`` best extensions not ending in eos stay live. The search stops
for a sentence once no live hypothesis can beat its best finished one (``log p`` only falls,
so ``log p / lp(max_length)`` bounds it). With ``beam_size=1`` and ``alpha=0`` this is exactly
greedy search; with a beam at least as wide as the number of hypotheses it is exact.
"""

from __future__ import annotations

import keras
from keras import ops

__all__ = ["greedy_search", "greedy_search_uncached", "beam_search", "compile_search"]

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
NEG = -1e9  # "minus infinity" that keeps arithmetic finite


def _length_penalty(length, alpha: float):
    return ops.power((5.0 + ops.cast(length, "float32")) / 6.0, alpha)


def _restrict(logits, step, max_length):
    """Forbids pad/bos/unk everywhere and everything but eos at the last step."""
    vocab = ops.arange(ops.shape(logits)[-1])
    banned = (vocab == PAD_ID) | (vocab == BOS_ID) | (vocab == UNK_ID)
    last = ops.equal(step, max_length - 1)
    banned = banned | (last & (vocab != EOS_ID))
    return ops.where(banned, NEG, ops.cast(logits, "float32"))


def _prepare(model, source, max_length, extra_length):
    source = ops.cast(source, "int32")
    batch = ops.shape(source)[0]
    if max_length is None:
        max_length = ops.shape(source)[1] + extra_length
    memory, memory_mask = model.encode(source)
    return source, batch, max_length, memory, memory_mask


def _start_tokens(batch, max_length, width=None):
    shape = (batch, max_length + 1) if width is None else (batch, width, max_length + 1)
    tokens = ops.zeros(shape, "int32")
    bos = ops.full((*shape[:-1], 1), BOS_ID, "int32")
    return ops.concatenate([bos, tokens[..., 1:]], axis=-1)


def greedy_search(model, source, max_length=None, extra_length: int = 50):
    """Greedy decoding with the KV cache.

    Args:
        model: a ``Seq2SeqTransformer``.
        source: ``(B, S)`` int ids (pad 0, eos-terminated).
        max_length: most tokens to generate (default ``S + extra_length``).
        extra_length: see ``max_length``.

    Returns:
        ``(B, max_length)`` int32 ids.
    """
    source, batch, max_length, memory, memory_mask = _prepare(
        model, source, max_length, extra_length
    )
    cross = model.decoder.compute_cross_attention_cache(memory)
    cache = model.decoder.empty_cache(batch, max_length)

    def cond(i, tokens, cache, finished):
        return ops.logical_and(i < max_length, ops.logical_not(ops.all(finished)))

    def body(i, tokens, cache, finished):
        current = ops.slice(tokens, [0, i], [batch, 1])  # (B, 1)
        logits, cache = model.decode_step(current, i, cache, cross, memory_mask)
        nxt = ops.cast(ops.argmax(_restrict(logits, i, max_length), axis=-1), "int32")
        nxt = ops.where(finished, PAD_ID, nxt)
        tokens = ops.slice_update(tokens, [0, i + 1], nxt[:, None])
        return i + 1, tokens, cache, finished | (nxt == EOS_ID)

    state = (ops.convert_to_tensor(0, "int32"), _start_tokens(batch, max_length), cache,
             ops.zeros((batch,), "bool"))
    _, tokens, _, _ = ops.while_loop(cond, body, state)
    return tokens[:, 1:]


def greedy_search_uncached(model, source, max_length=None, extra_length: int = 50):
    """Greedy decoding that re-runs the decoder over the whole prefix at every step.

    The usual tutorial way; kept as the reference that cached decoding must equal, and as the
    baseline of ``benchmarks/nmt.py``. Same arguments and result as ``greedy_search``.
    """
    source, batch, max_length, memory, memory_mask = _prepare(
        model, source, max_length, extra_length
    )

    def cond(i, tokens, finished):
        return ops.logical_and(i < max_length, ops.logical_not(ops.all(finished)))

    def body(i, tokens, finished):
        prefix = ops.slice(tokens, [0, 0], [batch, i + 1])  # (B, i + 1)
        logits = model.decode(prefix, memory, memory_mask)[:, -1]
        nxt = ops.cast(ops.argmax(_restrict(logits, i, max_length), axis=-1), "int32")
        nxt = ops.where(finished, PAD_ID, nxt)
        tokens = ops.slice_update(tokens, [0, i + 1], nxt[:, None])
        return i + 1, tokens, finished | (nxt == EOS_ID)

    state = (ops.convert_to_tensor(0, "int32"), _start_tokens(batch, max_length),
             ops.zeros((batch,), "bool"))
    _, tokens, _ = ops.while_loop(cond, body, state)
    return tokens[:, 1:]


def beam_search(model, source, beam_size: int = 4, alpha: float = 0.6, max_length=None,
                extra_length: int = 50, return_scores: bool = False):
    """Beam search with the GNMT length penalty and the KV cache (see the module docstring).

    Args:
        model: a ``Seq2SeqTransformer``.
        source: ``(B, S)`` int ids.
        beam_size: ``K``.
        alpha: length-penalty exponent (0 = plain log-probability).
        max_length: most tokens to generate (default ``S + extra_length``).
        extra_length: see ``max_length``.
        return_scores: also return the best hypotheses' scores ``(B,)``.

    Returns:
        ``(B, max_length)`` int32 ids of the best hypothesis per sentence.
    """
    if beam_size < 1:
        raise ValueError(f"`beam_size` must be >= 1. Received: {beam_size}")
    k = beam_size
    source, batch, max_length, memory, memory_mask = _prepare(
        model, source, max_length, extra_length
    )
    cross = ops.repeat(model.decoder.compute_cross_attention_cache(memory), k, axis=0)
    memory_mask = ops.repeat(memory_mask, k, axis=0)  # (B·K, S)
    cache = model.decoder.empty_cache(batch * k, max_length)  # (B·K, L, 2, N, H, D)
    vocab = model.vocab_size
    max_penalty = _length_penalty(max_length, alpha)
    rows = ops.arange(batch, dtype="int32")[:, None] * k  # (B, 1)

    def pick(x, beam):  # x (B·K, ...) or (B, K, ...) flattened; beam (B, K') in [0, K)
        return ops.take(x, ops.reshape(beam + rows, (-1,)), axis=0)

    def cond(i, alive_seq, alive_logp, fin_seq, fin_score, cache):
        bound = alive_logp[:, 0] / max_penalty
        done = fin_score[:, 0] >= bound
        return ops.logical_and(i < max_length, ops.logical_not(ops.all(done)))

    def body(i, alive_seq, alive_logp, fin_seq, fin_score, cache):
        n = max_length + 1
        current = ops.reshape(ops.slice(alive_seq, [0, 0, i], [batch, k, 1]), (-1, 1))
        logits, cache = model.decode_step(current, i, cache, cross, memory_mask)
        logp = ops.log_softmax(_restrict(logits, i, max_length), axis=-1)  # (B·K, V)
        cand = alive_logp[..., None] + ops.reshape(logp, (batch, k, vocab))  # (B, K, V)
        flat = ops.reshape(cand, (batch, k * vocab))

        def extend(score_flat):
            score, index = ops.top_k(score_flat, k)  # (B, K)
            beam, token = index // vocab, index % vocab
            seq = ops.reshape(pick(ops.reshape(alive_seq, (batch * k, n)), beam),
                              (batch, k, n))
            seq = ops.slice_update(seq, [0, 0, i + 1], token[..., None])
            return score, beam, token, seq

        # Finished: eos extensions among the top K of all extensions.
        top, _, token, seq = extend(flat)
        is_new = (token == EOS_ID) & (top > NEG / 2)
        new_score = ops.where(is_new, top / _length_penalty(i + 1, alpha), NEG)
        all_score = ops.concatenate([fin_score, new_score], axis=1)  # (B, 2K)
        all_seq = ops.concatenate([fin_seq, seq], axis=1)  # (B, 2K, N + 1)
        fin_score, keep = ops.top_k(all_score, k)
        fin_seq = ops.take_along_axis(all_seq, keep[..., None], axis=1)

        # Live: the K best extensions that do not end in eos.
        eos_column = ops.arange(k * vocab) % vocab == EOS_ID
        alive_logp, beam, _, alive_seq = extend(ops.where(eos_column, NEG, flat))
        cache = pick(cache, beam)
        return i + 1, alive_seq, alive_logp, fin_seq, fin_score, cache

    first = ops.where(ops.arange(k) == 0, 0.0, NEG)  # only beam 0 is live at the start
    state = (
        ops.convert_to_tensor(0, "int32"),
        _start_tokens(batch, max_length, k),
        ops.tile(first[None, :], (batch, 1)),
        _start_tokens(batch, max_length, k),
        ops.full((batch, k), NEG, "float32"),
        cache,
    )
    _, alive_seq, alive_logp, fin_seq, fin_score, _ = ops.while_loop(cond, body, state)
    has_finished = fin_score[:, 0] > NEG / 2
    best = ops.where(has_finished[:, None], fin_seq[:, 0], alive_seq[:, 0])[:, 1:]
    if return_scores:
        score = ops.where(has_finished, fin_score[:, 0], alive_logp[:, 0] / max_penalty)
        return best, score
    return best


def compile_search(model, method: str = "beam", jit_compile: bool = False, **kwargs):
    """One compiled function ``source (B, S) -> ids (B, N)`` for the current backend.

    Args:
        model: a ``Seq2SeqTransformer``.
        method: ``"beam"``, ``"greedy"`` or ``"greedy_uncached"``.
        jit_compile: compile with XLA (TensorFlow backend; JAX always compiles).
        **kwargs: passed to the search (``beam_size``, ``alpha``, ``extra_length``...).
    """
    searches = {"beam": beam_search, "greedy": greedy_search,
                "greedy_uncached": greedy_search_uncached}
    if method not in searches:
        raise ValueError(f"`method` must be one of {sorted(searches)}. Received: {method!r}")
    search = searches[method]

    def run(source):
        return search(model, source, **kwargs)

    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function(run, jit_compile=jit_compile, reduce_retracing=True)
    if backend == "jax":
        import jax

        return jax.jit(run)
    return run
